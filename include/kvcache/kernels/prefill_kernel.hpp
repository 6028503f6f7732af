// Prefill (append) attention body: a block takes query tiles of one sequence
// and KV head — tile_tokens tokens times the group's query heads — and streams
// the visible keys through shared memory once per tile: the cached prefix and,
// causally, the chunk itself. Query tokens sit at the sequence's last
// positions, or where explicit query positions put them. FP32 online softmax
// per query row.
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/kernels/decode_kernel.hpp"
#include "kvcache/kernels/detail/attention_tile.hpp"
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
/// tiles x, x + grid.x, ... of its sequence's chunk. The chunk's query rows
/// for one KV head are (token, head of the group) pairs in that order; a tile
/// takes `rows` of them. A compiled group makes a tile whole tokens (row r:
/// token r / group, head r % group); a dynamic one lets a tile start and end
/// inside a token, each row then carrying its own position.
/// @tparam Layout a layout view
/// @tparam Query float, kvcache::half or kvcache::bfloat16 (queries and outputs)
template <class Layout, class Query>
struct prefill_kernel {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    static constexpr const char* name = "prefill_attention";
    static constexpr int block_threads = 128;
    static constexpr int dim = heads::head_dim;
    static constexpr bool compiled_group = heads::static_counts;
    /// Rows of one tile token: the group when compiled; 1 (a row is its own token) when dynamic.
    static constexpr int group = detail::static_group_size_or<heads>(1);
    static constexpr int tile_tokens =
        prefill_target_rows(dim) / group < 1 ? 1 : prefill_target_rows(dim) / group;  ///< tile tokens per tile
    static constexpr int rows = tile_tokens * group;  ///< query rows of a tile
    static constexpr int tile = attention_tile_keys(dim);
    using tile_step = detail::attention_tile<rows, group, dim, tile, block_threads,
                                             is_row_quantised_v<key_element_t<element>>,
                                             is_row_quantised_v<value_element_t<element>>>;
    static constexpr int per_thread = tile_step::per_thread;
    /// Dynamic shared memory a launch needs.
    static constexpr std::size_t shared_bytes = tile_step::shared_bytes;

    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const prefill_kernel_params<Layout, Query>& p) const {
        const int kv = ctx.block_index().y, sequence = ctx.block_index().z;
        const int chunk = p.query_offsets[sequence + 1] - p.query_offsets[sequence];
        const int length = p.view.length(sequence);
        const int visible = chunk > 0 ? p.view.visible_count(sequence) : 0;
        const attention_visibility visibility = p.view.visibility();
        if constexpr (compiled_group) {  // tiles of whole tokens
            for (int first = ctx.block_index().x * tile_tokens; first < chunk; first += ctx.grid_size().x * tile_tokens) {
                const int tokens = chunk - first < tile_tokens ? chunk - first : tile_tokens;
                attend_tile(ctx, p, sequence, kv, length - chunk + first, p.query_offsets[sequence] + first, 0,
                            tokens * group, visible, visibility);
            }
        } else {  // tiles of (token, head) rows
            const int group_size = group_rows(p.view);
            const int chunk_rows = chunk * group_size;
            for (int first = ctx.block_index().x * rows; first < chunk_rows; first += ctx.grid_size().x * rows) {
                const int count = chunk_rows - first < rows ? chunk_rows - first : rows;
                const int token = first / group_size;
                attend_tile(ctx, p, sequence, kv, length - chunk + token, p.query_offsets[sequence] + token,
                            first - token * group_size, count, visible, visibility);
            }
        }
    }

