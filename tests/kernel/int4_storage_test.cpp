// int4 caches (groups of 32 along d, a half scale and minimum per group, stored
// after the row's packed codes): the owners quantise float rows on append with
// core's quantise_row, every layout keeps the group records with their row, and
// fork, copy-on-write, save and load carry them bit for bit. Values are decoded
// here from the bytes (nibbles, the half records), not by the library's readers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

using heads = head_config<4, 2, 40>;  // two groups: 32 values and a short one of 8
constexpr int dim = heads::head_dim, kv = 2, stored = dim / 2 + 2 * 4;

std::vector<float> random_rows(std::size_t count, unsigned seed) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> rows(count);
    for (std::size_t i = 0; i < count; ++i) rows[i] = normal(generator) * (i % 37 == 0 ? 4.0f : 1.0f) + (i % 3 == 0 ? 0.5f : 0.0f);
    return rows;
}

// The value at d of a stored row, decoded from its bytes: low nibble for even d,
// then the group's record (half scale, half minimum) after the 20 code bytes.
double decoded(const qint4* row, int d, double* step = nullptr) {
    const int code = (d % 2 == 0) ? (row[d / 2].bits & 0xF) : (row[d / 2].bits >> 4);
    std::uint16_t record[2];
    std::memcpy(record, row + dim / 2 + (d / 32) * 4, sizeof record);
    const double scale = double(float(half::from_bits(record[0]))), minimum = double(float(half::from_bits(record[1])));
    if (step) *step = scale;
    return minimum + code * scale;
}

// Stored rows [token][kv_head][stored] against float rows [token][kv_head][dim]:
// the bytes are core's quantise_row of the float row (the owner wires it), and
// each value is within half its group's step of the original (the definition).
void check_quantised(const std::vector<qint4>& rows, const std::vector<float>& floats, int tokens) {
    REQUIRE(rows.size() == std::size_t(tokens) * kv * stored);
    for (int r = 0; r < tokens * kv; ++r) {
        const float* x = floats.data() + std::size_t(r) * dim;
        const qint4* q = rows.data() + std::size_t(r) * stored;
        std::vector<qint4> expected(stored);
        quantise_row([&](int d) { return x[d]; }, dim, expected.data());
        CHECK(std::memcmp(expected.data(), q, stored) == 0);
        for (int d = 0; d < dim; ++d) {
            double step = 0;
            const double back = decoded(q, d, &step);
            CHECK(std::fabs(back - double(x[d])) <= step / 2 * (1 + 1e-6));
        }
    }
}

template <class Cache>
std::vector<qint4> layer_rows(const Cache& cache, sequence_id id, int layer, bool keys) {
    const int n = cache.length(id);
    std::vector<qint4> k(std::size_t(n) * kv * stored), v(k.size());
    cache.read(id, layer, 0, n, span<qint4>(k), span<qint4>(v));
    return keys ? k : v;
}

template <class Cache>
void append_and_check(Cache cache) {
    const sequence_id id = cache.add_sequence();
    const int tokens = 11;
    const auto keys = random_rows(std::size_t(tokens) * kv * dim, 1), values = random_rows(std::size_t(tokens) * kv * dim, 2);
    for (int l = 0; l < cache.layers(); ++l) cache.append(id, l, keys, values, tokens);
    check_quantised(layer_rows(cache, id, 1, true), keys, tokens);
    check_quantised(layer_rows(cache, id, 1, false), values, tokens);
}

