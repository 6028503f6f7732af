// Options every attention kernel and backend honours.
#pragma once

#include <cmath>

#include "kvcache/core/config.hpp"

namespace kvcache {

/// Per-call attention options. Visibility (window, sinks) comes from the
/// layout view, not from here, so a cache and its kernels cannot disagree.
struct attention_options {
    float softmax_scale = 0.0f;    ///< 0 means 1/sqrt(head_dim)
    float logits_soft_cap = 0.0f;  ///< 0 means off; else logits = cap * tanh(logits / cap)
    int kv_splits = 0;             ///< decode only: key/value splits per (sequence, KV head); 0 = backend's choice
};

/// The softmax scale a call uses: the option, or 1/sqrt(head_dim) when it is 0.
KVCACHE_HOST_DEVICE inline float resolved_softmax_scale(const attention_options& options, int head_dim) {
    return options.softmax_scale != 0.0f ? options.softmax_scale : 1.0f / ::sqrtf(static_cast<float>(head_dim));
}

}  // namespace kvcache
