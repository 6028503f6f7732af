// What a kernel backend does per call, written once over a Launcher policy
// (the emulator or a CUDA stream): choose grids and splits, get workspace,
// launch the bodies in order. The policy provides
//   int multiprocessors() const;
//   template <class Body, class Params> void launch(index3 grid, std::size_t shared_bytes, const Params&);
//   <buffer of float with data()> workspace(std::size_t count);
#pragma once

#include <algorithm>
#include <cstddef>

#include "kvcache/backend/detail/call_checks.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/execution/index3.hpp"
#include "kvcache/kernels/append_kernel.hpp"
#include "kvcache/kernels/attention_options.hpp"
#include "kvcache/kernels/decode_kernel.hpp"
#include "kvcache/kernels/merge_states_kernel.hpp"
#include "kvcache/kernels/prefill_kernel.hpp"
#include "kvcache/kernels/scores_kernel.hpp"

namespace kvcache {
namespace detail {

/// Splits per (sequence, block along grid y): the option when set
/// (check_options bounds it), else enough blocks to give every multiprocessor
/// two. Split blocks past a short sequence's keys write empty states, which
/// the merge ignores.
inline int decode_splits(int batch, int blocks_y, int multiprocessors, const attention_options& options) {
    if (options.kv_splits > 0) return options.kv_splits;
    const int items = std::max(1, batch * blocks_y), target = 2 * multiprocessors;
    return items >= target ? 1 : std::min(max_kv_splits, (target + items - 1) / items);
}

/// Blocks along x for prefill and append: a few per multiprocessor in total.
inline int spread_blocks(int batch, int kv_heads, int multiprocessors) {
    const int items = std::max(1, batch * kv_heads), target = 4 * multiprocessors;
    return std::max(1, std::min(1024, (target + items - 1) / items));
}

/// Floats of workspace a split decode writes: a partial output and an lse
/// per (query row, split).
inline std::size_t decode_workspace_floats(std::size_t rows, int splits, int head_dim) {
    return rows * std::size_t(splits) * std::size_t(head_dim + 1);
}

inline void check_batch(int batch) {
    require(batch >= 0 && batch <= 65535, error_code::invalid_argument, "batch of ", batch,
            " sequences exceeds the grid limit of 65535");
}

template <class Launcher, class Layout, class Input>
void run_append(Launcher& launcher, const Layout& view, const Input* keys, const Input* values, const int* offsets,
                const int* positions) {
    const int batch = view.sequence_count();
    check_batch(batch);
    if (batch == 0) return;
    const append_kernel_params<Layout, Input> params{view, keys, values, offsets, positions};
    launcher.template launch<append_kernel<Layout, Input>>(
        index3{spread_blocks(batch, view.kv_heads(), launcher.multiprocessors()), view.kv_heads(), batch}, 0, params);
}

template <class Launcher, class State, class Output>
void run_merge(Launcher& launcher, const merge_kernel_params<State, Output>& params) {
    if (params.rows == 0) return;
    launcher.template launch<merge_states_kernel<State, Output>>(index3{params.rows, 1, 1}, 0, params);
}

/// The score request of a call's scores fields (none when scores is empty).
inline score_request score_request_of(span<float> scores, int stride, int queries = 0) noexcept {
    score_request request;
    if (scores.empty()) return request;
    request.scores = scores.data();
    request.stride = stride;
    request.queries = queries;
    return request;
}

/// Launches the scores body after an attention call whose final lse is at lse.
template <class Launcher, class Layout, class Query>
void run_scores(Launcher& launcher, const Layout& view, const Query* queries, const int* query_offsets,
                const int* query_positions, const float* lse, const attention_options& options,
                const score_request& request) {
    using body = scores_kernel<Layout, Query>;
    const scores_kernel_params<Layout, Query> params{view, queries, query_offsets, query_positions, lse,
                                                     // an fp8 key scale folded in, as the attention bodies do
                                                     resolved_softmax_scale(options, Layout::heads::head_dim) *
                                                         scales_of(view).key,
                                                     options.logits_soft_cap, request};
    const int blocks = (request.stride + body::block_threads - 1) / body::block_threads;
    launcher.template launch<body>(index3{blocks, view.kv_heads(), view.sequence_count()}, 0, params);
}

/// Floats of workspace a decode takes: the split partial states, and the
/// rows' lse when scores are asked for and the caller's lse is not given.
inline std::size_t decode_workspace_floats(std::size_t rows, int splits, int head_dim, bool scores_without_lse) {
    return (splits > 1 ? decode_workspace_floats(rows, splits, head_dim) : 0) + (scores_without_lse ? rows : 0);
}

template <class Launcher, class Layout, class Query>
void run_decode(Launcher& launcher, const Layout& view, const Query* queries, Query* outputs, float* lse,
                const attention_options& options, const score_request& request = {}) {
    using heads = typename Layout::heads;
    using body = decode_kernel<Layout, Query>;
    const int batch = view.sequence_count();
    check_batch(batch);
    if (batch == 0) return;
    const int blocks_y = body::grid_y(view);
    const int splits = decode_splits(batch, blocks_y, launcher.multiprocessors(), options);
    const std::size_t rows = std::size_t(batch) * view.query_heads();
    const bool own_lse = request.scores && !lse;  // the scores need every row's lse
    const std::size_t floats = decode_workspace_floats(rows, splits, heads::head_dim, own_lse);
    auto workspace = launcher.workspace(floats);
    if (own_lse) lse = workspace.data() + (floats - rows);
    decode_kernel_params<Layout, Query> params{view, queries, outputs, lse, nullptr, nullptr,
                                        resolved_softmax_scale(options, heads::head_dim), options.logits_soft_cap, splits};
    const index3 grid{splits, blocks_y, batch};
    if (splits == 1) {
        launcher.template launch<body>(grid, body::shared_bytes, params);
    } else {
        params.partial_outputs = workspace.data();
        params.partial_lse = workspace.data() + rows * splits * heads::head_dim;
        launcher.template launch<body>(grid, body::shared_bytes, params);
        const merge_kernel_params<float, Query> merge{params.partial_outputs, params.partial_lse, outputs, lse, int(rows), splits,
                                               heads::head_dim, heads::head_dim, std::int64_t(splits) * heads::head_dim,
                                               1, splits};
        run_merge(launcher, merge);
    }
    if (request.scores) run_scores(launcher, view, queries, nullptr, nullptr, lse, options, request);
}

/// Prefill; total_rows (query tokens x query_heads) sizes the lse the
/// scores need when the caller gives none (it is only read then).
template <class Launcher, class Layout, class Query>
void run_prefill(Launcher& launcher, const Layout& view, const Query* queries, const int* query_offsets,
                 const int* query_positions, Query* outputs, float* lse, const attention_options& options,
                 const score_request& request = {}, std::size_t total_rows = 0) {
    using heads = typename Layout::heads;
    using body = prefill_kernel<Layout, Query>;
    const int batch = view.sequence_count();
    check_batch(batch);
    if (batch == 0) return;
    const bool own_lse = request.scores && !lse;
    auto workspace = launcher.workspace(own_lse ? std::max<std::size_t>(total_rows, 1) : 0);
    if (own_lse) lse = workspace.data();
    const prefill_kernel_params<Layout, Query> params{view, queries, query_offsets, query_positions, outputs, lse,
                                               resolved_softmax_scale(options, heads::head_dim), options.logits_soft_cap};
    launcher.template launch<body>(index3{spread_blocks(batch, view.kv_heads(), launcher.multiprocessors()),
                                          view.kv_heads(), batch},
                                   body::shared_bytes, params);
    if (request.scores) run_scores(launcher, view, queries, query_offsets, query_positions, lse, options, request);
}

/// Merge parameters for state-major inputs: outputs [states][rows][head_dim], lse [states][rows].
template <class State, class Output>
merge_kernel_params<State, Output> state_major_merge(int states, int rows, int head_dim, const State* outputs, const float* lse,
                                              Output* merged, float* merged_lse) {
    return {outputs, lse, merged, merged_lse, rows, states, head_dim, std::int64_t(rows) * head_dim, head_dim, rows, 1};
}

}  // namespace detail
}  // namespace kvcache