bool same_bits(const std::vector<qint4>& a, const std::vector<qint4>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

TEST_CASE("int4 caches: owner append quantises every row per group, in every layout") {
    CHECK(row_elements<qint4>(dim) == stored);
    append_and_check(contiguous_cache<qint4, heads>(2, 2, 32));
    append_and_check(paged_cache<qint4, heads>(2, 16, 4));
    append_and_check(sliding_window_cache<qint4, heads>(2, 2, 4, 2, 16));
}

TEST_CASE("int4 caches: a NaN makes its row NaN; a part row is refused naming its size; nothing changes") {
    contiguous_cache<qint4, heads> cache(1, 1, 4);
    const sequence_id id = cache.add_sequence();
    std::vector<float> keys(std::size_t(kv) * dim, 0.25f), values(keys.size(), 1.0f);
    values[dim + 35] = std::nanf("");  // kv head 1's value row, in its short group
    cache.append(id, 0, keys, values, 1);
    const std::vector<qint4> k = layer_rows(cache, id, 0, true), v = layer_rows(cache, id, 0, false);
    for (int d = 0; d < dim; ++d) {
        CHECK(decoded(k.data(), d) == 0.25);
        CHECK(decoded(v.data(), d) == 1.0);
        CHECK(std::isnan(decoded(v.data() + stored, d)));
    }
    // One float short of a token's 2 rows of 40: quantised, 40 + 39 floats would
    // fill more than a token's 2 stored rows of 28 bytes, so the size must be
    // checked before the rows shrink.
    const std::vector<float> part(std::size_t(kv) * dim - 1, 1.0f);
    CHECK_THROWS_WITH_AS(cache.append(id, 0, part, part, 1), doctest::Contains("keys holds 79 elements"), error);
    CHECK(cache.length(id) == 1);
}

TEST_CASE("int4 paged cache: fork, copy on write, save and load keep codes and group records bit for bit") {
    paged_cache<qint4, heads> cache(2, 32, 4);
    const sequence_id parent = cache.add_sequence();
    const int tokens = 10;
    const auto keys = random_rows(std::size_t(tokens) * kv * dim, 5), values = random_rows(std::size_t(tokens) * kv * dim, 6);
    for (int l = 0; l < 2; ++l) cache.append(parent, l, keys, values, tokens);
    const std::vector<qint4> before = layer_rows(cache, parent, 1, true);

    const sequence_id child = cache.fork(parent);
    CHECK(same_bits(layer_rows(cache, child, 1, true), before));
    const auto more = random_rows(std::size_t(kv) * dim, 7);
    for (int l = 0; l < 2; ++l) cache.append(child, l, more, more, 1);  // into the shared last page
    CHECK(same_bits(layer_rows(cache, parent, 1, true), before));
    std::vector<qint4> child_rows = layer_rows(cache, child, 1, true);
    child_rows.resize(before.size());
    CHECK(same_bits(child_rows, before));

    std::stringstream file;
    cache.save(file, {parent});
    const std::string bytes = file.str();
    paged_cache<qint4, heads> restored(2, 32, 4);
    std::istringstream in(bytes);
    const auto loaded = restored.load(in);
    REQUIRE(loaded.size() == 1);
    CHECK(same_bits(layer_rows(restored, loaded[0], 1, true), before));
    CHECK(same_bits(layer_rows(restored, loaded[0], 0, false), layer_rows(cache, parent, 0, false)));

    paged_cache<qint8, heads> int8s(2, 32, 4);
    std::istringstream again(bytes);
    CHECK_THROWS_WITH_AS(int8s.load(again), doctest::Contains("file holds int4"), error);
    CHECK(int8s.sequence_count() == 0);
}

namespace {

double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    return worst;
}

// The reference backend on an int4 cache against the reference on a float
// cache holding the values decoded by the test, and against the reference on
// the original floats (the format's error).
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
    for (std::size_t b = 0; b < ids.size(); ++b) {
        for (int l = 0; l < 2; ++l) {
            const std::vector<qint4> k = layer_rows(cache, ids[b], l, true), v = layer_rows(cache, ids[b], l, false);
            std::vector<float> dk(std::size_t(lengths[b]) * kv * dim), dv(dk.size());
            for (int r = 0; r < lengths[b] * kv; ++r)
                for (int d = 0; d < dim; ++d) {
                    dk[std::size_t(r) * dim + d] = float(decoded(k.data() + std::size_t(r) * stored, d));
                    dv[std::size_t(r) * dim + d] = float(decoded(v.data() + std::size_t(r) * stored, d));
                }
            if (l == 0) (void)dequantised.begin_append(dequantised_ids[b], lengths[b]);
            dequantised.write(dequantised_ids[b], l, 0, span<const float>(dk), span<const float>(dv), lengths[b]);
        }
    }
    auto dequantised_plan = dequantised.plan(dequantised_ids);
    auto attend_plan = cache.plan(ids);
    auto original_attend = original.plan(original_ids);
    const auto queries = random_rows(lengths.size() * qh * dim, 23);
    std::vector<float> on_int4(queries.size()), on_dequantised(queries.size()), on_original(queries.size());
    reference_backend{}.decode(decode_params(attend_plan.view(1), span<const float>(queries), span<float>(on_int4)));
    reference_backend{}.decode(decode_params(dequantised_plan.view(1), span<const float>(queries), span<float>(on_dequantised)));
    reference_backend{}.decode(decode_params(original_attend.view(1), span<const float>(queries), span<float>(on_original)));
    // The same numbers in double up to the float rounding of minimum + code * scale
    // when the test decodes (relative 2^-24) and the outputs' rounding to float.
    CHECK(largest_difference(on_int4, on_dequantised) <= 1e-5);
    // The format: each value within half a step, (max - min) / 30 of its group, of the original.
    const double format = largest_difference(on_int4, on_original);
    MESSAGE("int4 format error of the reference decode: ", format);
    CHECK(format <= 0.5);
    CHECK(format > 0.0);
}

}  // namespace

