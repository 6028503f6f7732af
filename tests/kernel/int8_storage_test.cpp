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
#include "support/quantised_storage.hpp"

using namespace kvcache;
using namespace kvcache_test;

namespace {

using heads = head_config<4, 2, 16>;
constexpr int dim = heads::head_dim, kv = 2, stored = dim + 4;

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
    check_fork_save_load(paged_cache<qint8, heads>(2, 32, 4), paged_cache<half, heads>(2, 32, 4), "int8");
    paged_cache<half, heads> halves(2, 32, 4);
    std::stringstream file;
    paged_cache<qint8, heads> cache(2, 32, 4);
    const sequence_id id = cache.add_sequence();
    const auto rows = random_rows(std::size_t(kv) * dim, 8);
    for (int l = 0; l < 2; ++l) cache.append(id, l, rows, rows, 1);
    cache.save(file, {id});
    CHECK_THROWS_WITH_AS(halves.load(file), doctest::Contains("fp16"), error);  // names the cache's type too
}

TEST_CASE("int8 caches: the reference backend appends the owners' rows and dequantises them") {
    // q * scale, read from the bytes by the test.
    const auto decode = [](const qint8* row, int d) {
        float scale;
        std::memcpy(&scale, row + dim, sizeof scale);
        return double(float(row[d].bits) * scale);
    };
    // The format: each element within half a step (max|row| / 254) of the original.
    check_reference(contiguous_cache<qint8, heads>(2, 2, 32), contiguous_cache<float, heads>(2, 2, 32),
                    contiguous_cache<float, heads>(2, 2, 32), decode, 0.05);
    check_reference(paged_cache<qint8, heads>(2, 32, 4), paged_cache<float, heads>(2, 32, 4),
                    paged_cache<float, heads>(2, 32, 4), decode, 0.05);
}
