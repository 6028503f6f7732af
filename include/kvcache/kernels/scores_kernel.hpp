// Attention scores after an attention call: the tiles of decode and prefill
// keep no weight past their step (their online softmax rescales as it goes),
// so the final weight of a key is recomputed from its logit and the row's
// final log-sum-exp, which the call wrote. One thread per (sequence, KV head,
// visible row) sums exp(logit - lse) over the contributing query rows of the
// group: a second read of K (never V), only for the rows asked for, and no
// two threads write one entry (no atomics, any number of splits or query blocks).
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/kernels/detail/vector_rows.hpp"
#include "kvcache/kernels/kernel_params.hpp"
#include "kvcache/kernels/softmax_math.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

/// The scores body. Grid: (ceil(stride / block_threads), kv_heads, batch); no shared memory.
/// @tparam Layout a layout view
/// @tparam Query float, kvcache::half or kvcache::bfloat16
template <class Layout, class Query>
struct scores_kernel {
    static constexpr const char* name = "attention_scores";
    static constexpr int block_threads = 128;
    static constexpr int dim = Layout::heads::head_dim;

    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const scores_kernel_params<Layout, Query>& p) const {
        const int sequence = ctx.block_index().z, kv = ctx.block_index().y;
        const int row = ctx.block_index().x * block_threads + ctx.thread_index();
        const int stride = p.request.stride;
        if (row >= stride) return;
        float* out = p.request.scores + (std::size_t(sequence) * p.view.kv_heads() + kv) * stride + row;
        const int length = p.view.length(sequence);
        const int visible = length > 0 ? p.view.visible_count(sequence) : 0;
        if (row >= visible) {
            *out = 0.0f;
            return;
        }
        const int key_position = p.view.visible_position(sequence, row);
        float key[dim];
        const auto* stored = p.view.key(sequence, kv, key_position);
        for (int c = 0; c < dim; c += 8) {
            float x[8];
            detail::load_row8<dim>(ctx, stored, c, x);
            for (int j = 0; j < 8; ++j) key[c + j] = x[j];
        }
        // An int8 row's own scale; a NaN int4 row's NaN (its key loads as zeros); 1 otherwise.
        const float key_scale = detail::row_factor<dim>(stored);
        const int first_token = p.query_offsets ? p.query_offsets[sequence] : sequence;
        const int tokens = p.query_offsets ? p.query_offsets[sequence + 1] - first_token : 1;
        const int skipped = p.request.queries > 0 && tokens > p.request.queries ? tokens - p.request.queries : 0;
        const attention_visibility visibility = p.view.visibility();
        const int group = p.view.group_size();
        float total = 0.0f;
        for (int t = skipped; t < tokens; ++t) {
            const int position = p.query_positions ? p.query_positions[first_token + t] : length - tokens + t;
            if (!visibility.allows(position, key_position)) continue;
            for (int g = 0; g < group; ++g) {
                const std::size_t query_row = std::size_t(first_token + t) * p.view.query_heads() + std::size_t(kv) * group + g;
                const float lse = p.lse[query_row];
                if (lse == detail::negative_infinity()) continue;
                const Query* query = p.queries + query_row * dim;
                float dot = 0.0f;
                for (int c = 0; c < dim; c += 8) {
                    float x[8];
                    detail::load8(ctx, query + c, x);
                    for (int j = 0; j < 8; ++j) dot += x[j] * p.scale * key[c + j];
                }
                total += ::expf(detail::apply_soft_cap(dot * key_scale, p.soft_cap) - lse);
            }
        }
        *out = total;
    }
};

}  // namespace kvcache
