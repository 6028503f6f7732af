// Options every attention kernel and backend honours.
#pragma once

#include <cmath>

#include "kvcache/core/config.hpp"

namespace kvcache {

/// Per-call attention options: the score variant (scale, soft cap) and the
/// mask beyond causality. A query at position q sees a present key at p <= q;
/// with window W > 0 only when p > q - W or p < sinks (the first positions,
/// attention sinks). The mask applies to any layout: a paged or contiguous
/// cache serving a sliding-window model reads only what the window allows.
/// A sliding_window_cache applies its own window; options that name a
/// different one are refused, so a cache and its kernels cannot disagree.
struct attention_options {
    float softmax_scale = 0.0f;    ///< 0 means 1/sqrt(head_dim)
    float logits_soft_cap = 0.0f;  ///< 0 means off; else logits = cap * tanh(logits / cap)
    int kv_splits = 0;             ///< decode only: key/value splits per (sequence, KV head); 0 = backend's choice
    int window = 0;                ///< keys newer than query - window are seen (plus sinks); 0: all
    int sinks = 0;                 ///< with a window: the first positions every query also sees
};

/// The softmax scale a call uses: the option, or 1/sqrt(head_dim) when it is 0.
KVCACHE_HOST_DEVICE inline float resolved_softmax_scale(const attention_options& options, int head_dim) {
    return options.softmax_scale != 0.0f ? options.softmax_scale : 1.0f / ::sqrtf(static_cast<float>(head_dim));
}

}  // namespace kvcache
