// CPU merge of partial attention states (cascade / shared-prefix attention).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvcache/backend/cpu/row_math.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/kernels/softmax_math.hpp"

namespace kvcache {
namespace cpu {

namespace detail {

/// Merges `states` partial results per row (see merge_params; checked by the
/// caller): outputs [states][rows][head_dim], lse [states][rows] (natural log;
/// -inf marks an empty state, which weighs nothing). Writes merged
/// [rows][head_dim] (zeros where every state is empty) and merged_lse [rows]
/// unless it is null.
template <class State, class Output>
void merge(int states, int rows, int head_dim, const State* outputs, const float* lse, Output* merged,
           float* merged_lse) {
    std::vector<float> sum(head_dim), row(head_dim);
    for (int r = 0; r < rows; ++r) {
        float max_lse = kvcache::detail::negative_infinity();
        for (int s = 0; s < states; ++s) max_lse = std::max(max_lse, lse[std::size_t(s) * rows + r]);
        std::fill(sum.begin(), sum.end(), 0.0f);
        float total = 0.0f;
        for (int s = 0; s < states; ++s) {
            const float weight = kvcache::detail::merge_weight(lse[std::size_t(s) * rows + r], max_lse);
            if (weight == 0.0f) continue;
            total += weight;
            const State* state = outputs + (std::size_t(s) * rows + r) * head_dim;
            for (int d = 0; d < head_dim; ++d) row[d] = to_float(state[d]);
            axpy(weight, row.data(), sum.data(), head_dim);
        }
        const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
        for (int d = 0; d < head_dim; ++d) merged[std::size_t(r) * head_dim + d] = from_float<Output>(sum[d] * inverse);
        if (merged_lse) merged_lse[r] = total > 0.0f ? max_lse + ::logf(total) : kvcache::detail::negative_infinity();
    }
}

}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
