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
