// CPU append: writes new tokens' K/V rows into space the owner reserved.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kvcache/backend/cpu/thread_pool.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/kernels/new_tokens.hpp"

namespace kvcache {
namespace cpu {

namespace detail {

/// Writes the K/V rows of each sequence's new tokens (see append_params),
/// threaded across (sequence, KV head) on pool; the call was checked.
template <class Layout, class Input>
void append(thread_pool& pool, const Layout& view, const Input* keys, const Input* values,
            const int* new_token_offsets, const int* positions) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim;
    const int batch = view.sequence_count();
    if (batch == 0) return;
    const kv_scales scales = scales_of(view);
    // One row into its side's stored type (a kv_elements pair's keys and values differ):
    // copied when it is the input's, else store_row (int8 and int4 rows get their own scales,
    // exactly as the owners' append quantises them).
    const auto store = [](const Input* in, auto* out, float layer_scale) {
        using side = std::remove_pointer_t<decltype(out)>;
        if constexpr (std::is_same_v<side, Input>) {
            for (int d = 0; d < dim; ++d) out[d] = in[d];
        } else {
            store_row([&](int d) { return to_float(in[d]); }, dim, layer_scale, out);
        }
    };
    pool.parallel_for(batch * view.kv_heads(), [&](int item) {
        const int b = item / view.kv_heads(), kv = item % view.kv_heads();
        const int tokens = new_token_offsets[b + 1] - new_token_offsets[b];
        const int length = view.length(b);
        const int first_present = positions ? 0 : kvcache::detail::first_present_new_token(view, b, tokens);
        for (int t = first_present; t < tokens; ++t) {
            const int row = new_token_offsets[b] + t;
            const int position = positions ? positions[row] : length - tokens + t;
            if (positions && !kvcache::detail::is_present(view, b, position)) continue;
            const std::size_t source = (std::size_t(row) * view.kv_heads() + kv) * dim;
            store(keys + source, view.key(b, kv, position), scales.key);
            store(values + source, view.value(b, kv, position), scales.value);
        }
    });
}

}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
