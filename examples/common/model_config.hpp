// The architecture of a Llama-family decoder: everything the forward pass
// needs to know about shapes, normalisation and rotary embedding.
#pragma once

#include <string>

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
    }

    /// "4 layers, hidden 256, 8q/2kv/d32, ffn 688, vocab 1024"
    std::string describe() const {
        return detail::concat(num_layers, " layers, hidden ", hidden_size, ", ", heads().to_string(), ", ffn ",
                              intermediate_size, ", vocab ", vocab_size);
    }
};

}  // namespace kvcache::examples
