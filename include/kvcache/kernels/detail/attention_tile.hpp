// The part decode and prefill attention share, written once: the shared-memory
// plan, and the loop step that takes one tile of keys and values (never crossing
// a layout run) through shared memory, scores it against the block's query rows,
// folds it into each row's online softmax (FP32) and into the accumulators.
// Row r is head r % Group of token r / Group; decode holds one token (Rows == Group).
// int8 rows (KeyScales, ValueScales) are widened to their integers in the tile; each row's
// scale goes to shared memory beside the tile and is applied once per (query
// row, key): a key's multiplies its logit, a value's its softmax weight (the
// running sum keeps the unscaled weight). int4 rows (row factors too) are
// dequantised in the tile loads with their groups' records (load_row8); their
// row factor is 1, or NaN for a row that reads NaN, whose values load as zeros.
// Every other type's NaN or infinite value row holds its NaN in its values: a
// tile with one is folded skipping the keys a row does not see (0 x NaN is
// NaN), found by a vote at the barrier that follows the loads, so clean tiles
// pay nothing.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcache/core/config.hpp"
#include "kvcache/kernels/detail/vector_rows.hpp"
#include "kvcache/kernels/softmax_math.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace detail {

/// The positions of a tile holding one query token (decode), as step() reads them.
struct single_query_position {
    int position;
    KVCACHE_HOST_DEVICE KVCACHE_FORCE_INLINE int operator[](int) const noexcept { return position; }
};

/// True when one of the 8 floats is a NaN or an infinity (read from the bits,
/// so no compiler flag about NaN can fold the test away).
KVCACHE_HOST_DEVICE KVCACHE_FORCE_INLINE bool any_non_finite8(const float (&x)[8]) noexcept {
    bool any = false;
    for (int j = 0; j < 8; ++j) {
        std::uint32_t bits;
        std::memcpy(&bits, &x[j], sizeof bits);
        any = any || (bits & 0x7f800000u) == 0x7f800000u;
    }
    return any;
}

/// What the queries are multiplied by: the softmax scale, times an fp8 cache's
/// key scale (every logit is linear in the keys), so the tile loads stay the
/// plain fp8 widenings.
/// @tparam Layout a layout view
template <class Layout>
KVCACHE_HOST_DEVICE KVCACHE_FORCE_INLINE float folded_query_scale(const Layout& view, float softmax_scale) {
    return softmax_scale * scales_of(view).key;
}

/// What the outputs (and split partial outputs, which the merge averages
/// linearly) are multiplied by: an fp8 cache's value scale; 1 otherwise.
/// @tparam Layout a layout view
template <class Layout>
KVCACHE_HOST_DEVICE KVCACHE_FORCE_INLINE float output_scale(const Layout& view) {
    return scales_of(view).value;
}

/// Shared-memory offsets and the per-tile steps of the attention bodies.
/// @tparam Rows query rows a block holds (tokens x Group)
/// @tparam Group query heads per KV head (the rows of one token)
/// @tparam Dim head dimension (a multiple of 8)
/// @tparam Tile keys per shared-memory tile (at most 32: one key per lane)
/// @tparam BlockThreads threads per block
/// @tparam KeyScales true when key rows carry their own factor (qint8: its
///         scale; qint4: 1, or NaN for a NaN row; see row_factor)
/// @tparam ValueScales the same for value rows (KeyScales but for a kv_elements pair)
template <int Rows, int Group, int Dim, int Tile, int BlockThreads, bool KeyScales = false,
          bool ValueScales = KeyScales>
struct attention_tile {
    static constexpr bool has_row_factors = KeyScales || ValueScales;  ///< either side carries row factors
    static constexpr int pitch = Dim + 1;  // key rows padded: the score loop reads a column across lanes
    static constexpr int per_thread = (Rows * Dim + BlockThreads - 1) / BlockThreads;
    static constexpr int row_scales_count = has_row_factors ? 2 * Tile : 0;  ///< floats of the row-scale region

