// Views over memory the caller owns: a buffer laid out the way another
// engine lays out its cache, attended through a strided view, gives what the
// same rows give in kvcache's own cache.
#include <doctest/doctest.h>

#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/layout/contiguous_view.hpp"

using namespace kvcache;

namespace {
using heads = head_config<4, 2, 16>;
constexpr std::size_t q_row = heads::query_heads() * heads::head_dim;
}  // namespace

TEST_CASE("a strided view over memory laid out token-major (as llama.cpp stores K and V) attends like the cache") {
    // Two sequences in one buffer per K and V: [sequence][position][kv_head][head_dim], capacity 32.
    constexpr int capacity = 32, dim = heads::head_dim, kv = heads::kv_heads();
    const std::vector<int> lengths = {19, 7};
    std::vector<float> keys(2 * capacity * kv * dim), values(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i)
        keys[i] = 0.01f * float(i % 97) - 0.4f, values[i] = 0.02f * float(i % 89) - 0.8f;
    const auto external = contiguous_view<float, heads>::strided(keys.data(), values.data(), lengths.data(), 2, capacity,
                                                                 std::int64_t(capacity) * kv * dim, dim, kv * dim);
    // The same rows in a cache of kvcache's own layout, written row by row.
    paged_cache<float, heads> cache(1, 16, 4);
    std::vector<sequence_id> batch;
    for (int b = 0; b < 2; ++b) {
        batch.push_back(cache.add_sequence());
        const std::size_t first = std::size_t(b) * capacity * kv * dim, count = std::size_t(lengths[b]) * kv * dim;
        cache.append(batch.back(), 0, span<const float>(keys.data() + first, count),
                     span<const float>(values.data() + first, count), lengths[b]);
    }
    std::vector<float> queries(2 * q_row);
    for (std::size_t i = 0; i < queries.size(); ++i) queries[i] = 0.05f * float(i % 13) - 0.3f;
    std::vector<float> outputs(queries.size()), expected(queries.size());
    cpu_backend{}.decode(decode_params(external, queries, outputs));
    reference_backend{}.decode(decode_params(cache.view(0, batch), queries, expected));
    for (std::size_t i = 0; i < outputs.size(); ++i) CHECK(outputs[i] == doctest::Approx(expected[i]).epsilon(1e-5));
    CHECK(external.key(1, 1, 3) == keys.data() + (std::size_t(capacity) + 3) * kv * dim + dim);
}
