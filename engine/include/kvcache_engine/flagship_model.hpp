// The small Llama-architecture model the CPU examples (02_generate, 03_chat,
// 05_streaming) and the generation benchmark run: one definition, so they cannot drift.
#pragma once

#include "kvcache/core/heads.hpp"
#include "kvcache_engine/model_config.hpp"

namespace kvcache::examples {

/// The flagship model's head shape (compile-time for kvcache's views).
using flagship_heads = head_config<8, 2, 32>;

/// The flagship example's model: a small Llama-architecture decoder with flagship_heads.
inline model_config flagship_config(int layers = 4) {
    model_config c;
    c.model_type = "llama";
    c.vocab_size = 2048;
    c.hidden_size = 256;
    c.num_layers = layers;
    c.num_query_heads = flagship_heads::query_heads();
    c.num_kv_heads = flagship_heads::kv_heads();
    c.head_dim = flagship_heads::head_dim;
    c.intermediate_size = 768;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0;
    return c;
}

}  // namespace kvcache::examples
