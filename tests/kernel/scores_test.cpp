// Attention scores as an optional output of decode and prefill: the
// reference on cases worked out by hand, the CPU backend and the kernel
// bodies under the emulator against the reference over layouts x element
// types x GQA groups (splits, causal prefill, window and sinks, soft cap),
// and the argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/emulated.hpp"
#include "kvcache/backend/reference.hpp"
#include "support/backend_suite.hpp"
#include "support/score_checks.hpp"

using namespace kvcache;
using namespace kvcache_test;

namespace {

using one_head = head_config<1, 1, 8>;
using pair_group = head_config<2, 1, 8>;

/// A float contiguous cache of one sequence whose key row p is keys[p] (head
/// dim 8, the first element set, the rest 0) and values 0.
template <class Heads>
auto hand_cache(const std::vector<float>& first_elements) {
    const context_case c{"hand", {int(first_elements.size())}, 0, 0, 16, {int(first_elements.size())}, {}};
    auto cache = contiguous_factory::make<float, Heads>(c, 1);
    const auto view = cache->view();
    for (int p = 0; p < int(first_elements.size()); ++p)
        for (int d = 0; d < 8; ++d) {
            view.key(0, 0, p)[d] = d == 0 ? first_elements[p] : 0.0f;
            view.value(0, 0, p)[d] = 0.0f;
        }
    return cache;
}

template <class Backend>
void check_hand_cases(const Backend& backend, const std::string& name) {
    INFO(name);
    {  // logits 0 and ln 3 (scale 1): weights 1/4 and 3/4
        auto cache = hand_cache<one_head>({0.0f, std::log(3.0f)});
        std::vector<float> queries(8, 0.0f), outputs(8), scores(2, 7.0f);
        queries[0] = 1.0f;
        decode_params call(cache->view(), queries, outputs);
        call.options.softmax_scale = 1.0f;
        call.scores = scores;
        call.score_stride = 2;
        backend.decode(call);
        CHECK(scores[0] == doctest::Approx(0.25).epsilon(1e-6));
        CHECK(scores[1] == doctest::Approx(0.75).epsilon(1e-6));
    }
    {  // two query heads, zero queries: uniform weights, summed over the group
        auto cache = hand_cache<pair_group>({1.0f, 2.0f, 3.0f, 4.0f});
        std::vector<float> queries(16, 0.0f), outputs(16), scores(5, 7.0f);
        decode_params call(cache->view(), queries, outputs);
        call.scores = scores;
        call.score_stride = 5;
        backend.decode(call);
        for (int i = 0; i < 4; ++i) CHECK(scores[i] == doctest::Approx(0.5).epsilon(1e-6));
        CHECK(scores[4] == 0.0f);  // past the visible rows
        // window 2 and 1 sink at position 3: rows 0, 2, 3 seen, 2/3 each; row 1 masked.
        call.options.window = 2;
        call.options.sinks = 1;
        backend.decode(call);
        CHECK(scores[0] == doctest::Approx(2.0 / 3).epsilon(1e-6));
        CHECK(scores[1] == 0.0f);
        CHECK(scores[2] == doctest::Approx(2.0 / 3).epsilon(1e-6));
        CHECK(scores[3] == doctest::Approx(2.0 / 3).epsilon(1e-6));
    }
    {  // causal prefill of 3 tokens, zero queries, one head: token t spreads 1 over t + 1 rows
        auto cache = hand_cache<one_head>({1.0f, 2.0f, 3.0f});
        std::vector<float> queries(24, 0.0f), outputs(24), scores(3, 7.0f);
        const std::vector<int> offsets = {0, 3};
        prefill_params call(cache->view(), queries, offsets, outputs);
        call.scores = scores;
        call.score_stride = 3;
        backend.prefill(call);
        CHECK(scores[0] == doctest::Approx(1.0 + 1.0 / 2 + 1.0 / 3).epsilon(1e-6));
        CHECK(scores[1] == doctest::Approx(1.0 / 2 + 1.0 / 3).epsilon(1e-6));
        CHECK(scores[2] == doctest::Approx(1.0 / 3).epsilon(1e-6));
        call.score_queries = 1;  // only the last token
        backend.prefill(call);
        for (int i = 0; i < 3; ++i) CHECK(scores[i] == doctest::Approx(1.0 / 3).epsilon(1e-6));
    }
}

}  // namespace

TEST_CASE("scores: the reference, the cpu backend and the emulated kernels on cases worked out by hand") {
    check_hand_cases(reference_backend{}, "reference");
    check_hand_cases(cpu_backend{}, "cpu");
    check_hand_cases(emulated_backend{}, "emulated");
}

