// The kernel bodies under the SIMT emulator against the reference: every
// layout x {fp32, fp16} x {MHA, GQA group 4, MQA} x {decode, prefill, append}
// x {short, crossing pages and the window, long enough to split}, under two
// thread schedules (in order and a seeded shuffle; the shuffle reorders
// threads between barriers, so a missing barrier changes the answer).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "kvcache/backend/emulated.hpp"
#include "support/attention_harness.hpp"
#include "support/layout_factories.hpp"

using namespace kvcache;
using namespace kvcache_test;

namespace {

emulator_options current;  // the schedule under test

struct emulated_backend {
    static constexpr const char* name = "emulated";
    template <class View, class Queries, class Outputs, class Lse>
    static void decode(const View& view, const Queries& q, Outputs& o, Lse& lse, const attention_options& options) {
        emulated::decode_attention_with_lse(view, q, o, lse, options, current);
    }
    template <class View, class Queries, class Offsets, class Outputs, class Lse>
    static void prefill(const View& view, const Queries& q, const Offsets& offsets, Outputs& o, Lse& lse,
                        const attention_options& options) {
        emulated::prefill_attention_with_lse(view, q, offsets, o, lse, options, current);
    }
    template <class View, class Rows, class Offsets>
    static void append(const View& view, const Rows& k, const Rows& v, const Offsets& offsets) {
        emulated::append(view, k, v, offsets, current);
    }
};

using mha = head_config<4, 4, 32>;
using gqa = head_config<8, 2, 32>;
using mqa = head_config<4, 1, 32>;

/// Runs body once per schedule.
template <class Body>
void for_schedules(Body&& body) {
    for (const emulator_schedule& schedule : {emulator_schedule::in_order(), emulator_schedule::shuffled(0x5eed)}) {
        current = emulator_options{};
        current.schedule = schedule;
        current.worker_threads = 2;
        INFO("schedule " << to_string(schedule));
        body();
    }
}

template <class Factory, class Element>
void check_all_heads() {
    for_schedules([] {
        check_attention<emulated_backend, Factory, Element, mha>();
        check_attention<emulated_backend, Factory, Element, gqa>();
        check_attention<emulated_backend, Factory, Element, mqa>();
        check_append<emulated_backend, Factory, Element, gqa>();
    });
}

}  // namespace

TEST_CASE("emulated kernels match the reference: contiguous") {
    check_all_heads<contiguous_factory, float>();
    check_all_heads<contiguous_factory, half>();
}
TEST_CASE("emulated kernels match the reference: paged") {
    check_all_heads<paged_factory, float>();
    check_all_heads<paged_factory, half>();
}
TEST_CASE("emulated kernels match the reference: sliding window") {
    check_all_heads<sliding_window_factory, float>();
    check_all_heads<sliding_window_factory, half>();
}
TEST_CASE("emulated kernels match the reference: scatter (irregular runs, visibility-only window)") {
    check_all_heads<scatter_factory, float>();
    check_all_heads<scatter_factory, half>();
}

TEST_CASE("emulated kernels: odd group sizes, head dim 56, a 128-dim model head, mixed precision") {
    for_schedules([] {
        check_attention<emulated_backend, paged_factory, half, head_config<5, 1, 56>>();
        check_attention<emulated_backend, sliding_window_factory, float, head_config<14, 2, 16>>();  // group 7
        check_attention<emulated_backend, contiguous_factory, half, head_config<2, 1, 128>>();
        check_attention<emulated_backend, paged_factory, half, head_config<4, 2, 32>, float>();  // fp32 queries
        check_append<emulated_backend, sliding_window_factory, half, head_config<5, 1, 56>, float>();
    });
}

TEST_CASE("emulated merge_states kernel: empty states weigh nothing, all-empty rows give zeros") {
    const float inf = std::numeric_limits<float>::infinity();
    const int states = 3, rows = 4, dim = 16;
    const auto outputs = random_rows<float>(states * rows * dim, 1.0f, 9);
    const std::vector<float> lse = {1.0f, -inf, -inf, 30.0f, 2.0f, 0.5f, -inf, -20.0f, 0.0f, 3.0f, -inf, 0.0f};
    std::vector<half> actual(rows * dim);
    std::vector<float> actual_lse(rows), expected(rows * dim), expected_lse(rows);
    reference::merge_states(states, rows, dim, outputs, lse, expected, expected_lse);
    for_schedules([&] {
        emulated::merge_states(states, rows, dim, outputs, lse, actual, actual_lse, current);
        for (int i = 0; i < rows * dim; ++i) {
            const float value = to_float(actual[i]);
            CHECK_FALSE(std::isnan(value));
            CHECK(std::fabs(value - expected[i]) <= 1e-3f);  // binary16 output: half an ulp at 1 is 4.9e-4
        }
        for (int r : {0, 1, 3}) CHECK(actual_lse[r] == doctest::Approx(expected_lse[r]).epsilon(1e-6));
        CHECK(actual_lse[2] == -inf);
        CHECK(to_float(actual[2 * dim]) == 0.0f);
    });
}

TEST_CASE("emulated decode: every split count agrees, including splits past the keys") {
    using heads = head_config<8, 2, 32>;
    context_case c{"long", {260, 3}, 0, 0, 16, {1, 1}, {}};
    auto cache = paged_factory::make<float, heads>(c, 3);
    fill_cache(cache->view(), 4);
    const auto queries = random_rows<float>(2 * heads::query_heads * heads::head_dim, 3.0f, 5);
    const auto expected = reference::decode_attention_exact(cache->view(), queries);
    for (int splits : {1, 2, 5, 32}) {  // 32: the most allowed, most past the keys of the short sequence
        attention_options options;
        options.kv_splits = splits;
        std::vector<float> outputs(queries.size()), lse(2 * heads::query_heads);
        emulated::decode_attention_with_lse(cache->view(), queries, outputs, lse, options);
        compare(outputs, lse, expected, "splits " + std::to_string(splits));
    }
}

TEST_CASE("emulated kernels: empty batch entries and zero-length sequences") {
    using heads = head_config<4, 2, 16>;
    context_case c{"empty", {0, 7}, 0, 0, 16, {0, 7}, {}};
    auto cache = contiguous_factory::make<half, heads>(c, 1);
    fill_cache(cache->view(), 2);
    const auto queries = random_rows<half>(7 * heads::query_heads * heads::head_dim, 3.0f, 3);
    std::vector<half> outputs(queries.size(), half(5.0f));
    std::vector<float> lse(2 * heads::query_heads, 5.0f);
    emulated::decode_attention_with_lse(cache->view(), queries, outputs, lse);
    compare(std::vector<half>(outputs.begin(), outputs.begin() + 2 * heads::query_heads * heads::head_dim), lse,
            reference::decode_attention_exact(cache->view(), queries), "decode with an empty sequence");
    CHECK(std::isinf(lse[0]));
    CHECK(to_float(outputs[0]) == 0.0f);
}
