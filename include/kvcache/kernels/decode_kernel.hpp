// Decode attention body: block (split, kv_head, sequence) serves all the query
// heads of one GQA group from a single pass over its share of that KV head's
// keys. Keys and values go through shared memory a tile at a time (tiles never
// cross a layout run); scores and the online softmax are FP32.
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"
#include "kvcache/kernels/detail/vector_rows.hpp"
#include "kvcache/kernels/kernel_params.hpp"
#include "kvcache/kernels/softmax_math.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

/// Fewest keys one decode split covers (fewer would cost more to merge than it saves).
inline constexpr int decode_min_split_keys = 64;

/// Keys per shared-memory tile for a head dimension: 32 up to 128, fewer above
/// so a tile stays within a few tens of KiB. At most 32: one key per lane.
KVCACHE_HOST_DEVICE constexpr int attention_tile_keys(int head_dim) noexcept {
    return head_dim <= 128 ? 32 : head_dim <= 256 ? 16 : 8;
}

/// The decode body. Grid: (splits, kv_heads, batch); shared memory: shared_bytes().
/// @tparam Layout a layout view
/// @tparam Query float or kvcache::half (queries and outputs)
template <class Layout, class Query>
struct decode_kernel {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    static constexpr const char* name = "decode_attention";
    static constexpr int block_threads = 128;
    static constexpr int dim = heads::head_dim;
    static constexpr int group = heads::group_size;
    static constexpr int tile = attention_tile_keys(dim);
    static constexpr int pitch = dim + 1;  // key rows padded: the score loop reads a column across lanes
    static constexpr int per_thread = (group * dim + block_threads - 1) / block_threads;

