// Append body: writes each sequence's new tokens (its last n_b positions, or
// the positions the caller gives; space already reserved by the owner) into the layout, 8 elements per
// access, converting between the input and the storage element type (into fp8:
// divided by the layer's scale, then rounded to nearest even and saturated, as
// the host backends write it). Into int8 (qint8) a warp takes a whole row:
// its max|x| is a warp reduction, and the row comes out as core's
// quantise_row writes it, bit for bit (a max and a division are exact
// whichever lane computes them). Into int4 (qint4) a warp takes a whole row
// too: each group of 32 values is 4 lanes' pieces, its extremes a reduction
// over those lanes that keeps core's tie rule (the first of equal extremes,
// which matters for -0 against +0), then core's qint4_choose_group and
// qint4_code_of, so the row's bytes are quantise_row's bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/kernels/detail/vector_rows.hpp"
#include "kvcache/kernels/kernel_params.hpp"
#include "kvcache/kernels/new_tokens.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

/// The append body. Grid: (any x, kv_heads, batch); blocks along x share a
/// sequence's tokens (8 elements per thread; for qint8 and qint4 a row per warp).
/// Positions the layout already dropped are skipped.
/// @tparam Layout a layout view
/// @tparam Input float, kvcache::half or kvcache::bfloat16
template <class Layout, class Input>
struct append_kernel {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    static constexpr const char* name = "append";
    static constexpr int block_threads = 128;
    static constexpr std::size_t shared_bytes = 0;
    static constexpr int chunks = heads::head_dim / 8;  // 8-element pieces of a row

    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const append_kernel_params<Layout, Input>& p) const {
        const int kv = ctx.block_index().y, sequence = ctx.block_index().z;
        const int tokens = p.new_token_offsets[sequence + 1] - p.new_token_offsets[sequence];
        if (tokens <= 0) return;  // uniform across the block: no barrier follows
        const int length = p.view.length(sequence);
        // Explicit positions may name any present position: each is checked on its own.
        const int first = p.positions ? 0 : detail::first_present_new_token(p.view, sequence, tokens);
        // Each side as its type asks (a kv_elements pair's keys and values may differ):
        // int8 and int4 rows whole, a warp each, the other types 8 elements per thread.
        constexpr bool keys_whole = is_row_quantised_v<key_element_t<element>>;
        constexpr bool values_whole = is_row_quantised_v<value_element_t<element>>;
        if constexpr (!keys_whole || !values_whole)
            convert_pieces<!keys_whole, !values_whole>(ctx, p, kv, sequence, tokens, length, first);
        if constexpr (keys_whole || values_whole)
            quantise_rows<keys_whole, values_whole>(ctx, p, kv, sequence, tokens, length, first);
    }

