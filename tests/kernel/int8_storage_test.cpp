// int8 caches (one float scale per row, stored after the row's values): the
// owners quantise float rows on append, every layout keeps the scale with its
// row, and fork, copy-on-write, save and load carry rows and scales bit for bit.
// The expected rows are quantised here from the definition in double
// (scale = max|x| / 127, q = nearest-even(x / scale)), not by the library.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"

using namespace kvcache;

namespace {

using heads = head_config<4, 2, 16>;
constexpr int dim = heads::head_dim, kv = 2, stored = dim + 4;

std::vector<float> random_rows(std::size_t count, unsigned seed) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> rows(count);
    for (std::size_t i = 0; i < count; ++i) rows[i] = normal(generator) * (i % 37 == 0 ? 4.0f : 1.0f);
    return rows;
}

double nearest_even(double x) {
    const double low = std::floor(x), rest = x - low;
    if (rest != 0.5) return rest > 0.5 ? low + 1 : low;
    return std::fmod(low, 2.0) == 0 ? low : low + 1;
}

// Checks stored rows [token][kv_head][dim values + scale] against float rows [token][kv_head][dim].
void check_quantised(const std::vector<qint8>& rows, const std::vector<float>& floats, int tokens) {
    REQUIRE(rows.size() == std::size_t(tokens) * kv * stored);
    for (int r = 0; r < tokens * kv; ++r) {
        const float* x = floats.data() + std::size_t(r) * dim;
        const qint8* q = rows.data() + std::size_t(r) * stored;
        double largest = 0;
        for (int d = 0; d < dim; ++d) largest = std::max(largest, std::fabs(double(x[d])));
        float scale;
        std::memcpy(&scale, q + dim, sizeof scale);
        CHECK(scale == float(largest / 127.0));
        for (int d = 0; d < dim; ++d) {
            const double exact = double(x[d]) / double(scale);
            if (std::fabs(std::fabs(exact - std::trunc(exact)) - 0.5) < 1e-4) continue;  // float division may tie differently
            CHECK(q[d].bits == int(std::max(-127.0, std::min(127.0, nearest_even(exact)))));
        }
    }
}

template <class Cache>
void append_and_check(Cache cache) {
    const sequence_id id = cache.add_sequence();
    const int tokens = 11;
    const auto keys = random_rows(std::size_t(tokens) * kv * dim, 1), values = random_rows(std::size_t(tokens) * kv * dim, 2);
    for (int l = 0; l < cache.layers(); ++l) cache.append(id, l, keys, values, tokens);
    std::vector<qint8> k(std::size_t(tokens) * kv * stored), v(k.size());
    cache.read(id, 1, 0, tokens, span<qint8>(k), span<qint8>(v));
    check_quantised(k, keys, tokens);
    check_quantised(v, values, tokens);
}

template <class Cache>
std::vector<qint8> layer_rows(const Cache& cache, sequence_id id, int layer, bool keys) {
    const int n = cache.length(id);
    std::vector<qint8> k(std::size_t(n) * kv * stored), v(k.size());
    cache.read(id, layer, 0, n, span<qint8>(k), span<qint8>(v));
    return keys ? k : v;
}