TEST_CASE("int4 caches: the reference backend appends the owners' rows and dequantises them") {
    check_reference(contiguous_cache<qint4, heads>(2, 2, 32), contiguous_cache<float, heads>(2, 2, 32),
                    contiguous_cache<float, heads>(2, 2, 32));
    check_reference(paged_cache<qint4, heads>(2, 32, 4), paged_cache<float, heads>(2, 32, 4),
                    paged_cache<float, heads>(2, 32, 4));
}

TEST_CASE("read into float or half rows gives the values attention sees, for every stored type") {
    const int tokens = 5;
    const auto keys = random_rows(std::size_t(tokens) * kv * dim, 31), values = random_rows(std::size_t(tokens) * kv * dim, 32);
    const auto read_back = [&](auto& cache, sequence_id id) {
        std::vector<float> k(keys.size()), v(values.size());
        cache.read(id, 1, 0, tokens, span<float>(k), span<float>(v));
        return std::make_pair(k, v);
    };
    {  // int4: each value decoded from the bytes by the test
        paged_cache<qint4, heads> cache(2, 16, 4);
        const sequence_id id = cache.add_sequence();
        for (int l = 0; l < 2; ++l) cache.append(id, l, keys, values, tokens);
        const auto [k, v] = read_back(cache, id);
        const std::vector<qint4> stored_k = layer_rows(cache, id, 1, true);
        for (int r = 0; r < tokens * kv; ++r)
            for (int d = 0; d < dim; ++d)
                CHECK(double(k[std::size_t(r) * dim + d]) == doctest::Approx(decoded(stored_k.data() + std::size_t(r) * stored, d)).epsilon(1e-7));
        CHECK(largest_difference(v, values) <= 0.5);  // within the format's step
        CHECK(largest_difference(v, values) > 0.0);
        std::vector<half> kh(keys.size()), vh(values.size());
        cache.read(id, 1, 0, tokens, span<half>(kh), span<half>(vh));
        CHECK(float(kh[7]) == float(half(k[7])));
        std::vector<float> short_rows(keys.size() - 1), enough(values.size());
        CHECK_THROWS_WITH_AS(cache.read(id, 1, 0, tokens, span<float>(short_rows), span<float>(enough)),
                             doctest::Contains("keys holds 399 elements"), error);
    }
    {  // int8: q * the row's scale, read from the bytes
        contiguous_cache<qint8, heads> cache(2, 1, 8);
        const sequence_id id = cache.add_sequence();
        for (int l = 0; l < 2; ++l) cache.append(id, l, keys, values, tokens);
        const auto [k, v] = read_back(cache, id);
        std::vector<qint8> sk(std::size_t(tokens) * kv * (dim + 4)), sv(sk.size());
        cache.read(id, 1, 0, tokens, span<qint8>(sk), span<qint8>(sv));
        float scale;
        std::memcpy(&scale, sk.data() + 3 * (dim + 4) + dim, sizeof scale);
        CHECK(k[3 * dim + 5] == float(sk[std::size_t(3) * (dim + 4) + 5].bits) * scale);
        CHECK(largest_difference(v, values) <= 4.0 * 4.5 / 254 + 1e-6);  // half a step of the largest |x|
    }
    {  // fp8: times the layer's scale
        sliding_window_cache<float8_e4m3, heads> cache(2, 1, 16, 2, 16);
        cache.set_scales(1, {0.5f, 0.25f});
        const sequence_id id = cache.add_sequence();
        for (int l = 0; l < 2; ++l) cache.append(id, l, keys, values, tokens);
        const auto [k, v] = read_back(cache, id);
        std::vector<float8_e4m3> sk(keys.size()), sv(values.size());
        cache.read(id, 1, 0, tokens, span<float8_e4m3>(sk), span<float8_e4m3>(sv));
        CHECK(k[11] == float(sk[11]) * 0.5f);
        CHECK(v[12] == float(sv[12]) * 0.25f);
    }
}
