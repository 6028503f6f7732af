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
/// uses. -inf when the sum is 0 (a row that saw no key, an all-empty merge).
KVCACHE_HOST_DEVICE inline float log_sum_exp(float max, float sum) noexcept {
    return sum > 0.0f ? max + ::logf(sum) : negative_infinity();
}

/// Running state of one softmax row: maximum logit seen and sum of exp(logit - max).
struct online_softmax {
    float max = 0.0f;  ///< set to -inf by reset()
    float sum = 0.0f;

    KVCACHE_HOST_DEVICE void reset() noexcept {
        max = negative_infinity();
        sum = 0.0f;
    }

    /// Folds in a block whose largest logit is block_max; returns the factor
    /// by which earlier accumulations must be rescaled, and sets new_max, the
    /// reference the block's exp(logit - new_max) must use.
    KVCACHE_HOST_DEVICE float rescale_for(float block_max, float& new_max) const noexcept {
        new_max = block_max > max ? block_max : max;
        return exp_difference(max, new_max);
    }

    /// Natural log of the sum of exp(logits): -inf for a row that saw nothing.
    KVCACHE_HOST_DEVICE float log_sum_exp() const noexcept {
        return kvcache::detail::log_sum_exp(max, sum);
    }
};

/// Weight of a partial state with log-sum-exp lse inside a merge whose
/// largest lse is max_lse (0 for empty states).
KVCACHE_HOST_DEVICE inline float merge_weight(float lse, float max_lse) noexcept {
    return exp_difference(lse, max_lse);
}

}  // namespace detail
}  // namespace kvcache