bool same_bits(const std::vector<qint8>& a, const std::vector<qint8>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

TEST_CASE("int8 caches: owner append quantises every row with its own scale, in every layout") {
    append_and_check(contiguous_cache<qint8, heads>(2, 2, 32));
    append_and_check(paged_cache<qint8, heads>(2, 16, 4));
    append_and_check(sliding_window_cache<qint8, heads>(2, 2, 4, 2, 16));
}

TEST_CASE("int8 caches: an all-zero row stores scale 0; a row with a NaN stores a NaN scale") {
    contiguous_cache<qint8, heads> cache(1, 1, 4);
    const sequence_id id = cache.add_sequence();
    std::vector<float> keys(std::size_t(kv) * dim, 0.0f), values(keys.size(), 1.0f);
    values[dim + 3] = std::nanf("");  // kv head 1's value row
    cache.append(id, 0, keys, values, 1);
    std::vector<qint8> k(std::size_t(kv) * stored), v(k.size());
    cache.read(id, 0, 0, 1, span<qint8>(k), span<qint8>(v));
    float scale;
    std::memcpy(&scale, k.data() + dim, sizeof scale);
    CHECK(scale == 0.0f);
    std::memcpy(&scale, v.data() + dim, sizeof scale);
    CHECK(scale == 1.0f / 127.0f);
    std::memcpy(&scale, v.data() + stored + dim, sizeof scale);
    CHECK(std::isnan(scale));
}

TEST_CASE("int8 paged cache: fork, copy on write, save and load keep rows and scales bit for bit") {
    paged_cache<qint8, heads> cache(2, 32, 4);
    const sequence_id parent = cache.add_sequence();
    const int tokens = 10;
    const auto keys = random_rows(std::size_t(tokens) * kv * dim, 5), values = random_rows(std::size_t(tokens) * kv * dim, 6);
    for (int l = 0; l < 2; ++l) cache.append(parent, l, keys, values, tokens);
    const std::vector<qint8> before = layer_rows(cache, parent, 1, true);

    const sequence_id child = cache.fork(parent);
    CHECK(same_bits(layer_rows(cache, child, 1, true), before));
    // The child writes into the shared last page: copy on write must copy the scales too.
    const auto more = random_rows(std::size_t(kv) * dim, 7);
    for (int l = 0; l < 2; ++l) cache.append(child, l, more, more, 1);
    CHECK(same_bits(layer_rows(cache, parent, 1, true), before));
    std::vector<qint8> child_rows = layer_rows(cache, child, 1, true);
    child_rows.resize(before.size());
    CHECK(same_bits(child_rows, before));

    std::stringstream file;
    cache.save(file, {parent});
    const std::string bytes = file.str();
    paged_cache<qint8, heads> restored(2, 32, 4);
    std::istringstream in(bytes);
    const auto loaded = restored.load(in);
    REQUIRE(loaded.size() == 1);
    CHECK(same_bits(layer_rows(restored, loaded[0], 1, true), before));
    CHECK(same_bits(layer_rows(restored, loaded[0], 0, false), layer_rows(cache, parent, 0, false)));

    paged_cache<half, heads> halves(2, 32, 4);
    std::istringstream again(bytes);
    CHECK_THROWS_WITH_AS(halves.load(again), doctest::Contains("file holds int8"), error);
    std::istringstream third(bytes);
    CHECK_THROWS_WITH_AS(halves.load(third), doctest::Contains("fp16"), error);
    CHECK(halves.sequence_count() == 0);
}

namespace {

double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    return worst;
}

// The reference backend on an int8 cache against the reference on a float
// cache holding the rows dequantised by the test (q * scale), and against the
// reference on the original floats (the format's error).
template <class Cache, class FloatCache>
void check_reference(Cache cache, FloatCache dequantised, FloatCache original) {
    const std::vector<int> lengths = {23, 9};
    const int total = 32, qh = 4;
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
    // Dequantise what the reference stored, row by row, into the float cache.
    int done = 0;
    for (std::size_t b = 0; b < ids.size(); ++b) {
        for (int l = 0; l < 2; ++l) {
            const std::vector<qint8> k = layer_rows(cache, ids[b], l, true), v = layer_rows(cache, ids[b], l, false);
            std::vector<float> dk(std::size_t(lengths[b]) * kv * dim), dv(dk.size());
            for (int r = 0; r < lengths[b] * kv; ++r) {
                float ks, vs;
                std::memcpy(&ks, k.data() + std::size_t(r) * stored + dim, sizeof ks);
                std::memcpy(&vs, v.data() + std::size_t(r) * stored + dim, sizeof vs);
                for (int d = 0; d < dim; ++d) {
                    dk[std::size_t(r) * dim + d] = float(k[std::size_t(r) * stored + d].bits) * ks;
                    dv[std::size_t(r) * dim + d] = float(v[std::size_t(r) * stored + d].bits) * vs;
                }
            }
            if (l == 0) (void)dequantised.begin_append(dequantised_ids[b], lengths[b]);
            dequantised.write(dequantised_ids[b], l, 0, span<const float>(dk), span<const float>(dv), lengths[b]);
        }
        done += lengths[b];
    }
    CHECK(done == total);
    auto dequantised_plan = dequantised.plan(dequantised_ids);
    auto attend_plan = cache.plan(ids);
    auto original_attend = original.plan(original_ids);
    const auto queries = random_rows(lengths.size() * qh * dim, 23);
    std::vector<float> on_int8(queries.size()), on_dequantised(queries.size()), on_original(queries.size());
    reference_backend{}.decode(decode_params(attend_plan.view(1), span<const float>(queries), span<float>(on_int8)));
    reference_backend{}.decode(decode_params(dequantised_plan.view(1), span<const float>(queries), span<float>(on_dequantised)));
    reference_backend{}.decode(decode_params(original_attend.view(1), span<const float>(queries), span<float>(on_original)));
    // Both in double over the same numbers up to one float rounding of q * scale
    // (relative 2^-24 per element) and the outputs' rounding to float.
    CHECK(largest_difference(on_int8, on_dequantised) <= 1e-5);
    // The format: each element within half a step (max|row| / 254) of the original.
    const double format = largest_difference(on_int8, on_original);
    MESSAGE("int8 format error of the reference decode: ", format);
    CHECK(format <= 0.05);
    CHECK(format > 0.0);
}

}  // namespace

TEST_CASE("int8 caches: the reference backend appends the owners' rows and dequantises them") {
    check_reference(contiguous_cache<qint8, heads>(2, 2, 32), contiguous_cache<float, heads>(2, 2, 32),
                    contiguous_cache<float, heads>(2, 2, 32));
    check_reference(paged_cache<qint8, heads>(2, 32, 4), paged_cache<float, heads>(2, 32, 4),
                    paged_cache<float, heads>(2, 32, 4));
}
