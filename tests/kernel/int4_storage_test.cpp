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
#include "support/quantised_storage.hpp"

using namespace kvcache;
using namespace kvcache_test;

namespace {

using heads = head_config<4, 2, 40>;  // two groups: 32 values and a short one of 8
constexpr int dim = heads::head_dim, kv = 2, stored = dim / 2 + 2 * 4;

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
void append_and_check(Cache cache) {
    const sequence_id id = cache.add_sequence();
    const int tokens = 11;
    const auto keys = random_rows(std::size_t(tokens) * kv * dim, 1), values = random_rows(std::size_t(tokens) * kv * dim, 2);
    for (int l = 0; l < cache.layers(); ++l) cache.append(id, l, keys, values, tokens);
    check_quantised(layer_rows(cache, id, 1, true), keys, tokens);
    check_quantised(layer_rows(cache, id, 1, false), values, tokens);
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
    check_fork_save_load(paged_cache<qint4, heads>(2, 32, 4), paged_cache<qint8, heads>(2, 32, 4), "int4");
}

TEST_CASE("int4 caches: the reference backend appends the owners' rows and dequantises them") {
    const auto decode = [](const qint4* row, int d) { return decoded(row, d); };
    // The format: each value within half a step, (max - min) / 30 of its group: about 0.2 for
    // N(0, 1) rows, 0.5 for a group with a 4x outlier. V's errors pass to the output, K's
    // shift logits by about as much (q . dk / sqrt(D)), so the outputs may move by about 1.
    check_reference(contiguous_cache<qint4, heads>(2, 2, 32), contiguous_cache<float, heads>(2, 2, 32),
                    contiguous_cache<float, heads>(2, 2, 32), decode, 1.0);
    check_reference(paged_cache<qint4, heads>(2, 32, 4), paged_cache<float, heads>(2, 32, 4),
                    paged_cache<float, heads>(2, 32, 4), decode, 1.0);
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
