// The CPU backend against the reference on the whole matrix, over the private
// scatter layout (and the shipped layouts, see layouts.hpp).
#include <doctest/doctest.h>

#include "kvcache/backend/cpu.hpp"
#include "support/attention_harness.hpp"
#include "support/layout_factories.hpp"

using namespace kvcache;
using namespace kvcache_test;

namespace {

struct cpu_backend {
    static constexpr const char* name = "cpu";
    template <class View, class Queries, class Outputs, class Lse>
    static void decode(const View& view, const Queries& q, Outputs& o, Lse& lse, const attention_options& options) {
        cpu::decode_attention_with_lse(view, q, o, lse, options);
    }
    template <class View, class Queries, class Offsets, class Outputs, class Lse>
    static void prefill(const View& view, const Queries& q, const Offsets& offsets, Outputs& o, Lse& lse,
                        const attention_options& options) {
        cpu::prefill_attention_with_lse(view, q, offsets, o, lse, options);
    }
    template <class View, class Rows, class Offsets>
    static void append(const View& view, const Rows& k, const Rows& v, const Offsets& offsets) {
        cpu::append(view, k, v, offsets);
    }
};

using mha = head_config<4, 4, 32>;
using gqa = head_config<8, 2, 64>;
using mqa = head_config<4, 1, 32>;

template <class Factory, class Element>
void check_all_heads() {
    check_attention<cpu_backend, Factory, Element, mha>();
    check_attention<cpu_backend, Factory, Element, gqa>();
    check_attention<cpu_backend, Factory, Element, mqa>();
    check_append<cpu_backend, Factory, Element, gqa>();
}

}  // namespace

TEST_CASE("cpu backend matches the reference: scatter layout, fp32") { check_all_heads<scatter_factory, float>(); }
TEST_CASE("cpu backend matches the reference: scatter layout, fp16") { check_all_heads<scatter_factory, half>(); }

TEST_CASE("cpu backend matches the reference: contiguous layout") {
    check_all_heads<contiguous_factory, float>();
    check_all_heads<contiguous_factory, half>();
}
TEST_CASE("cpu backend matches the reference: paged layout") {
    check_all_heads<paged_factory, float>();
    check_all_heads<paged_factory, half>();
}
TEST_CASE("cpu backend matches the reference: sliding-window layout") {
    check_all_heads<sliding_window_factory, float>();
    check_all_heads<sliding_window_factory, half>();
}

TEST_CASE("cpu backend: odd group sizes and head dim 56, mixed precision") {
    check_attention<cpu_backend, scatter_factory, half, head_config<5, 1, 56>>();
    check_attention<cpu_backend, scatter_factory, float, head_config<14, 2, 16>>();  // group 7
    check_attention<cpu_backend, scatter_factory, half, head_config<4, 2, 32>, float>();  // fp16 cache, fp32 queries
    check_append<cpu_backend, scatter_factory, half, head_config<5, 1, 56>, float>();    // fp32 rows into fp16
    check_attention<cpu_backend, paged_factory, half, head_config<7, 1, 56>>();
}

TEST_CASE("cpu backend gives the same answer on one thread and on several, split or not") {
    using heads = head_config<8, 2, 64>;
    context_case c{"long", {700}, 0, 0, 16, {1}, {}};
    auto cache = scatter_factory::make<half, heads>(c, 3);
    fill_cache(cache->view(), 4);
    const auto queries = random_rows<float>(heads::query_heads * heads::head_dim, 3.0f, 5);
    const auto expected = reference::decode_attention_exact(cache->view(), queries);
    for (int threads : {1, 3}) {
        cpu::set_thread_count(threads);
        CHECK(cpu::thread_count() == threads);
        for (int splits : {0, 1, 2, 5}) {
            attention_options options;
            options.kv_splits = splits;
            std::vector<float> outputs(queries.size()), lse(heads::query_heads);
            cpu::decode_attention_with_lse(cache->view(), queries, outputs, lse, options);
            compare(outputs, lse, expected, "threads " + std::to_string(threads) + " splits " + std::to_string(splits));
        }
    }
    cpu::set_thread_count(0);
}

TEST_CASE("cpu merge_states matches the reference merge, empty states included") {
    const float inf = std::numeric_limits<float>::infinity();
    const int states = 3, rows = 4, dim = 16;
    const auto outputs = random_rows<float>(states * rows * dim, 1.0f, 9);
    // row 0: all present; row 1: one empty; row 2: all empty; row 3: widely different lse.
    const std::vector<float> lse = {1.0f, -inf, -inf, 30.0f, 2.0f, 0.5f, -inf, -20.0f, 0.0f, 3.0f, -inf, 0.0f};
    std::vector<float> actual(rows * dim), actual_lse(rows), expected(rows * dim), expected_lse(rows);
    cpu::merge_states(states, rows, dim, outputs, lse, actual, actual_lse);
    reference::merge_states(states, rows, dim, outputs, lse, expected, expected_lse);
    for (int i = 0; i < rows * dim; ++i) {
        CHECK_FALSE(std::isnan(actual[i]));
        CHECK(actual[i] == doctest::Approx(expected[i]).epsilon(1e-5));
    }
    for (int r : {0, 1, 3}) CHECK(actual_lse[r] == doctest::Approx(expected_lse[r]).epsilon(1e-6));
    CHECK(actual_lse[2] == -inf);
    CHECK(expected_lse[2] == -inf);
}

TEST_CASE("half widening used by the cpu backend is exact for every binary16 value") {
    std::vector<half> all(65536);
    for (int i = 0; i < 65536; ++i) all[i] = half::from_bits(std::uint16_t(i));
    std::vector<float> widened(65536);
    cpu::detail::widen(all.data(), widened.data(), 65536);
    int mismatches = 0;
    for (int i = 0; i < 65536; ++i) {
        const float expected = static_cast<float>(all[i]);  // core's exact software conversion
        mismatches += std::memcmp(&expected, &widened[i], 4) != 0;
    }
    CHECK(mismatches == 0);
}

TEST_CASE("cpu backend: a zero-length sequence gives zeros and lse -inf next to a normal one") {
    using heads = head_config<4, 2, 16>;
    context_case c{"empty", {0, 7}, 0, 0, 16, {0, 7}, {}};
    auto cache = contiguous_factory::make<half, heads>(c, 1);
    fill_cache(cache->view(), 2);
    const auto queries = random_rows<half>(7 * heads::query_heads * heads::head_dim, 3.0f, 3);
    std::vector<half> outputs(2 * heads::query_heads * heads::head_dim, half(5.0f));
    std::vector<float> lse(2 * heads::query_heads, 5.0f);
    cpu::decode_attention_with_lse(cache->view(), queries, outputs, lse);
    compare(outputs, lse, reference::decode_attention_exact(cache->view(), queries), "decode with an empty sequence");
    CHECK(std::isinf(lse[0]));
    CHECK(to_float(outputs[0]) == 0.0f);
    const int offsets[3] = {0, 0, 7};
    std::vector<half> prefill(7 * heads::query_heads * heads::head_dim);
    std::vector<float> prefill_lse(7 * heads::query_heads);
    cpu::prefill_attention_with_lse(cache->view(), queries, offsets, prefill, prefill_lse);
    compare(prefill, prefill_lse, reference::prefill_attention_exact(cache->view(), queries, offsets),
            "prefill next to an empty sequence");
}
