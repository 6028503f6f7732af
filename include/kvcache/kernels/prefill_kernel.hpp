// Prefill (append) attention body: a block takes query tiles of one sequence
// and KV head — tile_tokens tokens times the group's query heads — and streams
// the visible keys through shared memory once per tile: the cached prefix and,
// causally, the chunk itself. FP32 online softmax per query row.
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"
#include "kvcache/kernels/decode_kernel.hpp"
#include "kvcache/kernels/detail/vector_rows.hpp"
#include "kvcache/kernels/kernel_params.hpp"
#include "kvcache/kernels/softmax_math.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

/// Query rows (tokens x group heads) a prefill block aims for: enough to reuse
/// each key tile many times, few enough to keep accumulators in registers.
KVCACHE_HOST_DEVICE constexpr int prefill_target_rows(int head_dim) noexcept {
    return 4096 / head_dim < 1 ? 1 : (4096 / head_dim > 64 ? 64 : 4096 / head_dim);
}

/// The prefill body. Grid: (query-tile slots, kv_heads, batch); block x takes
/// tiles x, x + grid.x, ... of its sequence's chunk.
/// @tparam Layout a layout view
/// @tparam Query float or kvcache::half (queries and outputs)
template <class Layout, class Query>
struct prefill_kernel {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    static constexpr const char* name = "prefill_attention";
    static constexpr int block_threads = 128;
    static constexpr int dim = heads::head_dim;
    static constexpr int group = heads::group_size;
    static constexpr int tile_tokens =
        prefill_target_rows(dim) / group < 1 ? 1 : prefill_target_rows(dim) / group;  ///< query tokens per tile
    static constexpr int rows = tile_tokens * group;  ///< row r = token (r / group), head (r % group)
    static constexpr int tile = attention_tile_keys(dim);
    static constexpr int pitch = dim + 1;
    static constexpr int per_thread = (rows * dim + block_threads - 1) / block_threads;

    static constexpr std::size_t query_offset = 0;
    static constexpr std::size_t key_offset = detail::align16(query_offset + sizeof(float) * rows * dim);
    static constexpr std::size_t value_offset = detail::align16(key_offset + sizeof(float) * tile * pitch);
    static constexpr std::size_t score_offset = detail::align16(value_offset + sizeof(float) * tile * dim);
    static constexpr std::size_t stats_offset = detail::align16(score_offset + sizeof(float) * rows * tile);
    /// Dynamic shared memory a launch needs.
    static constexpr std::size_t shared_bytes = detail::align16(stats_offset + sizeof(float) * 3 * rows);

    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const prefill_params<Layout, Query>& p) const {
        const int kv = ctx.block_index().y, sequence = ctx.block_index().z;
        const int chunk = p.query_offsets[sequence + 1] - p.query_offsets[sequence];
        const int length = p.view.length(sequence);
        const int visible = chunk > 0 ? p.view.visible_count(sequence) : 0;
        const attention_visibility visibility = p.view.visibility();
        for (int first = ctx.block_index().x * tile_tokens; first < chunk; first += ctx.grid_size().x * tile_tokens) {
            const int tokens = chunk - first < tile_tokens ? chunk - first : tile_tokens;
            attend_tile(ctx, p, sequence, kv, length - chunk + first, p.query_offsets[sequence] + first, tokens, visible,
                        visibility);
        }
    }