    // Shared memory: queries (reused for the normalised outputs), key tile,
    // value tile, scores, and per-head max / sum / rescale factor.
    static constexpr std::size_t query_offset = 0;
    static constexpr std::size_t key_offset = detail::align16(query_offset + sizeof(float) * group * dim);
    static constexpr std::size_t value_offset = detail::align16(key_offset + sizeof(float) * tile * pitch);
    static constexpr std::size_t score_offset = detail::align16(value_offset + sizeof(float) * tile * dim);
    static constexpr std::size_t stats_offset = detail::align16(score_offset + sizeof(float) * group * tile);
    /// Dynamic shared memory a launch needs.
    static constexpr std::size_t shared_bytes = detail::align16(stats_offset + sizeof(float) * 3 * group);

    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const decode_params<Layout, Query>& p) const {
        const int split = ctx.block_index().x, kv = ctx.block_index().y, sequence = ctx.block_index().z;
        const int thread = ctx.thread_index(), lane = ctx.lane(), warp = ctx.warp(), warps = ctx.warp_count();
        auto queries = ctx.template shared_array<float>(query_offset, group * dim);
        auto keys = ctx.template shared_array<float>(key_offset, tile * pitch);
        auto values = ctx.template shared_array<float>(value_offset, tile * dim);
        auto scores = ctx.template shared_array<float>(score_offset, group * tile);
        auto stats = ctx.template shared_array<float>(stats_offset, 3 * group);  // max, sum, rescale

        const int length = p.view.length(sequence);
        const int visible = length > 0 ? p.view.visible_count(sequence) : 0;
        const int query_position = length - 1;
        int chunk = (visible + p.splits - 1) / p.splits;
        chunk = chunk < decode_min_split_keys ? decode_min_split_keys : chunk;
        chunk = (chunk + tile - 1) / tile * tile;
        const int begin = split * chunk < visible ? split * chunk : visible;
        const int end = begin + chunk < visible ? begin + chunk : visible;

        const std::size_t first_row = std::size_t(sequence) * heads::query_heads + std::size_t(kv) * group;
        const Query* query = p.queries + first_row * dim;
        for (int i = thread; i < group * dim / 8; i += block_threads) {
            float x[8];
            detail::load8(ctx, query + i * 8, x);
            for (int j = 0; j < 8; ++j) queries[i * 8 + j] = x[j] * p.scale;
        }
        for (int g = thread; g < group; g += block_threads) {
            stats[g] = detail::negative_infinity();
            stats[group + g] = 0.0f;
        }
        float accumulators[per_thread];
        KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) accumulators[k] = 0.0f;
        ctx.sync_block();

        const attention_visibility visibility = p.view.visibility();
        for (int v = begin; v < end;) {
            const position_run<element> run = p.view.run(sequence, kv, v);
            if (run.count <= 0) break;  // a layout bug; every thread sees the same run
            int n = run.count < end - v ? run.count : end - v;
            n = n < tile ? n : tile;
            for (int i = thread; i < n * (dim / 8); i += block_threads) {
                const int t = i / (dim / 8), c = (i % (dim / 8)) * 8;
                float x[8];
                detail::load8(ctx, run.keys + std::size_t(t) * run.stride + c, x);
                for (int j = 0; j < 8; ++j) keys[t * pitch + c + j] = x[j];
                detail::load8(ctx, run.values + std::size_t(t) * run.stride + c, x);
                for (int j = 0; j < 8; ++j) values[t * dim + c + j] = x[j];
            }
            ctx.sync_block();
            for (int i = thread; i < group * tile; i += block_threads) {
                const int g = i / tile, t = i % tile;
                float score = detail::negative_infinity();
                if (t < n && visibility.allows(query_position, run.first_position + t)) {
                    float dot = 0.0f;
                    for (int d = 0; d < dim; ++d) dot += queries[g * dim + d] * keys[t * pitch + d];
                    score = detail::apply_soft_cap(dot, p.soft_cap);
                }
                scores[i] = score;
            }
            ctx.sync_block();
            for (int g = warp; g < group; g += warps) {  // one warp per query head: running max and sum
                const float old_max = stats[g];
                const float score = lane < tile ? scores[g * tile + lane] : detail::negative_infinity();
                const float block_max = ctx.warp_max(score);
                const float new_max = block_max > old_max ? block_max : old_max;
                const float weight = detail::exp_difference(score, new_max);
                const float sum = ctx.warp_sum(weight);
                if (lane < tile) scores[g * tile + lane] = weight;
                if (lane == 0) {
                    const float rescale = detail::exp_difference(old_max, new_max);
                    stats[g] = new_max;
                    stats[group + g] = stats[group + g] * rescale + sum;
                    stats[2 * group + g] = rescale;
                }
            }
            ctx.sync_block();
            KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) {
                const int j = thread + k * block_threads;
                if (j < group * dim) {
                    const int g = j / dim, d = j % dim;
                    float a = accumulators[k] * stats[2 * group + g];
                    for (int t = 0; t < n; ++t) a += scores[g * tile + t] * values[t * dim + d];
                    accumulators[k] = a;
                }
            }
            ctx.sync_block();
            v += n;
        }

        KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) {  // normalise into the query buffer, then write rows whole
            const int j = thread + k * block_threads;
            if (j < group * dim) {
                const float sum = stats[group + j / dim];
                queries[j] = sum > 0.0f ? accumulators[k] / sum : 0.0f;
            }
        }
        ctx.sync_block();
        for (int i = thread; i < group * dim / 8; i += block_threads) {
            const int g = i / (dim / 8), c = (i % (dim / 8)) * 8;
            float x[8];
            for (int j = 0; j < 8; ++j) x[j] = queries[g * dim + c + j];
            if (p.splits == 1)
                detail::store8(ctx, p.outputs + (first_row + g) * dim + c, x);
            else
                detail::store8(ctx, p.partial_outputs + ((first_row + g) * p.splits + split) * dim + c, x);
        }
        for (int g = thread; g < group; g += block_threads) {
            const float sum = stats[group + g];
            const float lse = sum > 0.0f ? stats[g] + ::logf(sum) : detail::negative_infinity();
            if (p.splits == 1) {
                if (p.lse) p.lse[first_row + g] = lse;
            } else {
                p.partial_lse[(first_row + g) * p.splits + split] = lse;
            }
        }
    }
};

}  // namespace kvcache
