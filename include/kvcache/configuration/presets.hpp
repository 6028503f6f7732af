// Head configurations of common models, and the configuration lists built
// from them. A user picks what is compiled by naming a list (these, or their
// own made with configuration_product_t).
#pragma once

#include <string>
#include <vector>

#include "kvcache/configuration/configuration.hpp"
#include "kvcache/core/heads.hpp"

namespace kvcache {
namespace presets {

/// Llama-3-8B: 32 query heads, 8 KV heads (GQA group 4), head dim 128.
struct llama3_8b {
    static constexpr const char* name = "llama3_8b";
    using heads = head_config<32, 8, 128>;
    static constexpr int window = 0;  ///< 0: full attention
};

/// Llama-2-7B: multi-head attention, 32/32/128.
struct llama2_7b {
    static constexpr const char* name = "llama2_7b";
    using heads = head_config<32, 32, 128>;
    static constexpr int window = 0;
};

/// Mistral-7B: 32/8/128 with a sliding window of 4096 (a runtime value of
/// the sliding-window view, so it shares Llama-3-8B's instantiations).
struct mistral_7b {
    static constexpr const char* name = "mistral_7b";
    using heads = head_config<32, 8, 128>;
    static constexpr int window = 4096;
};

/// Qwen2.5-7B: 28 query heads, 4 KV heads (GQA group 7), head dim 128.
struct qwen2_5_7b {
    static constexpr const char* name = "qwen2_5_7b";
    using heads = head_config<28, 4, 128>;
    static constexpr int window = 0;
};

/// A small model for tests and examples: 8 query heads, 2 KV heads, head dim 64.
struct test_model {
    static constexpr const char* name = "test_model";
    using heads = head_config<8, 2, 64>;
    static constexpr int window = 0;
};

/// Every preset.
using all = type_list<llama3_8b, llama2_7b, mistral_7b, qwen2_5_7b, test_model>;

/// A preset as runtime values.
struct model_preset {
    std::string name;
    head_shape heads;
    int window = 0;
};

/// The runtime descriptions of every preset, e.g. for --model options.
inline std::vector<model_preset> list() {
    std::vector<model_preset> result;
    const auto add = [&](auto preset) {
        using p = decltype(preset);
        result.push_back({p::name, shape_of<typename p::heads>(), p::window});
    };
    add(llama3_8b{});
    add(llama2_7b{});
    add(mistral_7b{});
    add(qwen2_5_7b{});
    add(test_model{});
    return result;
}

/// The preset of a name; throws error_code::not_found listing the known names.
inline model_preset find(const std::string& name) {
    std::string known;
    for (const model_preset& preset : list()) {
        if (preset.name == name) return preset;
        known += (known.empty() ? "" : ", ") + preset.name;
    }
    throw_error(error_code::not_found, "no model preset named '", name, "'; known: ", known);
}

/// The distinct head configurations of the presets.
using preset_heads = type_list<llama3_8b::heads, llama2_7b::heads, qwen2_5_7b::heads, test_model::heads>;

}  // namespace presets

/// Every layout x element type x preset head configuration (36 configurations).
using preset_configurations = configuration_product_t<all_layouts, all_elements, presets::preset_heads>;

/// Dynamic head counts in every layout and element type, fp8, int8, int4 and
/// the K/V pairs of kv_element_pairs included, for the usual head dimensions
/// (dynamic_head_dims): 150 configurations that run any model of those
/// dimensions, through a generic instantiation per dimension.
using dynamic_configurations = configuration_product_t<all_layouts, cache_element_choices, dynamic_head_dims>;

/// The presets compiled for their head counts, and every other shape of the
/// usual head dimensions through dynamic_configurations: what an engine that
/// loads arbitrary checkpoints dispatches over.
using default_configurations = concat_t<preset_configurations, dynamic_configurations>;

/// The small list kvcache's own tests compile for the GPU: MHA, GQA group 4
/// (the test model), MQA, group 5 with head dim 56, and dynamic counts of head
/// dim 32 (the generic kernels), in every layout for fp32 and fp16; bfloat16,
/// which differs from fp16 only in its conversions, on one shape per layout;
/// fp8, which differs in its conversions and scales, on one shape per encoding;
/// K/V pairs (keys and values in two types) on one shape each.
using test_configurations = concat_t<
    configuration_product_t<all_layouts, type_list<float, half>,
                            type_list<head_config<4, 4, 32>, presets::test_model::heads, head_config<4, 1, 32>,
                                      head_config<5, 1, 56>, dynamic_heads<32>>>,
    type_list<configuration<contiguous_layout, bfloat16, dynamic_heads<32>>,
              configuration<paged_layout, bfloat16, presets::test_model::heads>,
              configuration<sliding_window_layout, bfloat16, head_config<4, 1, 32>>,
              configuration<paged_layout, float8_e4m3, presets::test_model::heads>,
              configuration<sliding_window_layout, float8_e5m2, dynamic_heads<32>>,
              configuration<paged_layout, kv_elements<half, qint4>, presets::test_model::heads>,
              configuration<contiguous_layout, kv_elements<qint8, qint4>, dynamic_heads<32>>>>;

}  // namespace kvcache
