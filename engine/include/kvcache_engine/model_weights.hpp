// The float weights of a Llama-family decoder, and deterministic random
// weights for the self-contained examples.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvcache_engine/model_config.hpp"

namespace kvcache::examples {

/// One decoder layer. Matrices are row-major [out_features][in_features], as stored by Hugging Face.
struct layer_weights {
    std::vector<float> attention_norm;  ///< [hidden]
    std::vector<float> wq, wk, wv, wo;  ///< [q_width][hidden], [kv_width][hidden] x2, [hidden][q_width]
    std::vector<float> bq, bk, bv;      ///< empty unless config.attention_bias
    std::vector<float> bo;              ///< empty unless config.output_bias
    std::vector<float> mlp_norm;        ///< [hidden]
    std::vector<float> w_gate, w_up;    ///< [intermediate][hidden]
    std::vector<float> w_down;          ///< [hidden][intermediate]
};

/// All weights of the model.
struct model_weights {
    model_config config;
    std::vector<float> embedding;   ///< [vocab][hidden]
    std::vector<layer_weights> layers;
    std::vector<float> final_norm;  ///< [hidden]
    std::vector<float> lm_head;     ///< [vocab][hidden]; empty when tied to the embedding

    /// The output projection: lm_head, or the embedding when the two are tied.
    const float* output_matrix() const noexcept { return lm_head.empty() ? embedding.data() : lm_head.data(); }
};

/// A small deterministic generator (splitmix64) so weights are the same on every machine and compiler.
class seeded_random {
public:
    explicit seeded_random(std::uint64_t seed) : state_(seed) {}

    std::uint64_t next() noexcept {
        std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }

    /// Uniform in [-1, 1).
    float uniform() noexcept { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0); }

private:
    std::uint64_t state_;
};

namespace detail {

inline std::vector<float> random_matrix(seeded_random& random, int rows, int cols) {
    // Uniform with variance 1/cols keeps activations of order one through the layers.
    float scale = static_cast<float>(std::sqrt(3.0 / cols));
    std::vector<float> m(static_cast<std::size_t>(rows) * cols);
    for (auto& v : m) v = random.uniform() * scale;
    return m;
}

inline std::vector<float> random_norm(seeded_random& random, int width) {
    std::vector<float> w(width);
    for (auto& v : w) v = 1.0f + 0.1f * random.uniform();
    return w;
}

}  // namespace detail

/// Random weights for a config, identical for equal (config, seed).
inline model_weights make_random_weights(const model_config& config, std::uint64_t seed) {
    config.validate();
    seeded_random random(seed);
    model_weights w;
    w.config = config;
    int h = config.hidden_size;
    // A larger embedding scale than the matrices makes the logits spread out, so greedy
    // choices are decisive rather than near-ties that any rounding could flip.
    w.embedding = detail::random_matrix(random, config.vocab_size, h);
    for (auto& v : w.embedding) v *= 4.0f;
    for (int l = 0; l < config.num_layers; ++l) {
        layer_weights layer;
        layer.attention_norm = detail::random_norm(random, h);
        layer.wq = detail::random_matrix(random, config.q_width(), h);
        layer.wk = detail::random_matrix(random, config.kv_width(), h);
        layer.wv = detail::random_matrix(random, config.kv_width(), h);
        layer.wo = detail::random_matrix(random, h, config.q_width());
        if (config.attention_bias) {
            layer.bq = detail::random_matrix(random, 1, config.q_width());
            layer.bk = detail::random_matrix(random, 1, config.kv_width());
            layer.bv = detail::random_matrix(random, 1, config.kv_width());
        }
        if (config.output_bias) layer.bo = detail::random_matrix(random, 1, h);
        layer.mlp_norm = detail::random_norm(random, h);
        layer.w_gate = detail::random_matrix(random, config.intermediate_size, h);
        layer.w_up = detail::random_matrix(random, config.intermediate_size, h);
        layer.w_down = detail::random_matrix(random, h, config.intermediate_size);
        w.layers.push_back(std::move(layer));
    }
    w.final_norm = detail::random_norm(random, h);
    if (!config.tie_word_embeddings) w.lm_head = detail::random_matrix(random, config.vocab_size, h);
    return w;
}

}  // namespace kvcache::examples
