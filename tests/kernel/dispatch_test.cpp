// The runtime dispatcher and the presets.
#include <doctest/doctest.h>

#include <string>
#include <type_traits>

#include "kvcache/configuration/dispatch.hpp"
#include "kvcache/configuration/presets.hpp"
#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/paged_cache.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

using namespace kvcache;

TEST_CASE("configuration products enumerate layouts x elements x heads, layouts outermost") {
    static_assert(preset_configurations::size == 36);
    static_assert(test_configurations::size == 37);
    static_assert(dynamic_configurations::size == 150);  // 3 layouts x (7 storage types + 3 K/V pairs) x 5 head dims
    using list = configuration_product_t<type_list<paged_layout>, all_elements, type_list<head_config<4, 2, 8>>>;
    static_assert(std::is_same_v<list, type_list<configuration<paged_layout, float, head_config<4, 2, 8>>,
                                                 configuration<paged_layout, half, head_config<4, 2, 8>>,
                                                 configuration<paged_layout, bfloat16, head_config<4, 2, 8>>>>);
    CHECK(describe(list{}) == "paged/fp32/4q/2kv/d8, paged/fp16/4q/2kv/d8, paged/bf16/4q/2kv/d8");
}

TEST_CASE("dispatch calls the function with the matching compile-time configuration") {
    const runtime_configuration wanted{layout_kind::paged, element_kind::fp16, {32, 8, 128}};
    const std::string chosen = dispatch(preset_configurations{}, wanted, [](auto config) {
        using c = decltype(config);
        static_assert(std::is_same_v<typename c::view, typename c::layout::template view<typename c::element, typename c::heads>>);
        return runtime_of<c>().to_string() + (std::is_same_v<typename c::view, paged_view<half, head_config<32, 8, 128>>> ? " ok" : " wrong");
    });
    CHECK(chosen == "paged/fp16/32q/8kv/d128 ok");

    int calls = 0;
    dispatch(preset_configurations{}, {layout_kind::sliding_window, element_kind::fp32, {28, 4, 128}}, [&](auto config) {
        calls += std::is_same_v<typename decltype(config)::view, sliding_window_view<float, head_config<28, 4, 128>>>;
    });
    CHECK(calls == 1);
    CHECK(supports(preset_configurations{}, {layout_kind::contiguous, element_kind::fp32, {8, 2, 64}}));
    CHECK_FALSE(supports(preset_configurations{}, {layout_kind::contiguous, element_kind::fp32, {8, 2, 96}}));
}

TEST_CASE("an unsupported configuration is an error listing every supported one") {
    const runtime_configuration wanted{layout_kind::paged, element_kind::fp16, {40, 8, 128}};
    try {
        dispatch(preset_configurations{}, wanted, [](auto) {});
        FAIL("dispatch accepted an unsupported configuration");
    } catch (const error& e) {
        CHECK(e.code() == error_code::unsupported_configuration);
        const std::string message = e.what();
        CHECK(message.find("paged/fp16/40q/8kv/d128") != std::string::npos);
        for (const char* expected : {"contiguous/fp32/32q/8kv/d128", "paged/fp16/32q/32kv/d128",
                                     "sliding_window/fp16/28q/4kv/d128", "sliding_window/fp32/8q/2kv/d64"})
            CHECK_MESSAGE(message.find(expected) != std::string::npos, expected);
        CHECK(message.find(describe(preset_configurations{})) != std::string::npos);
    }
}

TEST_CASE("presets carry the published head configurations") {
    const auto mistral = presets::find("mistral_7b");
    CHECK(mistral.heads == head_shape{32, 8, 128});
    CHECK(mistral.window == 4096);
    CHECK(presets::find("llama3_8b").heads == head_shape{32, 8, 128});
    CHECK(presets::find("llama2_7b").heads == head_shape{32, 32, 128});
    CHECK(presets::find("qwen2_5_7b").heads.group_size() == 7);
    CHECK(presets::find("test_model").heads == head_shape{8, 2, 64});
    CHECK(presets::list().size() == 5);
    CHECK_THROWS_WITH_AS(presets::find("gpt2"), doctest::Contains("llama3_8b"), error);
}

