// The suite every host backend passes, written once over the backend object:
// reference_backend, cpu_backend and emulated_backend take the same params,
// so each test file only names its backend (and how long it may run).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention_harness.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "layout_factories.hpp"

namespace kvcache_test {

using suite_mha = kvcache::head_config<4, 4, 32>;
using suite_gqa = kvcache::head_config<8, 2, 32>;
using suite_mqa = kvcache::head_config<4, 1, 32>;

/// Decode, prefill (last and explicit positions) and append over one layout
/// and element type, for MHA, GQA group 4 and MQA.
/// @tparam Factory a layout factory (layout_factories.hpp, scatter_factory)
/// @tparam Element the cache's element type
/// @tparam Backend a backend object
template <class Factory, class Element, class Backend>
void check_layout(const Backend& backend, const std::string& name) {
    check_attention<Factory, Element, suite_mha>(backend, name);
    check_attention<Factory, Element, suite_gqa>(backend, name);
    check_attention<Factory, Element, suite_mqa>(backend, name);
    check_append<Factory, Element, suite_gqa>(backend, name);
}

/// Odd group sizes, head dim 56, a 128-dim head, queries and rows of the other precision.
/// @tparam Backend a backend object
template <class Backend>
void check_odd_shapes(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    check_attention<paged_factory, half, head_config<5, 1, 56>>(backend, name);
    check_attention<sliding_window_factory, float, head_config<14, 2, 16>>(backend, name);  // group 7
    check_attention<contiguous_factory, half, head_config<2, 1, 128>>(backend, name);
    check_attention<paged_factory, half, head_config<4, 2, 32>, float>(backend, name);  // fp16 cache, fp32 queries
    check_append<sliding_window_factory, half, head_config<5, 1, 56>, float>(backend, name);  // fp32 rows into fp16
}

/// Head counts given at run time (head_config<dynamic, dynamic, D>): MHA, GQA
/// groups below, at and above the rows a dynamic decode block holds (so a group
/// spans several blocks, the last one partial), MQA, and head dim 56, in every
/// layout; prefill tiles then start and end inside a token's group.
/// @tparam Backend a backend object
template <class Backend>
void check_dynamic_heads(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    using d32 = dynamic_heads<32>;
    for (const d32 heads : {d32{4, 4}, d32{8, 2}, d32{14, 2}, d32{9, 1}, d32{4, 1}}) {
        check_attention<paged_factory, half, d32>(backend, name, heads);
        check_attention<contiguous_factory, float, d32>(backend, name, heads);
    }
    check_attention<sliding_window_factory, half, d32>(backend, name, d32{6, 2});
    check_attention<scatter_factory, float, d32>(backend, name, d32{10, 2});
    check_attention<paged_factory, half, dynamic_heads<56>, float>(backend, name, dynamic_heads<56>{5, 1});
    check_append<paged_factory, half, d32>(backend, name, d32{6, 3});
    check_append<sliding_window_factory, float, d32, half>(backend, name, d32{12, 4});
    // Only the query count dynamic: the compiled KV count must agree.
    check_attention<contiguous_factory, half, head_config<dynamic, 2, 32>>(backend, name,
                                                                           head_config<dynamic, 2, 32>{6, 2});
}

/// merge: empty states weigh nothing, all-empty rows give zeros and lse -inf,
/// widely different lse; float and half outputs against the reference.
/// @tparam Backend a backend object
template <class Backend>
void check_merge(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    INFO(name << " merge");
    const float inf = std::numeric_limits<float>::infinity();
    const int states = 3, rows = 4, dim = 16;
    const auto outputs = random_rows<float>(states * rows * dim, 1.0f, 9);
    // row 0: all present; row 1: one empty; row 2: all empty; row 3: widely different lse.
    const std::vector<float> lse = {1.0f, -inf, -inf, 30.0f, 2.0f, 0.5f, -inf, -20.0f, 0.0f, 3.0f, -inf, 0.0f};
    std::vector<float> expected(rows * dim), expected_lse(rows);
    merge_params reference_call(states, rows, dim, outputs, lse, expected);
    reference_call.merged_lse = expected_lse;
    reference_backend{}.merge(reference_call);
    std::vector<float> actual(rows * dim, 7.0f), actual_lse(rows, 7.0f);
    merge_params call(states, rows, dim, outputs, lse, actual);
    call.merged_lse = actual_lse;
    backend.merge(call);
    std::vector<half> narrow(rows * dim, half(7.0f));
    backend.merge(merge_params(states, rows, dim, outputs, lse, narrow));  // no merged_lse: not written
    for (int i = 0; i < rows * dim; ++i) {
        CHECK_FALSE(std::isnan(actual[i]));
        CHECK(actual[i] == doctest::Approx(expected[i]).epsilon(1e-5));
        CHECK(std::fabs(to_float(narrow[i]) - expected[i]) <= 1e-3f);  // binary16: half an ulp at 1 is 4.9e-4
    }
    for (int r : {0, 1, 3}) CHECK(actual_lse[r] == doctest::Approx(expected_lse[r]).epsilon(1e-6));
    CHECK(actual_lse[2] == -inf);
    CHECK(expected_lse[2] == -inf);
    CHECK(actual[2 * dim] == 0.0f);
}

/// A zero-length sequence next to a normal one: zeros and lse -inf, the other untouched.
/// @tparam Backend a backend object
template <class Backend>
void check_empty_sequences(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    INFO(name << " empty sequences");
    using heads = head_config<4, 2, 16>;
    context_case c{"empty", {0, 7}, 0, 0, 16, {0, 7}, {}};
    auto cache = contiguous_factory::make<half, heads>(c, 1);
    fill_cache(cache->view(), 2);
    const auto queries = random_rows<half>(7 * heads::query_heads() * heads::head_dim, 3.0f, 3);
    const std::vector<half> decode_queries(queries.begin(), queries.begin() + 2 * heads::query_heads() * heads::head_dim);
    std::vector<half> outputs(decode_queries.size(), half(5.0f));
    std::vector<float> lse(2 * heads::query_heads(), 5.0f);
    decode_params decode(cache->view(), decode_queries, outputs);
    decode.lse = lse;
    backend.decode(decode);
    compare(outputs, lse, reference_backend{}.decode_exact(decode), "decode with an empty sequence");
    CHECK(std::isinf(lse[0]));
    CHECK(to_float(outputs[0]) == 0.0f);
    const std::vector<int> offsets = {0, 0, 7};
    std::vector<half> prefill_outputs(queries.size());
    std::vector<float> prefill_lse(7 * heads::query_heads());
    prefill_params prefill(cache->view(), queries, offsets, prefill_outputs);
    prefill.lse = prefill_lse;
    backend.prefill(prefill);
    compare(prefill_outputs, prefill_lse, reference_backend{}.prefill_exact(prefill), "prefill next to an empty sequence");
}

/// Decode with every split count (and more splits than keys) against the reference.
/// @tparam Backend a backend object
template <class Backend>
void check_split_counts(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    using heads = head_config<8, 2, 32>;
    context_case c{"long", {700, 3}, 0, 0, 16, {1, 1}, {}};
    auto cache = paged_factory::make<half, heads>(c, 3);
    fill_cache(cache->view(), 4);
    const auto queries = random_rows<float>(2 * heads::query_heads() * heads::head_dim, 3.0f, 5);
    std::vector<float> outputs(queries.size()), lse(2 * heads::query_heads());
    decode_params call(cache->view(), queries, outputs);
    call.lse = lse;
    const auto expected = reference_backend{}.decode_exact(call);
    for (int splits : {0, 1, 2, 5, 32}) {  // 32: the most allowed, most past the keys of the short sequence
        call.options.kv_splits = splits;
        backend.decode(call);
        compare(outputs, lse, expected, name + " splits " + std::to_string(splits));
    }
}

/// Cascade attention over step plans: requests that share one prefix attend
/// to it once for the whole batch (one prefill of every request's query
/// rows, placed past the prefix) and to their own suffixes separately
/// (decode over a batch of suffix sequences); merge() of the two states
/// equals plain decode over prefix + suffix. Three plans coexist: the
/// prefix's, the suffixes' and the full sequences'.
/// @tparam Element the cache's element type
/// @tparam Backend a backend object
template <class Element, class Backend>
void check_cascade(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    using heads = head_config<8, 2, 32>;
    constexpr int dim = heads::head_dim, row = heads::kv_heads() * dim;
    INFO(name << " cascade attention, " << kvcache::element_name<Element>());
    paged_cache<Element, heads> cache(1, 64, 16);
    const int prefix_length = 40;
    const std::vector<int> suffix_lengths = {1, 9, 16, 23};
    const int requests = static_cast<int>(suffix_lengths.size());

    const sequence_id prefix = cache.add_sequence();
    {
        auto plan = cache.plan({prefix}, {prefix_length});
        const auto keys = random_rows<float>(std::size_t(prefix_length) * row, 1.0f, 21);
        const auto values = random_rows<float>(keys.size(), 1.0f, 22);
        backend.append(append_params(plan.view(0), keys, values, plan.new_token_offsets()));
    }
    std::vector<sequence_id> full, suffix;
    for (int r = 0; r < requests; ++r) {
        full.push_back(cache.fork(prefix));
        suffix.push_back(cache.add_sequence());
    }
    auto full_plan = cache.plan(full, suffix_lengths);
    auto suffix_plan = cache.plan(suffix, suffix_lengths);
    const auto keys = random_rows<float>(std::size_t(suffix_plan.total_new_tokens()) * row, 1.0f, 23);
    const auto values = random_rows<float>(keys.size(), 1.0f, 24);
    backend.append(append_params(full_plan.view(0), keys, values, full_plan.new_token_offsets()));
    backend.append(append_params(suffix_plan.view(0), keys, values, suffix_plan.new_token_offsets()));
    CHECK(full_plan.first_new_position(2) == prefix_length);
    CHECK(suffix_plan.first_new_position(2) == 0);

    const std::size_t rows = std::size_t(requests) * heads::query_heads();
    const auto queries = random_rows<float>(rows * dim, 3.0f, 25);
    std::vector<float> plain(rows * dim), plain_lse(rows);
    decode_params plain_call(full_plan.view(0), queries, plain);
    plain_call.lse = plain_lse;
    backend.decode(plain_call);

    // Level 0: every request's query rows are query tokens of the one prefix sequence.
    std::vector<float> states(2 * rows * dim), state_lse(2 * rows);
    auto prefix_plan = cache.plan({prefix});
    const std::vector<int> prefix_offsets = {0, requests};
    const std::vector<int> past_prefix(requests, prefix_length);
    prefill_params shared(prefix_plan.view(0), queries, prefix_offsets, span<float>(states.data(), rows * dim));
    shared.lse = span<float>(state_lse.data(), rows);
    shared.query_positions = past_prefix;
    backend.prefill(shared);
    // Level 1: each request's own suffix.
    decode_params own(suffix_plan.view(0), queries, span<float>(states.data() + rows * dim, rows * dim));
    own.lse = span<float>(state_lse.data() + rows, rows);
    backend.decode(own);
    std::vector<float> merged(rows * dim), merged_lse(rows);
    merge_params levels(2, int(rows), dim, states, state_lse, merged);
    levels.merged_lse = merged_lse;
    backend.merge(levels);

    compare(merged, merged_lse, reference_backend{}.decode_exact(plain_call), "cascade against the reference");
    double worst = 0.0;
    for (std::size_t i = 0; i < merged.size(); ++i) worst = std::max(worst, double(std::fabs(merged[i] - plain[i])));
    INFO("largest difference between cascade and plain attention " << worst);
    CHECK(worst <= 2 * output_tolerance<float>());
}

/// The mask as a call option over layouts that keep every position: a paged
/// and a contiguous cache attended with attention_options.window and sinks
/// equal the reference over a layout whose own visibility is that window
/// (the scatter layout keeping every row), holding the same rows. A sliding
/// window cache refuses options naming another window than its own.
/// @tparam Backend a backend object
template <class Backend>
void check_window_mask(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    using heads = head_config<8, 2, 32>;
    const std::vector<int> lengths = {150, 61};
    const int window = 40, sinks = 3;
    scatter_cache<half, heads> oracle(lengths, window, sinks, 8, 5, /*drop_outside_window=*/false);
    fill_cache(oracle.view(), 7);
    const context_case everything{"all", lengths, 0, 0, 16, {30, 61}, {}};
    const auto paged = paged_factory::make<half, heads>(everything, 9);
    const auto contiguous = contiguous_factory::make<half, heads>(everything, 9);
    fill_cache(paged->view(), 7);
    fill_cache(contiguous->view(), 7);
    const reference_backend reference;
    const auto queries = random_rows<half>(std::size_t(91) * heads::query_heads() * heads::head_dim, 3.0f, 11);
    const std::vector<int> offsets = {0, 30, 91};
    auto check = [&](const auto& view, const char* layout) {
        INFO(name << " " << std::string(layout) << " cache with a window mask of " << window << " and " << sinks << " sinks");
        std::vector<half> outputs(queries.size());
        std::vector<float> lse(91 * heads::query_heads());
        prefill_params call(view, queries, offsets, outputs);
        call.lse = lse;
        call.options.window = window;
        call.options.sinks = sinks;
        backend.prefill(call);
        compare(outputs, lse, reference.prefill_exact(prefill_params(oracle.view(), queries, offsets, outputs)),
                "prefill");
        const std::vector<half> decode_queries(queries.begin(), queries.begin() + 2 * heads::query_heads() * heads::head_dim);
        std::vector<half> decode_outputs(decode_queries.size());
        std::vector<float> decode_lse(2 * heads::query_heads());
        decode_params decode(view, decode_queries, decode_outputs);
        decode.lse = decode_lse;
        decode.options.window = window;
        decode.options.sinks = sinks;
        decode.options.kv_splits = 3;
        backend.decode(decode);
        compare(decode_outputs, decode_lse,
                reference.decode_exact(decode_params(oracle.view(), decode_queries, decode_outputs)), "decode");
    };
    check(paged->view(), "paged");
    check(contiguous->view(), "contiguous");

    const context_case windowed{"windowed", lengths, window, sinks, 16, {1, 1}, {}};
    const auto ring = sliding_window_factory::make<half, heads>(windowed, 3);
    std::vector<half> outputs(2 * heads::query_heads() * heads::head_dim);
    const std::vector<half> ring_queries(outputs.size());
    decode_params own(ring->view(), ring_queries, outputs);
    own.options.window = window;
    own.options.sinks = sinks;
    CHECK_NOTHROW(backend.decode(own));  // the same window: accepted
    own.options.window = window + 1;
    CHECK_THROWS_AS(backend.decode(own), kvcache::error);
}

/// bfloat16 caches: the GQA suite in every layout, MHA and MQA in one each,
/// float queries and float or half rows into a bfloat16 cache, dynamic
/// counts, cascade, and merge into bfloat16 outputs.
/// @tparam Backend a backend object
template <class Backend>
void check_bfloat16(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    check_attention<scatter_factory, bfloat16, suite_gqa>(backend, name);
    check_attention<contiguous_factory, bfloat16, suite_mqa>(backend, name);
    check_attention<paged_factory, bfloat16, suite_gqa>(backend, name);
    check_attention<sliding_window_factory, bfloat16, suite_mha>(backend, name);
    check_append<paged_factory, bfloat16, suite_gqa>(backend, name);
    check_append<sliding_window_factory, bfloat16, head_config<5, 1, 56>, float>(backend, name);
    check_append<contiguous_factory, bfloat16, suite_mqa, half>(backend, name);
    check_attention<paged_factory, bfloat16, head_config<4, 2, 32>, float>(backend, name);  // bf16 cache, fp32 queries
    check_attention<paged_factory, bfloat16, dynamic_heads<32>>(backend, name, dynamic_heads<32>{9, 1});
    check_cascade<bfloat16>(backend, name);
    INFO(name << " merge into bfloat16");
    const int states = 2, rows = 3, dim = 16;
    const auto outputs = random_rows<float>(states * rows * dim, 1.0f, 19);
    const std::vector<float> lse = {0.5f, 2.0f, -1.0f, 1.5f, -3.0f, 4.0f};
    std::vector<float> expected(rows * dim);
    reference_backend{}.merge(merge_params(states, rows, dim, outputs, lse, expected));
    std::vector<bfloat16> narrow(rows * dim, bfloat16(7.0f));
    backend.merge(merge_params(states, rows, dim, outputs, lse, narrow));
    backend.synchronize();
    for (int i = 0; i < rows * dim; ++i) CHECK(std::fabs(to_float(narrow[i]) - expected[i]) <= output_tolerance<bfloat16>());
}

/// fp8 caches of one encoding with scales (scaled_factory): decode and prefill
/// in every layout (MHA, GQA, MQA, dynamic counts; float and half queries),
/// append from float and half rows in every layout, bit for bit against the
/// reference's append. Outputs are held to the queries' type's tolerance: the
/// stored bytes widen exactly, so the only error beyond fp32 attention is one
/// fp32 rounding of the folded key scale and one of the value scale.
/// @tparam Element float8_e4m3 or float8_e5m2
/// @tparam Backend a backend object
template <class Element, class Backend>
void check_fp8(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    check_attention<scaled_factory<scatter_factory>, Element, suite_gqa, float>(backend, name);
    check_attention<scaled_factory<contiguous_factory>, Element, suite_mqa, half>(backend, name);
    check_attention<scaled_factory<paged_factory>, Element, suite_gqa, float>(backend, name);
    check_attention<scaled_factory<sliding_window_factory>, Element, suite_mha, float>(backend, name);
    check_attention<scaled_factory<paged_factory>, Element, dynamic_heads<32>, bfloat16>(backend, name,
                                                                                         dynamic_heads<32>{9, 1});
    check_append<scaled_factory<scatter_factory>, Element, suite_gqa, float>(backend, name);
    check_append<scaled_factory<contiguous_factory>, Element, suite_mqa, half>(backend, name);
    check_append<scaled_factory<paged_factory>, Element, suite_gqa, float>(backend, name);
    check_append<scaled_factory<sliding_window_factory>, Element, head_config<5, 1, 56>, float>(backend, name);
}

/// Everything above, for a backend fast enough to run the whole matrix.
/// @tparam Backend a backend object
template <class Backend>
void run_backend_suite(const Backend& backend, const std::string& name) {
    using namespace kvcache;
    check_layout<scatter_factory, float>(backend, name);
    check_layout<scatter_factory, half>(backend, name);
    check_layout<contiguous_factory, float>(backend, name);
    check_layout<contiguous_factory, half>(backend, name);
    check_layout<paged_factory, float>(backend, name);
    check_layout<paged_factory, half>(backend, name);
    check_layout<sliding_window_factory, float>(backend, name);
    check_layout<sliding_window_factory, half>(backend, name);
    check_odd_shapes(backend, name);
    check_merge(backend, name);
    check_empty_sequences(backend, name);
    check_split_counts(backend, name);
    check_cascade<float>(backend, name);
    check_cascade<half>(backend, name);
    check_window_mask(backend, name);
    check_bfloat16(backend, name);
    check_fp8<float8_e4m3>(backend, name);
    check_fp8<float8_e5m2>(backend, name);
}

}  // namespace kvcache_test