private:
    /// Query rows of one token: the group size.
    KVCACHE_HOST_DEVICE static constexpr int group_rows(const Layout& view) noexcept {
        if constexpr (compiled_group) return group;
        else return view.group_size();
    }

    /// count rows from head first_head of the token first_token (of the batch) at first_position.
    template <class Context>
    KVCACHE_HOST_DEVICE void attend_tile(Context& ctx, const prefill_kernel_params<Layout, Query>& p, int sequence, int kv,
                                         int first_position, int first_token, int first_head, int count, int visible,
                                         const attention_visibility& visibility) const {
        const int thread = ctx.thread_index();
        const int group_size = group_rows(p.view);
        // Row r: token token_of(r) of the tile, head head_of(r) of the group (first_head is 0 when compiled).
        const auto token_of = [&](int r) { return compiled_group ? r / group : (first_head + r) / group_size; };
        const auto head_of = [&](int r) { return compiled_group ? r % group : (first_head + r) % group_size; };
        const int tokens = count / group;  // tile tokens: whole tokens when compiled, rows when dynamic
        auto queries = ctx.template shared_array<float>(tile_step::query_offset, rows * dim);
        auto keys = ctx.template shared_array<float>(tile_step::key_offset, tile * tile_step::pitch);
        auto values = ctx.template shared_array<float>(tile_step::value_offset, tile * dim);
        auto scores = ctx.template shared_array<float>(tile_step::score_offset, rows * tile);
        auto stats = ctx.template shared_array<float>(tile_step::stats_offset, 3 * rows);
        auto positions = ctx.template shared_array<int>(tile_step::position_offset, rows + 2);  // + lowest, highest
        if (p.query_positions)  // two loops: one select per token costs the consecutive case registers
            for (int t = thread; t < tokens; t += block_threads) positions[t] = p.query_positions[first_token + token_of(t * group)];
        else
            for (int t = thread; t < tokens; t += block_threads) positions[t] = first_position + token_of(t * group);
        if (thread == 0) {  // the ends, for the skips below; explicit positions may sit anywhere, so they skip nothing
            positions[rows] = p.query_positions ? 0 : first_position + token_of(0);
            positions[rows + 1] = p.query_positions ? 0x7fffffff : first_position + token_of(count - 1);
        }
        // Rows of one token are the group's heads, contiguous in the input.
        const std::size_t query_heads = std::size_t(p.view.query_heads()), kv_first_head = std::size_t(kv) * group_size;
        const float query_scale = detail::folded_query_scale(p.view, p.scale);
        for (int i = thread; i < rows * (dim / 8); i += block_threads) {
            const int r = i / (dim / 8), c = (i % (dim / 8)) * 8;
            float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (r < count)
                detail::load8(ctx, p.queries + ((first_token + token_of(r)) * query_heads + kv_first_head + head_of(r)) * dim + c, x);
            for (int j = 0; j < 8; ++j) queries[r * dim + c + j] = x[j] * query_scale;
        }
        float accumulators[per_thread];
        tile_step::reset(ctx, stats, accumulators);
        ctx.sync_block();

        for (int v = 0; v < visible;) {
            const position_run<element> run = p.view.run(sequence, kv, v);
            if (run.count <= 0 || run.first_position > positions[rows + 1]) break;  // keys ascend: none later is seen
            int n = run.count < visible - v ? run.count : visible - v;
            n = n < tile ? n : tile;
            // Skip a tile every row's window has left behind (uniform: no barrier is skipped by part of the block).
            const bool behind = visibility.window > 0 && run.first_position >= visibility.sinks &&
                                run.first_position + n - 1 <= positions[rows] - visibility.window;
            if (behind) {
                v += n;
                continue;
            }
            tile_step::step(ctx, run, n, visibility, positions, tokens, p.soft_cap, queries, keys, values, scores,
                            stats, accumulators);
            v += n;
        }

        tile_step::normalise(ctx, queries, stats, accumulators);
        const float value_scale = detail::output_scale(p.view);
        for (int i = thread; i < count * (dim / 8); i += block_threads) {
            const int r = i / (dim / 8), c = (i % (dim / 8)) * 8;
            float x[8];
            for (int j = 0; j < 8; ++j) x[j] = queries[r * dim + c + j] * value_scale;
            detail::store8(ctx, p.outputs + ((first_token + token_of(r)) * query_heads + kv_first_head + head_of(r)) * dim + c, x);
        }
        for (int r = thread; r < count; r += block_threads) {
            if (!p.lse) break;
            p.lse[(first_token + token_of(r)) * query_heads + kv_first_head + head_of(r)] = tile_step::log_sum_exp(stats, r);
        }
        ctx.sync_block();  // the next tile reuses the query buffer
    }
};

}  // namespace kvcache