private:
    // Token rows [first, tokens) of (sequence, kv), 8 elements per thread, of the sides asked for.
    template <bool Keys, bool Values, class Context>
    KVCACHE_HOST_DEVICE static void convert_pieces(Context& ctx, const append_kernel_params<Layout, Input>& p, int kv,
                                                   int sequence, int tokens, int length, int first) {
        const int items = (tokens - first) * chunks;
        const int stride = ctx.grid_size().x * block_threads;
        const kv_scales scales = scales_of(p.view);
        for (int i = ctx.block_index().x * block_threads + ctx.thread_index(); i < items; i += stride) {
            const int t = first + i / chunks, c = (i % chunks) * 8;
            const int row = p.new_token_offsets[sequence] + t;
            const int position = p.positions ? p.positions[row] : length - tokens + t;
            if (p.positions && !detail::is_present(p.view, sequence, position)) continue;
            const std::size_t source =
                (std::size_t(row) * p.view.kv_heads() + kv) * heads::head_dim + c;
            float x[8];
            if constexpr (Keys) {
                detail::load8(ctx, p.keys + source, x);
                store_scaled(ctx, p.view.key(sequence, kv, position) + c, x, scales.key);
            }
            if constexpr (Values) {
                detail::load8(ctx, p.values + source, x);
                store_scaled(ctx, p.view.value(sequence, kv, position) + c, x, scales.value);
            }
        }
    }

    static constexpr int warps = block_threads / 32;
    static constexpr int lane_chunks = (chunks + 31) / 32;  // 8-element pieces of a row per lane

    // Token rows [first, tokens) of (sequence, kv), one warp per token: its key row then its value row
    // (of the sides asked for).
    template <bool Keys, bool Values, class Context>
    KVCACHE_HOST_DEVICE static void quantise_rows(Context& ctx, const append_kernel_params<Layout, Input>& p, int kv,
                                                  int sequence, int tokens, int length, int first) {
        const int warp_stride = ctx.grid_size().x * warps;
        // The bounds and the skip below are the same for every lane of a warp, so its collectives stay whole.
        for (int t = first + ctx.block_index().x * warps + ctx.warp(); t < tokens; t += warp_stride) {
            const int row = p.new_token_offsets[sequence] + t;
            const int position = p.positions ? p.positions[row] : length - tokens + t;
            if (p.positions && !detail::is_present(p.view, sequence, position)) continue;
            const std::size_t source = (std::size_t(row) * p.view.kv_heads() + kv) * heads::head_dim;
            if constexpr (Keys) quantise_row_of_warp(ctx, p.keys + source, p.view.key(sequence, kv, position));
            if constexpr (Values) quantise_row_of_warp(ctx, p.values + source, p.view.value(sequence, kv, position));
        }
    }

    // Of two extremes of a group, the one of the lower lane unless the higher lane's is strictly
    // beyond it: quantise_row's left-to-right scan keeps the first of equal values, and taking the
    // lower lane's on ties makes the reduction that same scan regrouped.
    KVCACHE_HOST_DEVICE static float lower_of(float mine, float theirs, bool mine_first) {
        const float first = mine_first ? mine : theirs, second = mine_first ? theirs : mine;
        return second < first ? second : first;
    }
    KVCACHE_HOST_DEVICE static float higher_of(float mine, float theirs, bool mine_first) {
        const float first = mine_first ? mine : theirs, second = mine_first ? theirs : mine;
        return second > first ? second : first;
    }

    // quantise_row (core/int4.hpp) with the row spread over a warp: lane l holds pieces l + 32k of
    // 8 values, so group g (pieces 4g .. 4g+3) lies in 4 consecutive lanes, and two xor shuffles
    // (1, then 2) give all four the group's extremes. Lanes past the row hold +inf / -inf, which no
    // finite value ties. A row holding a NaN or an infinity, or one with a group whose minimum or
    // scale overflows a half, stores zero codes and NaN records in every group, as core does.
    template <class Context>
    KVCACHE_HOST_DEVICE static void quantise_row_of_warp(Context& ctx, const Input* in, qint4* out) {
        const float infinity = detail::bits_to_float(0x7f800000u);
        const int lane = ctx.lane();
        float x[lane_chunks][8] = {};
        qint4_group groups[lane_chunks] = {};
        bool finite = true;
        KVCACHE_UNROLL
        for (int k = 0; k < lane_chunks; ++k) {
            const int c = (lane + 32 * k) * 8;
            float lowest = infinity, highest = -infinity;
            if (c < heads::head_dim) {
                detail::load8(ctx, in + c, x[k]);
                lowest = highest = x[k][0];
                for (int j = 0; j < 8; ++j) {
                    if (!(fabsf(x[k][j]) <= 3.402823466e38f)) finite = false;  // NaN and infinities both fail
                    lowest = x[k][j] < lowest ? x[k][j] : lowest;
                    highest = x[k][j] > highest ? x[k][j] : highest;
                }
            }
            for (int mask = 1; mask < 4; mask <<= 1) {  // every lane: the shuffles are warp collectives
                const bool mine_first = (lane & mask) == 0;
                lowest = lower_of(lowest, ctx.shuffle_xor(lowest, mask), mine_first);
                highest = higher_of(highest, ctx.shuffle_xor(highest, mask), mine_first);
            }
            groups[k] = qint4_choose_group(lowest, highest);
            if (c < heads::head_dim && groups[k].scale != groups[k].scale) finite = false;
        }
        finite = !ctx.warp_any(!finite);
        KVCACHE_UNROLL
        for (int k = 0; k < lane_chunks; ++k) {
            const int piece = lane + 32 * k, c = piece * 8;
            if (c >= heads::head_dim) continue;
            for (int j = 0; j < 8; j += 2) {
                const int low = finite ? qint4_code_of(x[k][j], groups[k]) : 0;
                const int high = finite ? qint4_code_of(x[k][j + 1], groups[k]) : 0;
                out[(c + j) / 2].bits = std::uint8_t(low | (high << 4));
            }
            if (piece % 4 == 0)  // the group's first lane writes its record
                set_qint4_group(out, heads::head_dim, c / qint4_group_size,
                                finite ? groups[k] : qint4_group{detail::quiet_nan(), detail::quiet_nan()});
        }
    }

    // quantise_row (core/int8.hpp) with the row spread over a warp: scale = max|x| / 127, each value
    // x / scale rounded to nearest even and clamped to [-127, 127]; a zero row stores scale 0 and a
    // row holding a NaN or an infinity stores zeros and core's quiet NaN as its scale.
    template <class Context>
    KVCACHE_HOST_DEVICE static void quantise_row_of_warp(Context& ctx, const Input* in, qint8* out) {
        const int lane = ctx.lane();
        float x[lane_chunks][8] = {};  // zeroed: g++ cannot see that pieces past head_dim are never read
        float largest = 0.0f;
        bool finite = true;
        KVCACHE_UNROLL
        for (int k = 0; k < lane_chunks; ++k) {
            const int c = (lane + 32 * k) * 8;
            if (c >= heads::head_dim) continue;
            detail::load8(ctx, in + c, x[k]);
            for (int j = 0; j < 8; ++j) {
                const float a = fabsf(x[k][j]);
                if (!(a <= 3.402823466e38f)) finite = false;  // NaN and infinities both fail
                else if (a > largest) largest = a;
            }
        }
        largest = ctx.warp_max(largest);
        finite = !ctx.warp_any(!finite);
        const bool zeros = !finite || largest == 0.0f;
        const float scale = largest / 127.0f;
        KVCACHE_UNROLL
        for (int k = 0; k < lane_chunks; ++k) {
            const int c = (lane + 32 * k) * 8;
            if (c >= heads::head_dim) continue;
            for (int j = 0; j < 8; ++j) out[c + j] = zeros ? qint8{} : from_float<qint8>(x[k][j] / scale);
        }
        if (lane == 0) set_row_scale(out, heads::head_dim, !finite ? detail::bits_to_float(0x7fc00000u) : zeros ? 0.0f : scale);
    }

    // A division, not a multiply by the reciprocal: the stored byte is then
    // the one from_float_scaled gives, so every backend writes the same cache.
    template <class Context, class Stored>
    KVCACHE_HOST_DEVICE static void store_scaled(Context& ctx, Stored* p, float (&x)[8], float scale) {
        if constexpr (is_scaled_element_v<Stored>)
            for (int j = 0; j < 8; ++j) x[j] = x[j] / scale;
        detail::store8(ctx, p, x);
    }
};

}  // namespace kvcache
