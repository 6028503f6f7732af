// What the int8 and int4 storage tests share: reading a layer's stored rows,
// comparing them bit for bit, the fork / copy-on-write / save / load round trip
// of a paged cache, and the reference backend on a quantised cache against the
// reference on a float cache holding the values the test decoded itself.
#pragma once

#include <cstddef>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "storage_owners.hpp"
#include "kvcache/backend/reference.hpp"

namespace kvcache_test {

/// Stored rows of one layer of a sequence ([token][kv_head][row_elements]).
/// @tparam Cache a kvcache owner
template <class Cache>
std::vector<typename Cache::element_type> layer_rows(const Cache& cache, kvcache::sequence_id id, int layer, bool keys) {
    using element = typename Cache::element_type;
    const int n = cache.length(id);
    const std::size_t row = std::size_t(cache.kv_heads()) * kvcache::row_elements<element>(Cache::heads::head_dim);
    std::vector<element> k(std::size_t(n) * row), v(k.size());
    cache.read(id, layer, 0, n, kvcache::span<element>(k), kvcache::span<element>(v));
    return keys ? k : v;
}

/// Byte equality of stored rows.
/// @tparam Element a one-byte stored type
template <class Element>
bool same_bits(const std::vector<Element>& a, const std::vector<Element>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(Element)) == 0;
}

/// Fork, copy-on-write into the shared last page, save and load of a paged
/// cache keep rows and their scales bit for bit; loading the file into a cache
/// of another type (`other`) is refused naming the file's type, and adds nothing.
/// @tparam Cache a paged_cache of a quantised type
/// @tparam Other a paged_cache of another type, same heads
template <class Cache, class Other>
void check_fork_save_load(Cache cache, Other other, const char* file_type) {
    using element = typename Cache::element_type;
    const int kv = cache.kv_heads(), dim = Cache::heads::head_dim;
    const kvcache::sequence_id parent = cache.add_sequence();
    const int tokens = 10;
    const auto keys = random_rows(std::size_t(tokens) * kv * dim, 5), values = random_rows(std::size_t(tokens) * kv * dim, 6);
    for (int l = 0; l < cache.layers(); ++l) cache.append(parent, l, keys, values, tokens);
    const std::vector<element> before = layer_rows(cache, parent, 1, true);

    const kvcache::sequence_id child = cache.fork(parent);
    CHECK(same_bits(layer_rows(cache, child, 1, true), before));
    const auto more = random_rows(std::size_t(kv) * dim, 7);
    for (int l = 0; l < cache.layers(); ++l) cache.append(child, l, more, more, 1);  // into the shared last page
    CHECK(same_bits(layer_rows(cache, parent, 1, true), before));
    std::vector<element> child_rows = layer_rows(cache, child, 1, true);
    child_rows.resize(before.size());
    CHECK(same_bits(child_rows, before));

    std::stringstream file;
    cache.save(file, {parent});
    const std::string bytes = file.str();
    Cache restored(cache.layers(), 32, 4);
    std::istringstream in(bytes);
    const auto loaded = restored.load(in);
    REQUIRE(loaded.size() == 1);
    CHECK(same_bits(layer_rows(restored, loaded[0], 1, true), before));
    CHECK(same_bits(layer_rows(restored, loaded[0], 0, false), layer_rows(cache, parent, 0, false)));

    std::istringstream again(bytes);
    const std::string expected = std::string("file holds ") + file_type;
    CHECK_THROWS_WITH_AS(other.load(again), doctest::Contains(expected.c_str()), kvcache::error);
    CHECK(other.sequence_count() == 0);
}

/// The reference backend on a quantised cache against the reference on a
/// float cache holding the values `decode(row, d)` reads from the stored bytes
/// (the test's own decoding), and against the reference on the original
/// floats (the format's error, which must be positive and at most
/// `format_bound`). Two sequences of 23 and 9 tokens, 2 layers, decode of layer 1.
/// @tparam Cache a quantised owner; FloatCache: the same owner over float
/// @tparam Decode callable (const element* row, int d) -> double
template <class Cache, class FloatCache, class Decode>
void check_reference(Cache cache, FloatCache dequantised, FloatCache original, Decode decode, double format_bound) {
    using namespace kvcache;
    using element = typename Cache::element_type;
    const int kv = cache.kv_heads(), qh = cache.query_heads(), dim = Cache::heads::head_dim;
    const std::size_t stored = std::size_t(row_elements<element>(dim));
    const std::vector<int> lengths = {23, 9};
    const int total = 32;
    std::vector<sequence_id> ids, dequantised_ids, original_ids;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        ids.push_back(cache.add_sequence());
        dequantised_ids.push_back(dequantised.add_sequence());
        original_ids.push_back(original.add_sequence());
    }
    const auto keys = random_rows(std::size_t(total) * kv * dim, 21), values = random_rows(std::size_t(total) * kv * dim, 22);
    auto plan = cache.plan(ids, lengths);
    auto original_plan = original.plan(original_ids, lengths);
    for (int l = 0; l < 2; ++l) {
        reference_backend{}.append(append_params(plan.view(l), span<const float>(keys), span<const float>(values), plan.new_token_offsets()));
        reference_backend{}.append(append_params(original_plan.view(l), span<const float>(keys), span<const float>(values),
                                                 original_plan.new_token_offsets()));
    }
    for (std::size_t b = 0; b < ids.size(); ++b) {
        for (int l = 0; l < 2; ++l) {
            const std::vector<element> k = layer_rows(cache, ids[b], l, true), v = layer_rows(cache, ids[b], l, false);
            std::vector<float> dk(std::size_t(lengths[b]) * kv * dim), dv(dk.size());
            for (std::size_t r = 0; r < std::size_t(lengths[b]) * kv; ++r)
                for (int d = 0; d < dim; ++d) {
                    dk[r * dim + std::size_t(d)] = float(decode(k.data() + r * stored, d));
                    dv[r * dim + std::size_t(d)] = float(decode(v.data() + r * stored, d));
                }
            if (l == 0) (void)dequantised.begin_append(dequantised_ids[b], lengths[b]);
            dequantised.write(dequantised_ids[b], l, 0, span<const float>(dk), span<const float>(dv), lengths[b]);
        }
    }
    auto dequantised_plan = dequantised.plan(dequantised_ids);
    auto attend_plan = cache.plan(ids);
    auto original_attend = original.plan(original_ids);
    const auto queries = random_rows(lengths.size() * std::size_t(qh) * dim, 23);
    std::vector<float> on_quantised(queries.size()), on_dequantised(queries.size()), on_original(queries.size());
    reference_backend{}.decode(decode_params(attend_plan.view(1), span<const float>(queries), span<float>(on_quantised)));
    reference_backend{}.decode(decode_params(dequantised_plan.view(1), span<const float>(queries), span<float>(on_dequantised)));
    reference_backend{}.decode(decode_params(original_attend.view(1), span<const float>(queries), span<float>(on_original)));
    // The same numbers in double up to the float rounding of each decoded value
    // (relative 2^-24) and the outputs' rounding to float.
    CHECK(largest_difference(on_quantised, on_dequantised) <= 1e-5);
    const double format = largest_difference(on_quantised, on_original);
    MESSAGE(std::string(element_traits<element>::name), " format error of the reference decode: ", format);
    CHECK(format <= format_bound);
    CHECK(format > 0.0);
}

}  // namespace kvcache_test
