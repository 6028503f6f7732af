// Merge of partial attention states (output, log-sum-exp): the second pass of
// split decode, and the combining step of cascade (shared-prefix) attention.
// Empty states (lse = -inf) weigh nothing; a row of only empty states gives
// zeros and lse = -inf, never NaN.
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"
#include "kvcache/kernels/detail/vector_rows.hpp"
#include "kvcache/kernels/kernel_params.hpp"
#include "kvcache/kernels/softmax_math.hpp"

namespace kvcache {

/// The merge body. Grid: (rows, 1, 1). head_dim and the output strides must be
/// multiples of 8 (rows move 8 elements at a time).
/// @tparam State float, kvcache::half or kvcache::bfloat16 (partial outputs)
/// @tparam Output float, kvcache::half or kvcache::bfloat16
template <class State, class Output>
struct merge_states_kernel {
    static constexpr const char* name = "merge_states";
    static constexpr int block_threads = 64;
    static constexpr std::size_t shared_bytes = 0;

    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const merge_kernel_params<State, Output>& p) const {
        const int row = ctx.block_index().x;
        const int thread = ctx.thread_index();
        float max_lse = detail::negative_infinity();
        for (int s = 0; s < p.states; ++s) {
            const float lse = p.lse[s * p.lse_state_stride + row * p.lse_row_stride];
            max_lse = lse > max_lse ? lse : max_lse;
        }
        float total = 0.0f;
        for (int s = 0; s < p.states; ++s)
            total += detail::merge_weight(p.lse[s * p.lse_state_stride + row * p.lse_row_stride], max_lse);
        const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
        for (int c = thread * 8; c < p.head_dim; c += block_threads * 8) {
            float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int s = 0; s < p.states; ++s) {
                const float weight = detail::merge_weight(p.lse[s * p.lse_state_stride + row * p.lse_row_stride], max_lse);
                if (weight == 0.0f) continue;
                float x[8];
                detail::load8(ctx, p.outputs + s * p.output_state_stride + row * p.output_row_stride + c, x);
                for (int j = 0; j < 8; ++j) sum[j] += weight * x[j];
            }
            for (int j = 0; j < 8; ++j) sum[j] *= inverse;
            detail::store8(ctx, p.merged + std::size_t(row) * p.head_dim + c, sum);
        }
        if (thread == 0 && p.merged_lse)
            p.merged_lse[row] = detail::log_sum_exp(max_lse, total);
    }
};

}  // namespace kvcache