    // Shared memory: queries (reused for the normalised outputs), key tile,
    // value tile, scores, and per-row max / sum / rescale factor.
    static constexpr std::size_t query_offset = 0;
    static constexpr std::size_t key_offset = align16(query_offset + sizeof(float) * Rows * Dim);
    static constexpr std::size_t value_offset = align16(key_offset + sizeof(float) * Tile * pitch);
    static constexpr std::size_t score_offset = align16(value_offset + sizeof(float) * Tile * Dim);
    static constexpr std::size_t stats_offset = align16(score_offset + sizeof(float) * Rows * Tile);
    /// The position of each query token of the tile (ints; at most Rows tokens),
    /// then the lowest and the highest: read from shared memory, so explicit and
    /// consecutive positions cost the same registers.
    static constexpr std::size_t position_offset = align16(stats_offset + sizeof(float) * 3 * Rows);
    /// The tile's row scales (has_row_factors only): Tile key scales, then Tile value scales.
    static constexpr std::size_t row_scale_offset = align16(position_offset + sizeof(int) * (Rows + 2));
    /// Dynamic shared memory a launch needs.
    static constexpr std::size_t shared_bytes =
        has_row_factors ? align16(row_scale_offset + sizeof(float) * 2 * Tile) : row_scale_offset;