private:
    template <class Context>
    KVCACHE_HOST_DEVICE void attend_tile(Context& ctx, const prefill_params<Layout, Query>& p, int sequence, int kv,
                                         int first_position, int first_token, int tokens, int visible,
                                         const attention_visibility& visibility) const {
        const int thread = ctx.thread_index(), lane = ctx.lane(), warp = ctx.warp(), warps = ctx.warp_count();
        auto queries = ctx.template shared_array<float>(query_offset, rows * dim);
        auto keys = ctx.template shared_array<float>(key_offset, tile * pitch);
        auto values = ctx.template shared_array<float>(value_offset, tile * dim);
        auto scores = ctx.template shared_array<float>(score_offset, rows * tile);
        auto stats = ctx.template shared_array<float>(stats_offset, 3 * rows);
        const int last_position = first_position + tokens - 1;

        // Rows of one token are the group's heads, contiguous in the input.
        for (int i = thread; i < rows * (dim / 8); i += block_threads) {
            const int r = i / (dim / 8), c = (i % (dim / 8)) * 8, t = r / group;
            float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (t < tokens)
                detail::load8(ctx, p.queries + (std::size_t(first_token + t) * heads::query_heads + std::size_t(kv) * group + r % group) * dim + c, x);
            for (int j = 0; j < 8; ++j) queries[r * dim + c + j] = x[j] * p.scale;
        }
        for (int r = thread; r < rows; r += block_threads) {
            stats[r] = detail::negative_infinity();
            stats[rows + r] = 0.0f;
        }
        float accumulators[per_thread];
        KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) accumulators[k] = 0.0f;
        ctx.sync_block();

        for (int v = 0; v < visible;) {
            const position_run<element> run = p.view.run(sequence, kv, v);
            if (run.count <= 0 || run.first_position > last_position) break;  // keys ascend: none later is seen
            int n = run.count < visible - v ? run.count : visible - v;
            n = n < tile ? n : tile;
            // Skip a tile every row's window has left behind (uniform: no barrier is skipped by part of the block).
            const bool behind = visibility.window > 0 && run.first_position >= visibility.sinks &&
                                run.first_position + n - 1 <= first_position - visibility.window;
            if (behind) {
                v += n;
                continue;
            }
            for (int i = thread; i < n * (dim / 8); i += block_threads) {
                const int t = i / (dim / 8), c = (i % (dim / 8)) * 8;
                float x[8];
                detail::load8(ctx, run.keys + std::size_t(t) * run.stride + c, x);
                for (int j = 0; j < 8; ++j) keys[t * pitch + c + j] = x[j];
                detail::load8(ctx, run.values + std::size_t(t) * run.stride + c, x);
                for (int j = 0; j < 8; ++j) values[t * dim + c + j] = x[j];
            }
            ctx.sync_block();
            for (int i = thread; i < rows * tile; i += block_threads) {
                const int r = i / tile, t = i % tile, token = r / group;
                float score = detail::negative_infinity();
                if (t < n && token < tokens && visibility.allows(first_position + token, run.first_position + t)) {
                    float dot = 0.0f;
                    for (int d = 0; d < dim; ++d) dot += queries[r * dim + d] * keys[t * pitch + d];
                    score = detail::apply_soft_cap(dot, p.soft_cap);
                }
                scores[i] = score;
            }
            ctx.sync_block();
            for (int r = warp; r < rows; r += warps) {
                const float old_max = stats[r];
                const float score = lane < tile ? scores[r * tile + lane] : detail::negative_infinity();
                const float block_max = ctx.warp_max(score);
                const float new_max = block_max > old_max ? block_max : old_max;
                const float weight = detail::exp_difference(score, new_max);
                const float sum = ctx.warp_sum(weight);
                if (lane < tile) scores[r * tile + lane] = weight;
                if (lane == 0) {
                    const float rescale = detail::exp_difference(old_max, new_max);
                    stats[r] = new_max;
                    stats[rows + r] = stats[rows + r] * rescale + sum;
                    stats[2 * rows + r] = rescale;
                }
            }
            ctx.sync_block();
            KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) {
                const int j = thread + k * block_threads;
                if (j < rows * dim) {
                    const int r = j / dim, d = j % dim;
                    float a = accumulators[k] * stats[2 * rows + r];
                    for (int t = 0; t < n; ++t) a += scores[r * tile + t] * values[t * dim + d];
                    accumulators[k] = a;
                }
            }
            ctx.sync_block();
            v += n;
        }

        KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) {
            const int j = thread + k * block_threads;
            if (j < rows * dim) {
                const float sum = stats[rows + j / dim];
                queries[j] = sum > 0.0f ? accumulators[k] / sum : 0.0f;
            }
        }
        ctx.sync_block();
        for (int i = thread; i < tokens * group * (dim / 8); i += block_threads) {
            const int r = i / (dim / 8), c = (i % (dim / 8)) * 8;
            float x[8];
            for (int j = 0; j < 8; ++j) x[j] = queries[r * dim + c + j];
            detail::store8(ctx, p.outputs + (std::size_t(first_token + r / group) * heads::query_heads + std::size_t(kv) * group + r % group) * dim + c, x);
        }
        for (int r = thread; r < tokens * group; r += block_threads) {
            if (!p.lse) break;
            const float sum = stats[rows + r];
            p.lse[std::size_t(first_token + r / group) * heads::query_heads + std::size_t(kv) * group + r % group] =
                sum > 0.0f ? stats[r] + ::logf(sum) : detail::negative_infinity();
        }
        ctx.sync_block();  // the next tile reuses the query buffer
    }
};

}  // namespace kvcache
