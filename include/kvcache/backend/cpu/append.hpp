// CPU append: writes new tokens' K/V rows into space the owner reserved.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kvcache/backend/cpu/thread_pool.hpp"
#include "kvcache/backend/detail/call_checks.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/kernels/new_tokens.hpp"

namespace kvcache {
namespace cpu {

/// Writes the K/V rows of each sequence's new tokens (its last n_b positions);
/// positions the layout already dropped (a chunk longer than a sliding window)
/// are skipped. keys/values: [total new tokens][kv_heads][head_dim] of float
/// or kvcache::half (converted to the stored type); new_token_offsets: batch
/// + 1 entries from 0. Sizes are checked before anything is written.
/// @tparam Layout a layout view over host memory
/// @tparam Keys a sized buffer of float or kvcache::half
/// @tparam Values a sized buffer of the same element type
/// @tparam Offsets a sized buffer of int
template <class Layout, class Keys, class Values, class Offsets>
void append(const Layout& view, const Keys& key_rows, const Values& value_rows, const Offsets& offsets) {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    using Input = kvcache::detail::range_element_t<Keys>;
    kvcache::detail::check_element_types<Input, kvcache::detail::range_element_t<Values>>();
    constexpr int dim = heads::head_dim;
    const span<const Input> keys = make_span(key_rows), values = make_span(value_rows);
    const span<const int> new_token_offsets = make_span(offsets);
    kvcache::detail::check_append(view, keys.size(), values.size(), new_token_offsets, true);
    const int batch = view.sequence_count();
    if (batch == 0) return;
    detail::thread_pool::instance().parallel_for(batch * heads::kv_heads, [&](int item) {
        const int b = item / heads::kv_heads, kv = item % heads::kv_heads;
        const int tokens = new_token_offsets[b + 1] - new_token_offsets[b];
        const int length = view.length(b);
        const int first_present = kvcache::detail::first_present_new_token(view, b, tokens);
        for (int t = first_present; t < tokens; ++t) {
            const int position = length - tokens + t;
            const std::size_t source = (std::size_t(new_token_offsets[b] + t) * heads::kv_heads + kv) * dim;
            element* key = view.key(b, kv, position);
            element* value = view.value(b, kv, position);
            if constexpr (std::is_same_v<element, Input>) {
                for (int d = 0; d < dim; ++d) key[d] = keys[source + d];
                for (int d = 0; d < dim; ++d) value[d] = values[source + d];
            } else {
                for (int d = 0; d < dim; ++d) key[d] = from_float<element>(to_float(keys[source + d]));
                for (int d = 0; d < dim; ++d) value[d] = from_float<element>(to_float(values[source + d]));
            }
        }
    });
}

}  // namespace cpu
}  // namespace kvcache