    /// Every row's running max to -inf and sum to 0; this thread's accumulators to 0.
    /// The caller syncs the block before the first step.
    template <class Context, class Stats>
    KVCACHE_HOST_DEVICE KVCACHE_FORCE_INLINE static void reset(Context& ctx, Stats& stats,
                                                               float (&accumulators)[per_thread]) {
        for (int r = ctx.thread_index(); r < Rows; r += BlockThreads) {
            stats[r] = negative_infinity();
            stats[Rows + r] = 0.0f;
        }
        KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) accumulators[k] = 0.0f;
    }

    /// One tile: the first n (<= Tile) keys and values of run, seen by rows of
    /// tokens [0, tokens) at positions[token] (shared memory).
    template <class Context, class Element, class Positions, class Queries, class Keys, class Values, class Scores,
              class Stats>
    KVCACHE_HOST_DEVICE KVCACHE_FORCE_INLINE static void step(Context& ctx, const position_run<Element>& run, int n,
                                                              const attention_visibility& visibility,
                                                              const Positions& positions, int tokens,
                                                              float soft_cap,
                                                              Queries& queries, Keys& keys, Values& values,
                                                              Scores& scores, Stats& stats,
                                                              float (&accumulators)[per_thread]) {
        const int thread = ctx.thread_index(), lane = ctx.lane(), warp = ctx.warp(), warps = ctx.warp_count();
        auto row_scales = ctx.template shared_array<float>(row_scale_offset, row_scales_count);
        bool loaded_non_finite = false;  // a value piece this thread loaded holds a NaN or an infinity
        const int value_stride = value_stride_of(run);
        for (int i = thread; i < n * (Dim / 8); i += BlockThreads) {
            const int t = i / (Dim / 8), c = (i % (Dim / 8)) * 8;
            const auto* key = run.keys + std::size_t(t) * run.stride;
            const auto* value = run.values + std::size_t(t) * value_stride;
            float x[8];
            load_row8<Dim>(ctx, key, c, x);
            for (int j = 0; j < 8; ++j) keys[t * pitch + c + j] = x[j];
            load_row8<Dim>(ctx, value, c, x);
            for (int j = 0; j < 8; ++j) values[t * Dim + c + j] = x[j];
            if constexpr (KeyScales) {
                if (c == 0) row_scales[t] = row_factor<Dim>(key);  // the thread of the row's first piece
            }
            if constexpr (ValueScales) {
                if (c == 0) row_scales[Tile + t] = row_factor<Dim>(value);
            } else {
                loaded_non_finite = loaded_non_finite || any_non_finite8(x);
            }
        }
        // The rows of query token `token` see key t of the run: the scores and a
        // non-finite tile's values ask the same question.
        const auto sees = [&](int token, int t) {
            return token < tokens && visibility.allows(positions[token], run.first_position + t);
        };
        // True in every thread when the tile holds a NaN or infinite value (never for
        // ValueScales types: their rows' NaN is in the row factor, applied to nonzero weights only).
        bool tile_non_finite = false;
        if constexpr (ValueScales) ctx.sync_block();
        else tile_non_finite = ctx.sync_block_or(loaded_non_finite);
        for (int i = thread; i < Rows * Tile; i += BlockThreads) {
            const int r = i / Tile, t = i % Tile, token = r / Group;
            float score = negative_infinity();
            if (t < n && sees(token, t)) {
                float dot = 0.0f;
                for (int d = 0; d < Dim; ++d) dot += queries[r * Dim + d] * keys[t * pitch + d];
                if constexpr (KeyScales) dot *= row_scales[t];
                score = apply_soft_cap(dot, soft_cap);
            }
            scores[i] = score;
        }
        ctx.sync_block();
        for (int r = warp; r < Rows; r += warps) {  // one warp per row: running max and sum
            const float old_max = stats[r];
            const float score = lane < Tile ? scores[r * Tile + lane] : negative_infinity();
            const float block_max = ctx.warp_max(score);
            const float new_max = block_max > old_max ? block_max : old_max;
            const float weight = exp_difference(score, new_max);
            const float sum = ctx.warp_sum(weight);
            if constexpr (ValueScales) {
                // A weight of 0 (a key this row does not see, a slot past the tile) stays 0: a
                // NaN scale (a row that held a NaN) must not reach rows that never see it.
                if (lane < Tile) scores[r * Tile + lane] = weight != 0.0f ? weight * row_scales[Tile + lane] : 0.0f;
            } else {
                if (lane < Tile) scores[r * Tile + lane] = weight;
            }
            if (lane == 0) {
                const float rescale = exp_difference(old_max, new_max);
                stats[r] = new_max;
                stats[Rows + r] = stats[Rows + r] * rescale + sum;
                stats[2 * Rows + r] = rescale;
            }
        }
        ctx.sync_block();
        KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) {
            const int j = thread + k * BlockThreads;
            if (j < Rows * Dim) {
                const int r = j / Dim, d = j % Dim;
                float a = accumulators[k] * stats[2 * Rows + r];
                if (!tile_non_finite) {
                    for (int t = 0; t < n; ++t) a += scores[r * Tile + t] * values[t * Dim + d];
                } else {  // only the keys the row sees: 0 x NaN would reach the others
                    const int token = r / Group;
                    for (int t = 0; t < n; ++t)
                        if (sees(token, t))
                            a += scores[r * Tile + t] * values[t * Dim + d];
                }
                accumulators[k] = a;
            }
        }
        ctx.sync_block();
    }

    /// Normalised outputs into the query buffer (rows with no visible key give 0;
    /// a NaN sum, from a visible key that read as NaN, gives NaN as the reference
    /// does), then a block sync.
    template <class Context, class Queries, class Stats>
    KVCACHE_HOST_DEVICE KVCACHE_FORCE_INLINE static void normalise(Context& ctx, Queries& queries, Stats& stats,
                                                                   const float (&accumulators)[per_thread]) {
        const int thread = ctx.thread_index();
        KVCACHE_UNROLL
        for (int k = 0; k < per_thread; ++k) {
            const int j = thread + k * BlockThreads;
            if (j < Rows * Dim) {
                const float sum = stats[Rows + j / Dim];
                queries[j] = sum == 0.0f ? 0.0f : accumulators[k] / sum;
            }
        }
        ctx.sync_block();
    }

    /// Row r's log-sum-exp of its scores; -inf when it saw no key, NaN when a score was NaN.
    template <class Stats>
    KVCACHE_HOST_DEVICE KVCACHE_FORCE_INLINE static float log_sum_exp(Stats& stats, int r) {
        return kvcache::detail::log_sum_exp(stats[r], stats[Rows + r]);
    }
};

}  // namespace detail
}  // namespace kvcache
