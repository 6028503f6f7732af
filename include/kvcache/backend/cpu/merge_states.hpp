// CPU merge of partial attention states: cascade / shared-prefix attention
// (the public merge_states) and the split-KV decode, through one function.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "kvcache/backend/cpu/row_math.hpp"
#include "kvcache/backend/detail/call_checks.hpp"
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
/// @tparam State float or kvcache::half
/// @tparam Output float or kvcache::half
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

/// Merges `states` partial results per row. outputs: [states][rows][head_dim],
/// lse: [states][rows] (natural log; -inf marks an empty state, which weighs
/// nothing). Writes merged[rows][head_dim] (zeros where every state is empty)
/// and merged_lse[rows] (nullptr or an empty span: not written). Sizes are checked.
/// @tparam States a sized buffer of float or kvcache::half
/// @tparam StateLse a sized buffer of float
/// @tparam Merged a sized buffer of float or kvcache::half
/// @tparam MergedLse a sized buffer of float
template <class States, class StateLse, class Merged, class MergedLse>
void merge_states(int states, int rows, int head_dim, const States& state_outputs, const StateLse& state_lse,
                  Merged&& merged_rows, MergedLse&& merged_row_lse) {
    using State = kvcache::detail::range_element_t<States>;
    using Output = kvcache::detail::range_element_t<Merged>;
    static_assert(is_element_v<State> && is_element_v<Output>, "kvcache: merged states are float or kvcache::half");
    const span<const State> outputs = make_span(state_outputs);
    const span<const float> lse = make_span(state_lse);
    const span<Output> merged = make_span(merged_rows);
    const span<float> merged_lse_span = kvcache::detail::optional_lse(merged_row_lse);
    kvcache::detail::check_merge(states, rows, head_dim, outputs.size(), lse.size(), merged.size(),
                                 !merged_lse_span.empty(), merged_lse_span.size());
    detail::merge_rows(states, rows, head_dim, outputs.data(), lse.data(), merged.data(),
                       merged_lse_span.empty() ? nullptr : merged_lse_span.data());
}

}  // namespace cpu
}  // namespace kvcache
