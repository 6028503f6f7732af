// The architecture of a Llama-family decoder: everything the forward pass
// needs to know about shapes, normalisation and rotary embedding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/heads.hpp"

namespace kvcache::examples {

/// How rotary frequencies are rescaled for long contexts.
struct rope_scaling {
    enum class kind { none, linear, llama3 };
    kind type = kind::none;
    double factor = 1.0;                        ///< linear and llama3
    double low_freq_factor = 1.0;               ///< llama3
    double high_freq_factor = 4.0;              ///< llama3
    int original_max_position_embeddings = 8192;  ///< llama3
};

/// Bounds on sizes derived from config fields. Each field is bounded alone when parsed; these
/// bound the products, which the forward pass uses as int widths and as buffer sizes.
struct model_limits {
    static constexpr std::int64_t max_width = std::int64_t(1) << 24;            ///< q_width, kv_width
    static constexpr std::int64_t max_tensor_elements = std::int64_t(1) << 36;  ///< any one weight tensor
    static constexpr std::int64_t max_parameters = std::int64_t(1) << 40;       ///< all weights together
};

/// Shapes and constants of a Llama-architecture decoder (Llama, Mistral, Qwen2 checkpoints).
struct model_config {
    std::string model_type = "llama";
    int vocab_size = 0;
    int hidden_size = 0;
    int num_layers = 0;
    int num_query_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    int intermediate_size = 0;
    float rms_norm_eps = 1e-5f;
    double rope_theta = 10000.0;
    rope_scaling scaling;
    bool tie_word_embeddings = false;
    bool attention_bias = false;  ///< q/k/v projections carry a bias (Qwen2; Llama with attention_bias)
    bool output_bias = false;     ///< o_proj carries a bias (Llama with attention_bias, not Qwen2)
    int max_position_embeddings = 0;  ///< 0: unknown, not enforced
    /// Per layer, how many recent keys (the query's own included) the model attends to; 0: all.
    /// Empty: every layer attends to all. Hugging Face windows only some layers of Qwen2.
    std::vector<int> layer_window;

    /// Per layer, the key and value scales of an fp8 cache (a checkpoint's k_scale and
    /// v_scale tensors, vLLM's convention). Empty: 1 and 1 in every layer.
    std::vector<kv_scales> cache_scales;

    /// The fp8 cache scales of one layer (1 and 1 when the checkpoint gives none).
    kv_scales scales_of(int layer) const noexcept {
        return cache_scales.empty() ? kv_scales{} : cache_scales[static_cast<std::size_t>(layer)];
    }

    /// The window of one layer (0: full attention).
    int window_of(int layer) const noexcept {
        return layer_window.empty() ? 0 : layer_window[static_cast<std::size_t>(layer)];
    }

    int q_width() const noexcept { return num_query_heads * head_dim; }
    int kv_width() const noexcept { return num_kv_heads * head_dim; }

    /// The attention heads as kvcache's runtime head shape.
    head_shape heads() const noexcept { return head_shape{num_query_heads, num_kv_heads, head_dim}; }

    /// Throws kvcache::error naming the first field out of range.
    void validate() const {
        auto positive = [](int value, const char* field) {
            require(value > 0, error_code::invalid_argument, "model config: ", field, " = ", value, " must be positive");
        };
        positive(vocab_size, "vocab_size");
        positive(hidden_size, "hidden_size");
        positive(num_layers, "num_hidden_layers");
        positive(num_query_heads, "num_attention_heads");
        positive(num_kv_heads, "num_key_value_heads");
        positive(head_dim, "head_dim");
        positive(intermediate_size, "intermediate_size");
        require(num_query_heads % num_kv_heads == 0, error_code::invalid_argument, "model config: num_attention_heads = ",
                num_query_heads, " is not a multiple of num_key_value_heads = ", num_kv_heads);
        require(head_dim % 2 == 0, error_code::invalid_argument, "model config: head_dim = ", head_dim,
                " must be even for rotary embedding");
        require(rms_norm_eps > 0.0f, error_code::invalid_argument, "model config: rms_norm_eps = ", rms_norm_eps,
                " must be positive");
        require(rope_theta > 0.0, error_code::invalid_argument, "model config: rope_theta = ", rope_theta,
                " must be positive");
        require(layer_window.empty() || layer_window.size() == static_cast<std::size_t>(num_layers),
                error_code::invalid_argument, "model config: ", layer_window.size(),
                " per-layer windows for num_hidden_layers = ", num_layers);
        for (std::size_t l = 0; l < layer_window.size(); ++l)
            require(layer_window[l] >= 0, error_code::invalid_argument, "model config: the window of layer ", l, " = ",
                    layer_window[l], " must not be negative");
        validate_sizes();
    }

    /// Throws kvcache::error naming the fields whose product or sum passes a model_limits bound.
    void validate_sizes() const {
        // Operands are positive (validate() checked them) and each already within its bound, so
        // a <= limit / b decides a * b <= limit without computing an overflowing product.
        auto product = [](std::int64_t a, std::int64_t b, std::int64_t limit, const char* what, const char* limit_name) {
            require(a <= limit / b, error_code::invalid_argument, "model config: ", what, " = ", a, " * ", b, " = ",
                    static_cast<unsigned long long>(a) * static_cast<unsigned long long>(b), " exceeds the limit ",
                    limit, " (", limit_name, ")");
            return a * b;
        };
        using L = model_limits;
        const std::int64_t q = product(num_query_heads, head_dim, L::max_width, "num_attention_heads * head_dim", "q_width");
        const std::int64_t kv =
            product(num_kv_heads, head_dim, L::max_width, "num_key_value_heads * head_dim", "kv_width");
        const std::int64_t hidden = hidden_size, ffn = intermediate_size;
        const std::int64_t embedding =
            product(vocab_size, hidden, L::max_tensor_elements, "vocab_size * hidden_size", "elements of one tensor");
        const std::int64_t wq = product(q, hidden, L::max_tensor_elements, "num_attention_heads * head_dim * hidden_size",
                                        "elements of one tensor");
        const std::int64_t wk = product(kv, hidden, L::max_tensor_elements,
                                        "num_key_value_heads * head_dim * hidden_size", "elements of one tensor");
        const std::int64_t mlp = product(ffn, hidden, L::max_tensor_elements, "intermediate_size * hidden_size",
                                         "elements of one tensor");
        // Each term is at most 2^36, so the sum of a dozen stays far inside int64.
        const std::int64_t per_layer = 2 * hidden + 2 * wq + 2 * wk + 3 * mlp + q + 2 * kv + hidden;
        const std::int64_t outside_layers = 2 * embedding + hidden;
        require(per_layer <= (L::max_parameters - outside_layers) / num_layers, error_code::invalid_argument,
                "model config: num_hidden_layers = ", num_layers, " layers of ", per_layer,
                " parameters each (from hidden_size, num_attention_heads, num_key_value_heads, head_dim and "
                "intermediate_size) exceed the limit of ", L::max_parameters, " parameters in all");
    }

    /// "4 layers, hidden 256, 8q/2kv/d32, ffn 688, vocab 1024"
    std::string describe() const {
        return detail::concat(num_layers, " layers, hidden ", hidden_size, ", ", heads().to_string(), ", ffn ",
                              intermediate_size, ", vocab ", vocab_size);
    }
};

}  // namespace kvcache::examples
