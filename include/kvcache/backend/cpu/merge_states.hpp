// CPU merge of partial attention states: cascade / shared-prefix attention
// (the public merge_states) and the split-KV decode, through one function.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "kvcache/backend/cpu/row_math.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/kernels/softmax_math.hpp"

namespace kvcache {
namespace cpu {
namespace detail {

/// The CPU backend's one merge of partial attention states: the public
/// merge_states and the split-KV decode both end here. outputs:
/// [states][rows][dim], lse: [states][rows] (an lse of -inf is an empty state
/// and weighs nothing); writes merged [rows][dim] (zeros where every state is
/// empty) and, when merged_lse is not null, merged_lse [rows].
/// @tparam State float, kvcache::half or kvcache::bfloat16
/// @tparam Output float, kvcache::half or kvcache::bfloat16
template <class State, class Output>
void merge_rows(int states, int rows, int dim, const State* outputs, const float* lse, Output* merged,
                float* merged_lse) {
    std::vector<float> sum(dim), row(dim);
    for (int r = 0; r < rows; ++r) {
        float max_lse = kvcache::detail::negative_infinity();
        for (int s = 0; s < states; ++s) max_lse = std::max(max_lse, lse[std::size_t(s) * rows + r]);
        std::fill(sum.begin(), sum.end(), 0.0f);
        float total = 0.0f;
        for (int s = 0; s < states; ++s) {
            const float weight = kvcache::detail::merge_weight(lse[std::size_t(s) * rows + r], max_lse);
            if (weight == 0.0f) continue;
            total += weight;
            const State* state = outputs + (std::size_t(s) * rows + r) * dim;
            if constexpr (std::is_same_v<State, float>) {
                axpy(weight, state, sum.data(), dim);
            } else {
                for (int d = 0; d < dim; ++d) row[d] = to_float(state[d]);
                axpy(weight, row.data(), sum.data(), dim);
            }
        }
        const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
        for (int d = 0; d < dim; ++d) merged[std::size_t(r) * dim + d] = from_float<Output>(sum[d] * inverse);
        if (merged_lse) merged_lse[r] = kvcache::detail::log_sum_exp(max_lse, total);
    }
}

}  // namespace detail

}  // namespace cpu
}  // namespace kvcache
