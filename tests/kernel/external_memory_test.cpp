// Views over memory the caller owns: a buffer laid out the way another
// engine lays out its cache, attended through a strided view, gives what the
// same rows give in kvcache's own cache.
#include <doctest/doctest.h>

#include <type_traits>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/layout/contiguous_view.hpp"
#include "kvcache/layout/sliding_window_view.hpp"

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

TEST_CASE("a token-major paged view over a block pool laid out as vLLM's (NHD) attends like the cache") {
    // vLLM's flash layout: key_cache[num_blocks][block_size][num_kv_heads][head_size], values alike;
    // block tables hand out blocks in any order. Block size 4, 7 blocks, two sequences.
    constexpr int block = 4, blocks = 7, dim = heads::head_dim, kv = heads::kv_heads();
    const std::vector<int> lengths = {9, 6};
    const std::vector<int> page_offsets = {0, 3, 5};             // CSR over the block table
    const std::vector<int> block_table = {5, 0, 3, 6, 2};        // sequence 0: blocks 5, 0, 3; sequence 1: 6, 2
    std::vector<float> keys(std::size_t(blocks) * block * kv * dim), values(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i)
        keys[i] = 0.013f * float(i % 101) - 0.6f, values[i] = 0.017f * float(i % 83) - 0.7f;
    using view_type = token_major_paged_view<float, heads>;
    const auto external = view_type::packed(keys.data(), values.data(), page_offsets.data(), block_table.data(),
                                            lengths.data(), 2, block);
    // Row (sequence 1, kv head 1, position 5): block 2, slot 1 of the block, head 1.
    CHECK(external.key(1, 1, 5) == keys.data() + ((std::size_t(2) * block + 1) * kv + 1) * dim);
    // The same rows copied token by token into kvcache's own (head-major) cache.
    paged_cache<float, heads> cache(1, 16, 4);
    std::vector<sequence_id> batch;
    for (int b = 0; b < 2; ++b) {
        batch.push_back(cache.add_sequence());
        std::vector<float> k, v;
        for (int p = 0; p < lengths[b]; ++p)
            for (int h = 0; h < kv; ++h) {
                const float* key = external.key(b, h, p);
                const float* value = external.value(b, h, p);
                k.insert(k.end(), key, key + dim);
                v.insert(v.end(), value, value + dim);
            }
        cache.append(batch.back(), 0, k, v, lengths[b]);
    }
    std::vector<float> queries(std::size_t(15) * q_row);
    for (std::size_t i = 0; i < queries.size(); ++i) queries[i] = 0.04f * float(i % 17) - 0.3f;
    const std::vector<int> offsets = {0, 9, 15};
    std::vector<float> outputs(queries.size()), expected(queries.size());
    cpu_backend{}.prefill(prefill_params(external, queries, offsets, outputs));
    reference_backend{}.prefill(prefill_params(cache.view(0, batch), queries, offsets, expected));
    for (std::size_t i = 0; i < outputs.size(); ++i) CHECK(outputs[i] == doctest::Approx(expected[i]).epsilon(1e-5));
    // Decode reads the same pool.
    const std::vector<float> decode_queries(queries.begin(), queries.begin() + 2 * q_row);
    std::vector<float> decoded(decode_queries.size()), decoded_expected(decode_queries.size());
    cpu_backend{}.decode(decode_params(external, decode_queries, decoded));
    reference_backend{}.decode(decode_params(cache.view(0, batch), decode_queries, decoded_expected));
    for (std::size_t i = 0; i < decoded.size(); ++i) CHECK(decoded[i] == doctest::Approx(decoded_expected[i]).epsilon(1e-5));
}

