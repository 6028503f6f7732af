// Decode attention body: block (split, kv_head, sequence) serves all the query
// heads of one GQA group from a single pass over its share of that KV head's
// keys. Keys and values go through shared memory a tile at a time (tiles never
// cross a layout run); scores and the online softmax are FP32.
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/kernels/detail/attention_tile.hpp"
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

/// Query heads a decode block holds for a dynamic head configuration: a GQA
/// group larger than this takes several blocks (each reads the keys once).
inline constexpr int decode_dynamic_rows = 4;

/// The decode body. Grid: (splits, kv_heads x blocks_per_kv_head(view), batch);
/// shared memory: shared_bytes. A compiled configuration's block holds its whole
/// GQA group; a dynamic one's holds up to decode_dynamic_rows heads of it.
/// @tparam Layout a layout view
/// @tparam Query float, kvcache::half or kvcache::bfloat16 (queries and outputs)
template <class Layout, class Query>
struct decode_kernel {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    static constexpr const char* name = "decode_attention";
    static constexpr int block_threads = 128;
    static constexpr int dim = heads::head_dim;
    static constexpr bool compiled_group = heads::static_counts;
    /// Query rows of a block: the whole group, or up to decode_dynamic_rows of a dynamic one.
    static constexpr int group = detail::static_group_size_or<heads>(decode_dynamic_rows);
    static constexpr int tile = attention_tile_keys(dim);
    // A dynamic block's rows are heads of one token: each row is its own "token" of the tile, so
    // rows past the group's end are masked the way tokens past a tile's end are.
    using tile_step = detail::attention_tile<group, compiled_group ? group : 1, dim, tile, block_threads,
                                            is_row_quantised_v<key_element_t<element>>,
                                            is_row_quantised_v<value_element_t<element>>>;
    static constexpr int per_thread = tile_step::per_thread;
    /// Dynamic shared memory a launch needs.
    static constexpr std::size_t shared_bytes = tile_step::shared_bytes;

    /// Blocks along grid y per KV head: 1 when the group is compiled.
    KVCACHE_HOST_DEVICE static constexpr int blocks_per_kv_head(const Layout& view) noexcept {
        if constexpr (compiled_group) return 1;
        else return (view.group_size() + group - 1) / group;
    }
    /// Blocks along grid y: every KV head's.
    KVCACHE_HOST_DEVICE static constexpr int grid_y(const Layout& view) noexcept {
        return view.kv_heads() * blocks_per_kv_head(view);
    }

    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const decode_kernel_params<Layout, Query>& p) const {
        const int split = ctx.block_index().x, sequence = ctx.block_index().z;
        const int per_kv = blocks_per_kv_head(p.view);
        const int kv = ctx.block_index().y / per_kv, first_head = (ctx.block_index().y % per_kv) * group;
        const int group_size = p.view.group_size();
        const int rows = compiled_group ? group : (group_size - first_head < group ? group_size - first_head : group);
        const int thread = ctx.thread_index();
        auto queries = ctx.template shared_array<float>(tile_step::query_offset, group * dim);
        auto keys = ctx.template shared_array<float>(tile_step::key_offset, tile * tile_step::pitch);
        auto values = ctx.template shared_array<float>(tile_step::value_offset, tile * dim);
        auto scores = ctx.template shared_array<float>(tile_step::score_offset, group * tile);
        auto stats = ctx.template shared_array<float>(tile_step::stats_offset, 3 * group);  // max, sum, rescale

        const int length = p.view.length(sequence);
        const int visible = length > 0 ? p.view.visible_count(sequence) : 0;
        const int query_position = length - 1;
        int chunk = (visible + p.splits - 1) / p.splits;
        chunk = chunk < decode_min_split_keys ? decode_min_split_keys : chunk;
        chunk = (chunk + tile - 1) / tile * tile;
        const int begin = split * chunk < visible ? split * chunk : visible;
        const int end = begin + chunk < visible ? begin + chunk : visible;

        const std::size_t first_row =
            std::size_t(sequence) * p.view.query_heads() + std::size_t(kv) * group_size + first_head;
        const Query* query = p.queries + first_row * dim;
        const float query_scale = detail::folded_query_scale(p.view, p.scale);
        for (int i = thread; i < group * dim / 8; i += block_threads) {
            float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (compiled_group || i < rows * (dim / 8)) detail::load8(ctx, query + i * 8, x);
            for (int j = 0; j < 8; ++j) queries[i * 8 + j] = x[j] * query_scale;
        }
        float accumulators[per_thread];
        tile_step::reset(ctx, stats, accumulators);
        ctx.sync_block();

        const attention_visibility visibility = p.view.visibility();
        for (int v = begin; v < end;) {
            const position_run<element> run = p.view.run(sequence, kv, v);
            if (run.count <= 0) break;  // a layout bug; every thread sees the same run
            int n = run.count < end - v ? run.count : end - v;
            n = n < tile ? n : tile;
            tile_step::step(ctx, run, n, visibility, detail::single_query_position{query_position},
                            compiled_group ? 1 : rows, p.soft_cap, queries, keys, values, scores, stats,
                            accumulators);
            v += n;
        }

        tile_step::normalise(ctx, queries, stats, accumulators);  // then write rows whole
        const float value_scale = detail::output_scale(p.view);
        for (int i = thread; i < rows * (dim / 8); i += block_threads) {
            const int g = i / (dim / 8), c = (i % (dim / 8)) * 8;
            float x[8];
            for (int j = 0; j < 8; ++j) x[j] = queries[g * dim + c + j] * value_scale;
            if (p.splits == 1)
                detail::store8(ctx, p.outputs + (first_row + g) * dim + c, x);
            else
                detail::store8(ctx, p.partial_outputs + ((first_row + g) * p.splits + split) * dim + c, x);
        }
        for (int g = thread; g < rows; g += block_threads) {
            const float lse = tile_step::log_sum_exp(stats, g);
            if (p.splits == 1) {
                if (p.lse) p.lse[first_row + g] = lse;
            } else {
                p.partial_lse[(first_row + g) * p.splits + split] = lse;
            }
        }
    }
};

}  // namespace kvcache
