// Append body: writes each sequence's new tokens (its last n_b positions, or
// the positions the caller gives; space already reserved by the owner) into the layout, 8 elements per
// access, converting between the input and the storage element type (into fp8:
// divided by the layer's scale, then rounded to nearest even and saturated, as
// the host backends write it).
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/kernels/detail/vector_rows.hpp"
#include "kvcache/kernels/kernel_params.hpp"
#include "kvcache/kernels/new_tokens.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

/// The append body. Grid: (any x, kv_heads, batch); blocks along x share a
/// sequence's tokens. Positions the layout already dropped are skipped.
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
            detail::load8(ctx, p.keys + source, x);
            store_scaled(ctx, p.view.key(sequence, kv, position) + c, x, scales.key);
            detail::load8(ctx, p.values + source, x);
            store_scaled(ctx, p.view.value(sequence, kv, position) + c, x, scales.value);
        }
    }

private:
    // A division, not a multiply by the reciprocal: the stored byte is then
    // the one from_float_scaled gives, so every backend writes the same cache.
    template <class Context>
    KVCACHE_HOST_DEVICE static void store_scaled(Context& ctx, element* p, float (&x)[8], float scale) {
        if constexpr (is_scaled_element_v<element>)
            for (int j = 0; j < 8; ++j) x[j] = x[j] / scale;
        detail::store8(ctx, p, x);
    }
};

}  // namespace kvcache