TEST_CASE("dispatch prefers the compiled head counts and falls back to dynamic ones of the same head dimension") {
    const auto chosen = [](runtime_configuration wanted) {
        return dispatch(default_configurations{}, wanted, [](auto config) {
            using c = decltype(config);
            return name_of<c>() + " running " + shape_of(config.head_counts()).to_string();
        });
    };
    CHECK(chosen({layout_kind::paged, element_kind::fp16, {32, 8, 128}}) == "paged/fp16/32q/8kv/d128 running 32q/8kv/d128");
    // Phi-3-mini and Gemma-2-2B: nothing compiled for their counts, so the dynamic configurations run them.
    CHECK(chosen({layout_kind::paged, element_kind::fp16, {32, 32, 96}}) == "paged/fp16/dynamicq/dynamickv/d96 running 32q/32kv/d96");
    CHECK(chosen({layout_kind::sliding_window, element_kind::fp32, {8, 4, 256}}) ==
          "sliding_window/fp32/dynamicq/dynamickv/d256 running 8q/4kv/d256");
    CHECK(chosen({layout_kind::contiguous, element_kind::bf16, {32, 8, 128}}) ==
          "contiguous/bf16/32q/8kv/d128 running 32q/8kv/d128");
    CHECK(chosen({layout_kind::paged, element_kind::bf16, {16, 2, 64}}) == "paged/bf16/dynamicq/dynamickv/d64 running 16q/2kv/d64");
    // fp8 caches: every layout and encoding through the dynamic counts, the preset shapes included.
    CHECK(chosen({layout_kind::paged, element_kind::fp8_e4m3, {32, 8, 128}}) ==
          "paged/fp8_e4m3/dynamicq/dynamickv/d128 running 32q/8kv/d128");
    CHECK(chosen({layout_kind::sliding_window, element_kind::fp8_e5m2, {16, 2, 64}}) ==
          "sliding_window/fp8_e5m2/dynamicq/dynamickv/d64 running 16q/2kv/d64");
    CHECK_FALSE(compiled_for(default_configurations{}, {layout_kind::paged, element_kind::fp8_e4m3, {32, 8, 128}}));
    CHECK(compiled_for(default_configurations{}, {layout_kind::paged, element_kind::fp16, {28, 4, 128}}));
    CHECK_FALSE(compiled_for(default_configurations{}, {layout_kind::paged, element_kind::fp16, {40, 8, 128}}));
    CHECK(supports(default_configurations{}, {layout_kind::paged, element_kind::fp16, {40, 8, 128}}));
    // A head dimension nothing covers is still refused, with the list.
    CHECK_THROWS_WITH_AS(chosen({layout_kind::paged, element_kind::fp16, {8, 8, 72}}),
                         doctest::Contains("paged/fp16/dynamicq/dynamickv/d96"), error);
    // A shape that breaks the rules is refused before any configuration is tried.
    CHECK_THROWS_WITH_AS(chosen({layout_kind::paged, element_kind::fp16, {30, 8, 128}}),
                         doctest::Contains("query_heads = 30 is not a multiple of kv_heads = 8"), error);
}

TEST_CASE("a dispatched dynamic configuration builds a cache and attends like the reference") {
    // Phi-3-mini's head shape at a test's size: 32 query heads would be slow here, the group is what matters.
    const runtime_configuration wanted{layout_kind::paged, element_kind::fp32, {6, 2, 64}};
    const double error = dispatch(default_configurations{}, wanted, [](auto config) {
        using c = decltype(config);
        if (c::heads::static_counts) return -1.0;  // 6q/2kv/d64 is not a preset: a dynamic configuration must run it
        paged_cache<typename c::element, typename c::heads> cache(config.head_counts(), 1, 16, 4);
        const sequence_id id = cache.add_sequence();
        const int tokens = 9, row = cache.kv_heads() * c::heads::head_dim;
        std::vector<float> keys(tokens * row), values(tokens * row);
        for (int i = 0; i < tokens * row; ++i) {
            keys[i] = std::sin(0.1f * float(i));
            values[i] = std::cos(0.07f * float(i));
        }
        cache.append(id, 0, keys, values, tokens);
        auto plan = cache.plan({id});
        const auto view = plan.view(0);
        std::vector<float> queries(cache.query_heads() * c::heads::head_dim, 0.5f), outputs(queries.size());
        const decode_params call(view, queries, outputs);
        cpu_backend{}.decode(call);
        const auto exact = reference_backend{}.decode_exact(call);
        double worst = 0;
        for (std::size_t i = 0; i < outputs.size(); ++i) worst = std::max(worst, std::fabs(outputs[i] - exact.outputs[i]));
        return worst;
    });
    CHECK(error >= 0.0);
    CHECK(error < 1e-5);
}