TEST_CASE("read-only views (const elements) over const memory attend like writable ones") {
    // Memory the caller may only read: another engine's cache handed over as const.
    constexpr int capacity = 12, dim = heads::head_dim, kv = heads::kv_heads();
    const std::vector<int> lengths = {11, 5};
    std::vector<half> storage_keys(2 * capacity * kv * dim), storage_values(storage_keys.size());
    for (std::size_t i = 0; i < storage_keys.size(); ++i)
        storage_keys[i] = half(0.01f * float(i % 91) - 0.4f), storage_values[i] = half(0.02f * float(i % 79) - 0.7f);
    const std::vector<half>& keys = storage_keys;
    const std::vector<half>& values = storage_values;
    using read_only_view = contiguous_view<const half, heads>;
    const auto view = read_only_view::packed(keys.data(), values.data(), lengths.data(), nullptr, 2, capacity);
    static_assert(std::is_same_v<decltype(view.key(0, 0, 0)), const half*>, "a read-only view hands out const rows");
    // The writable view of the same memory, as the oracle's input.
    const auto writable = contiguous_view<half, heads>::packed(storage_keys.data(), storage_values.data(),
                                                               lengths.data(), nullptr, 2, capacity);
    static_assert(std::is_same_v<std::decay_t<decltype(writable.read_only())>, read_only_view>,
                  "read_only() is the const-element view");

    std::vector<float> queries(2 * q_row);
    for (std::size_t i = 0; i < queries.size(); ++i) queries[i] = 0.05f * float(i % 13) - 0.3f;
    std::vector<float> expected(queries.size()), outputs(queries.size());
    reference_backend{}.decode(decode_params(writable, queries, expected));
    // Deduction takes the read-only view; the params hold the view the kernels are compiled for.
    decode_params call(view, queries, outputs);
    static_assert(std::is_same_v<decltype(call.view), contiguous_view<half, heads>>,
                  "attention over a read-only view runs the writable view's kernels");
    CHECK(call.view.keys == storage_keys.data());
    cpu_backend{}.decode(call);
    for (std::size_t i = 0; i < outputs.size(); ++i) CHECK(outputs[i] == doctest::Approx(expected[i]).epsilon(1e-5));

    // Prefill of the last 3 positions of each sequence through writable.read_only().
    const std::vector<int> offsets = {0, 3, 6};
    std::vector<float> prefill_queries(6 * q_row), prefill_expected(prefill_queries.size()),
        prefill_outputs(prefill_queries.size());
    for (std::size_t i = 0; i < prefill_queries.size(); ++i) prefill_queries[i] = 0.03f * float(i % 19) - 0.25f;
    reference_backend{}.prefill(prefill_params(writable, prefill_queries, offsets, prefill_expected));
    cpu_backend{}.prefill(prefill_params(writable.read_only(), prefill_queries, offsets, prefill_outputs));
    for (std::size_t i = 0; i < prefill_outputs.size(); ++i)
        CHECK(prefill_outputs[i] == doctest::Approx(prefill_expected[i]).epsilon(1e-5));
    // Nothing was written through the read-only view.
    for (std::size_t i = 0; i < keys.size(); ++i)
        REQUIRE(to_float(keys[i]) == to_float(half(0.01f * float(i % 91) - 0.4f)));
}

TEST_CASE("read_only() of a paged and a sliding-window view keeps every field") {
    std::vector<float> k(64), v(64);
    const std::vector<int> offsets = {0, 1}, pages = {0}, lengths = {3};
    auto paged = paged_view<float, heads>::packed(k.data(), v.data(), offsets.data(), pages.data(), lengths.data(), 1, 2);
    paged.page_stride = 200;
    paged.mask.window = 5;
    const auto paged_read = paged.read_only();
    CHECK(paged_read.page_stride == 200);
    CHECK(paged_read.mask.window == 5);
    CHECK(paged_read.key(0, 1, 1) == paged.key(0, 1, 1));
    auto window = sliding_window_view<float, heads>::packed(k.data(), v.data(), lengths.data(), nullptr, 1, 1, 4, 4);
    window.head_stride = 96;
    const auto window_read = window.read_only();
    CHECK(window_read.head_stride == 96);
    CHECK(window_read.value(0, 1, 2) == window.value(0, 1, 2));
    CHECK(detail::attention_view_of(window_read).keys == k.data());
}
