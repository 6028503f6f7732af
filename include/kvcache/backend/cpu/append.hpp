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
    using element = typename Layout::element_type;
    constexpr int dim = heads::head_dim;
    const int batch = view.sequence_count();
    if (batch == 0) return;
    const kv_scales scales = scales_of(view);
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
            element* key = view.key(b, kv, position);
            element* value = view.value(b, kv, position);
            if constexpr (is_row_quantised_v<element>) {
                // Each row (int4: each group of 32) gets its own scale, exactly as the owners' append quantises it.
                quantise_row([&](int d) { return to_float(keys[source + std::size_t(d)]); }, dim, key);
                quantise_row([&](int d) { return to_float(values[source + std::size_t(d)]); }, dim, value);
            } else if constexpr (std::is_same_v<element, Input>) {
                for (int d = 0; d < dim; ++d) key[d] = keys[source + d];
                for (int d = 0; d < dim; ++d) value[d] = values[source + d];
            } else {
                for (int d = 0; d < dim; ++d) key[d] = from_float_scaled<element>(to_float(keys[source + d]), scales.key);
                for (int d = 0; d < dim; ++d)
                    value[d] = from_float_scaled<element>(to_float(values[source + d]), scales.value);
            }
        }
    });
}

}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