TEST_CASE("scores: the reference's blocks sum to the group's rows that saw a key") {
    check_scores<paged_factory, float, suite_gqa>(reference_backend{}, "reference");
    check_scores<sliding_window_factory, half, suite_mha>(reference_backend{}, "reference");
}

TEST_CASE("scores: cpu backend against the reference, every layout, float and half") {
    const cpu_backend cpu;
    check_scores<contiguous_factory, float, suite_gqa>(cpu, "cpu");
    check_scores<contiguous_factory, half, suite_mqa>(cpu, "cpu");
    check_scores<paged_factory, half, suite_gqa>(cpu, "cpu");
    check_scores<paged_factory, float, suite_mha>(cpu, "cpu");
    check_scores<sliding_window_factory, float, suite_gqa>(cpu, "cpu");
    check_scores<sliding_window_factory, half, suite_mqa>(cpu, "cpu");
    check_scores<scatter_factory, half, suite_gqa>(cpu, "cpu");
}

TEST_CASE("scores: cpu backend against the reference, bfloat16, fp8, odd groups, dynamic heads") {
    const cpu_backend cpu;
    check_scores<paged_factory, bfloat16, suite_gqa>(cpu, "cpu");
    check_scores<contiguous_factory, float8_e4m3, suite_gqa, half>(cpu, "cpu");
    check_scores<sliding_window_factory, float8_e5m2, suite_mqa, float>(cpu, "cpu");
    check_scores<paged_factory, half, head_config<14, 2, 16>>(cpu, "cpu");  // group 7
    check_scores<paged_factory, half, head_config<2, 1, 128>>(cpu, "cpu");
    check_scores<paged_factory, half, dynamic_heads<32>>(cpu, "cpu", dynamic_heads<32>{9, 1});
}

TEST_CASE("scores: emulated kernels against the reference, every layout, float, half and bfloat16") {
    emulator_options options;
    options.worker_threads = 2;
    const emulated_backend emulated(options);
    check_scores<contiguous_factory, float, suite_gqa>(emulated, "emulated");
    check_scores<paged_factory, half, suite_gqa>(emulated, "emulated");
    check_scores<sliding_window_factory, half, suite_mqa>(emulated, "emulated");
    check_scores<scatter_factory, float, suite_mha>(emulated, "emulated");
    check_scores<paged_factory, bfloat16, head_config<14, 2, 16>, float>(emulated, "emulated");  // group 7
    check_scores<contiguous_factory, half, dynamic_heads<32>>(emulated, "emulated", dynamic_heads<32>{9, 1});
}

TEST_CASE("scores: argument checks name the bad value") {
    using heads = head_config<4, 2, 16>;
    const context_case c{"two", {5, 9}, 0, 0, 16, {5, 9}, {}};
    auto cache = contiguous_factory::make<float, heads>(c, 1);
    std::vector<float> queries(2 * 4 * 16), outputs(queries.size()), scores(2 * 2 * 9);
    decode_params call(cache->view(), queries, outputs);
    call.scores = scores;
    auto message = [&](auto&& run) {
        try {
            run();
        } catch (const kvcache::error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    call.score_stride = 0;
    CHECK(message([&] { cpu_backend{}.decode(call); }).find("score_stride = 0 must be positive") != std::string::npos);
    call.score_stride = 10;
    CHECK(message([&] { cpu_backend{}.decode(call); }).find("scores holds 36 entries but 2 sequences x 2 kv_heads x score_stride 10 = 40") != std::string::npos);
    call.score_stride = 8;
    call.scores = span<float>(scores.data(), 32);
    CHECK(message([&] { reference_backend{}.decode(call); }).find("batch entry 1 has 9 visible rows but score_stride is 8") != std::string::npos);
    call.score_stride = 9;
    call.scores = scores;
    CHECK_NOTHROW(cpu_backend{}.decode(call));
    CHECK_NOTHROW(emulated_backend{}.decode(call));
    const std::vector<int> offsets = {0, 5, 14};
    std::vector<float> prefill_queries(14 * 4 * 16), prefill_outputs(prefill_queries.size());
    prefill_params prefill(cache->view(), prefill_queries, offsets, prefill_outputs);
    prefill.scores = scores;
    prefill.score_stride = 9;
    prefill.score_queries = -1;
    CHECK(message([&] { cpu_backend{}.prefill(prefill); }).find("score_queries = -1 is negative") != std::string::npos);
    prefill.score_queries = 2;
    CHECK_NOTHROW(cpu_backend{}.prefill(prefill));
    CHECK_NOTHROW(emulated_backend{}.prefill(prefill));
}
