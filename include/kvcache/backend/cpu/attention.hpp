// CPU decode and prefill attention over any layout view in host memory:
// threads across (sequence, KV head[, key split | query block]), each work
// item streaming its KV head once for all the query rows that use it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvcache/backend/cpu/attention_rows.hpp"
#include "kvcache/backend/cpu/decode_tile.hpp"
#include "kvcache/backend/cpu/thread_pool.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/kernels/attention_options.hpp"

namespace kvcache {
namespace cpu {
namespace detail {

/// Fewest keys a decode split is given: below this, splitting costs more in
/// merging than it gains in threads.
inline constexpr int min_split_keys = 256;

/// Loads `rows` query rows (scaled) and their positions into the state.
template <class Query>
void load_queries(row_state& state, const Query* const* rows, const int* positions, float scale) {
    for (int r = 0; r < state.rows; ++r) {
        float* query = state.queries.data() + std::size_t(r) * state.dim;
        for (int d = 0; d < state.dim; ++d) query[d] = to_float(rows[r][d]) * scale;
        state.positions[r] = positions[r];
    }
}

/// Writes row r of a finished state (normalised) and its log-sum-exp.
template <class Output>
void store_row(const row_state& state, int r, Output* output, float* lse) {
    const auto& softmax = state.softmax[r];
    const float inverse = softmax.sum > 0.0f ? 1.0f / softmax.sum : 0.0f;
    const float* accumulator = state.accumulators.data() + std::size_t(r) * state.dim;
    for (int d = 0; d < state.dim; ++d) output[d] = from_float<Output>(accumulator[d] * inverse);
    if (lse) *lse = softmax.log_sum_exp();
}

template <class Layout, class Query>
void decode(const Layout& view, const Query* queries, Query* outputs, float* lse, const attention_options& options) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim, group = heads::group_size;
    const int batch = view.sequence_count();
    if (batch == 0) return;
    const float scale = resolved_softmax_scale(options, dim);
    const int items = batch * heads::kv_heads;
    thread_pool& pool = thread_pool::instance();
    int splits = options.kv_splits;
    if (splits <= 0) splits = items >= pool.threads() ? 1 : (pool.threads() + items - 1) / items;
    if (splits == 1) {
        pool.parallel_for(items, [&](int item) {
            const int b = item / heads::kv_heads, kv = item % heads::kv_heads;
            const std::size_t first_row = std::size_t(b) * heads::query_heads + std::size_t(kv) * group;
            const int length = view.length(b), visible = length > 0 ? view.visible_count(b) : 0;
            decode_range<group>(view, b, kv, 0, visible, length - 1, queries + first_row * dim, scale,
                                options.logits_soft_cap, outputs + first_row * dim, lse ? lse + first_row : nullptr);
        });
        return;
    }
    // Split-KV: partial states per (item, split), then one merge per query row.
    const std::size_t rows = std::size_t(batch) * heads::query_heads;
    std::vector<float> partial(rows * splits * dim), partial_lse(rows * splits);
    pool.parallel_for(items * splits, [&](int work) {
        const int item = work / splits, split = work % splits;
        const int b = item / heads::kv_heads, kv = item % heads::kv_heads;
        const std::size_t first_row = std::size_t(b) * heads::query_heads + std::size_t(kv) * group;
        const int length = view.length(b), visible = length > 0 ? view.visible_count(b) : 0;
        const int chunk = std::max((visible + splits - 1) / splits, min_split_keys);
        const int begin = std::min(visible, split * chunk), end = std::min(visible, begin + chunk);
        // Partial rows of one (item, split) are `splits` rows apart: written through a gathered copy.
        std::vector<float> partial_rows(std::size_t(group) * dim), partial_row_lse(group);
        decode_range<group>(view, b, kv, begin, end, length - 1, queries + first_row * dim, scale,
                            options.logits_soft_cap, partial_rows.data(), partial_row_lse.data());
        for (int g = 0; g < group; ++g) {
            const std::size_t slot = (first_row + g) * splits + split;
            std::copy(partial_rows.begin() + g * dim, partial_rows.begin() + (g + 1) * dim, partial.data() + slot * dim);
            partial_lse[slot] = partial_row_lse[g];
        }
    });
    for (std::size_t row = 0; row < rows; ++row) {
        float max_lse = kvcache::detail::negative_infinity();
        for (int s = 0; s < splits; ++s) max_lse = std::max(max_lse, partial_lse[row * splits + s]);
        float total = 0.0f;
        float merged[dim];
        std::fill(merged, merged + dim, 0.0f);
        for (int s = 0; s < splits; ++s) {
            const float weight = kvcache::detail::merge_weight(partial_lse[row * splits + s], max_lse);
            if (weight == 0.0f) continue;
            total += weight;
            axpy(weight, partial.data() + (row * splits + s) * dim, merged, dim);
        }
        const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
        for (int d = 0; d < dim; ++d) outputs[row * dim + d] = from_float<Query>(merged[d] * inverse);
        if (lse) lse[row] = total > 0.0f ? max_lse + ::logf(total) : kvcache::detail::negative_infinity();
    }
}

/// Query tokens of one prefill work item.
inline constexpr int prefill_block_tokens = 16;

template <class Layout, class Query>
void prefill(const Layout& view, const Query* queries, const int* query_offsets, const int* query_positions,
             Query* outputs, float* lse, const attention_options& options) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim, group = heads::group_size;
    const int batch = view.sequence_count();
    const float scale = resolved_softmax_scale(options, dim);
    struct work_item { int sequence, kv_head, first_token, tokens; };
    std::vector<work_item> work;
    for (int b = 0; b < batch; ++b) {
        const int tokens = query_offsets[b + 1] - query_offsets[b];
        for (int kv = 0; kv < heads::kv_heads; ++kv)
            for (int t = 0; t < tokens; t += prefill_block_tokens)
                work.push_back({b, kv, t, std::min(prefill_block_tokens, tokens - t)});
    }
    thread_pool::instance().parallel_for(int(work.size()), [&](int index) {
        const work_item item = work[index];
        const int length = view.length(item.sequence);
        const int chunk = query_offsets[item.sequence + 1] - query_offsets[item.sequence];
        const int row_count = item.tokens * group;
        row_state state(row_count, dim);
        std::vector<const Query*> rows(row_count);
        std::vector<int> positions(row_count);
        std::vector<std::size_t> output_rows(row_count);
        for (int t = 0; t < item.tokens; ++t)
            for (int g = 0; g < group; ++g) {
                const int token = item.first_token + t;
                const std::size_t row =
                    std::size_t(query_offsets[item.sequence] + token) * heads::query_heads + std::size_t(item.kv_head) * group + g;
                rows[t * group + g] = queries + row * dim;
                positions[t * group + g] = query_positions
                                               ? query_positions[query_offsets[item.sequence] + token]
                                               : length - chunk + token;
                output_rows[t * group + g] = row;
            }
        load_queries(state, rows.data(), positions.data(), scale);
        const int last_position = *std::max_element(positions.begin(), positions.end());
        attend_range(state, view, item.sequence, item.kv_head, 0, view.visible_count(item.sequence), last_position,
                     options.logits_soft_cap);
        for (int r = 0; r < row_count; ++r)
            store_row(state, r, outputs + output_rows[r] * dim, lse ? lse + output_rows[r] : nullptr);
    });
}

}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
