// The CPU backend's core: a block of query rows that share one KV head (the
// query heads of a GQA group, times the query tokens of a prefill chunk)
// streams that head's key/value runs once, with the FP32 online softmax.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "kvcache/core/error.hpp"

#include "kvcache/backend/cpu/row_math.hpp"
#include "kvcache/kernels/softmax_math.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace cpu {
namespace detail {

/// Keys whose scores are computed before the softmax state is rescaled once.
inline constexpr int key_block = 32;

/// Online-softmax state of `rows` query rows of head_dim `dim`.
struct row_state {
    int rows = 0;
    int dim = 0;
    std::vector<float> queries;    ///< [rows][dim], already multiplied by the softmax scale
    std::vector<int> positions;    ///< logical position of each query row
    std::vector<kvcache::detail::online_softmax> softmax;
    std::vector<float> accumulators;  ///< [rows][dim], unnormalised
    std::vector<float> scores;        ///< [rows][key_block]
    std::vector<float> block_max;     ///< [rows]
    std::vector<float> keys, values;  ///< [key_block][dim] widening buffers for half rows

    row_state(int row_count, int head_dim)
        : rows(row_count), dim(head_dim), queries(std::size_t(row_count) * head_dim), positions(row_count),
          softmax(row_count), accumulators(std::size_t(row_count) * head_dim, 0.0f),
          scores(std::size_t(row_count) * key_block), block_max(row_count), keys(std::size_t(key_block) * head_dim),
          values(std::size_t(key_block) * head_dim) {
        for (auto& s : softmax) s.reset();
    }
};

/// Rows [first, first + count) of a strided run, as float rows: the run itself
/// for float storage, else widened into buffer. Returns the row stride.
template <class Element>
const float* float_rows(const Element* rows, int stride, int count, int dim, float* buffer, int& float_stride) {
    if constexpr (std::is_same_v<Element, float>) {
        float_stride = stride;
        (void)count, (void)dim, (void)buffer;
        return rows;
    } else {
        for (int r = 0; r < count; ++r) widen(rows + std::size_t(r) * stride, buffer + std::size_t(r) * dim, dim);
        float_stride = dim;
        return buffer;
    }
}

/// Folds `count` consecutive rows of a run (positions first_position...) into the state.
template <class Element>
void attend_run(row_state& state, const Element* keys, const Element* values, int stride, int first_position,
                int count, const attention_visibility& visibility, float soft_cap) {
    const int dim = state.dim;
    const float minus_infinity = kvcache::detail::negative_infinity();
    for (int start = 0; start < count; start += key_block) {
        const int n = std::min(key_block, count - start);
        const std::size_t offset = std::size_t(start) * stride;
        int key_stride = 0;
        const float* key_rows = float_rows(keys + offset, stride, n, dim, state.keys.data(), key_stride);
        bool any = false;
        for (int row = 0; row < state.rows; ++row) {
            float* scores = state.scores.data() + std::size_t(row) * key_block;
            const float* query = state.queries.data() + std::size_t(row) * dim;
            float best = minus_infinity;
            for (int r = 0; r < n; ++r) {
                if (!visibility.allows(state.positions[row], first_position + start + r)) {
                    scores[r] = minus_infinity;
                    continue;
                }
                const float logit =
                    kvcache::detail::apply_soft_cap(dot(query, key_rows + std::size_t(r) * key_stride, dim), soft_cap);
                scores[r] = logit;
                best = std::max(best, logit);
            }
            state.block_max[row] = best;
            any = any || best != minus_infinity;
        }
        if (!any) continue;
        int value_stride = 0;
        const float* value_rows = float_rows(values + offset, stride, n, dim, state.values.data(), value_stride);
        for (int row = 0; row < state.rows; ++row) {
            if (state.block_max[row] == minus_infinity) continue;
            auto& softmax = state.softmax[row];
            float new_max = 0.0f;
            const float rescale = softmax.rescale_for(state.block_max[row], new_max);
            float* accumulator = state.accumulators.data() + std::size_t(row) * dim;
            if (rescale != 1.0f) detail::scale(rescale, accumulator, dim);
            float sum = softmax.sum * rescale;
            const float* scores = state.scores.data() + std::size_t(row) * key_block;
            for (int r = 0; r < n; ++r) {
                const float weight = kvcache::detail::exp_difference(scores[r], new_max);
                if (weight == 0.0f) continue;
                sum += weight;
                axpy(weight, value_rows + std::size_t(r) * value_stride, accumulator, dim);
            }
            softmax.max = new_max;
            softmax.sum = sum;
        }
    }
}

/// Streams visible indices [begin, end) of (sequence, kv_head), run by run,
/// stopping early past last_position (no query row can see beyond it).
template <class Layout>
void attend_range(row_state& state, const Layout& view, int sequence, int kv_head, int begin, int end,
                  int last_position, float soft_cap) {
    const attention_visibility visibility = view.visibility();
    for (int v = begin; v < end;) {
        const auto run = view.run(sequence, kv_head, v);
        require(run.count > 0, error_code::out_of_range, "layout returned an empty run at visible index ", v,
                " of sequence ", sequence, " below its visible count ", end);
        if (run.first_position > last_position) return;
        const int n = std::min(run.count, end - v);
        attend_run(state, run.keys, run.values, run.stride, run.first_position, n, visibility, soft_cap);
        v += n;
    }
}

}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
