// The FP32 arithmetic shared by the kernels and the CPU backend: soft-capping,
// the terms of the online (running max, running sum) softmax, its
// log-sum-exp, and merging partial states given as (output, log-sum-exp).
// Empty states have lse = -inf and output 0; every function here keeps them
// from producing NaN.
#pragma once

#include <cmath>
#include <cstdint>

#include "kvcache/core/config.hpp"
#include "kvcache/core/half.hpp"

namespace kvcache {
namespace detail {

/// -infinity as float, usable in device code without relaxed constexpr.
KVCACHE_HOST_DEVICE inline float negative_infinity() noexcept { return bits_to_float(0xff800000u); }

/// logits -> cap * tanh(logits / cap) when cap > 0, unchanged otherwise.
KVCACHE_HOST_DEVICE inline float apply_soft_cap(float logit, float cap) noexcept {
    return cap > 0.0f ? cap * ::tanhf(logit / cap) : logit;
}

/// exp(a - b) that is 0 when a is -inf, even when b is -inf too (an empty
/// state must weigh nothing instead of giving exp(NaN)).
KVCACHE_HOST_DEVICE inline float exp_difference(float a, float b) noexcept {
    return a == negative_infinity() ? 0.0f : ::expf(a - b);
}

/// Natural log of sum_i exp(logit_i), given the largest logit and the sum
/// of exp(logit_i - max): the one formula every kernel, backend and merge
/// uses. -inf when the sum is 0 (a row that saw no key, an all-empty merge);
/// NaN when the sum is NaN (a key it saw read as NaN), as in the reference,
/// rather than reading as a row that saw nothing.
KVCACHE_HOST_DEVICE inline float log_sum_exp(float max, float sum) noexcept {
    if (sum != sum) return sum;
    return sum > 0.0f ? max + ::logf(sum) : negative_infinity();
}

/// Weight of a partial state with log-sum-exp lse inside a merge whose
/// largest lse is max_lse (0 for empty states).
KVCACHE_HOST_DEVICE inline float merge_weight(float lse, float max_lse) noexcept {
    return exp_difference(lse, max_lse);
}

}  // namespace detail
}  // namespace kvcache
