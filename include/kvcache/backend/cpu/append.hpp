// CPU append: writes new tokens' K/V rows into space the owner reserved.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kvcache/backend/cpu/thread_pool.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/kernels/new_tokens.hpp"

namespace kvcache {
namespace cpu {

/// Writes the K/V rows of each sequence's new tokens (its last n_b positions);
/// positions the layout already dropped (a chunk longer than a sliding window)
/// are skipped. keys/values: [total new tokens][kv_heads][head_dim],
/// new_token_offsets[batch + 1].
/// @tparam Layout a layout view over host memory
/// @tparam Input float or kvcache::half
template <class Layout, class Input>
void append(const Layout& view, const Input* keys, const Input* values, const int* new_token_offsets) {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    constexpr int dim = heads::head_dim;
    const int batch = view.sequence_count();
    for (int b = 0; b < batch; ++b) {
        const int tokens = new_token_offsets[b + 1] - new_token_offsets[b];
        require(tokens >= 0 && tokens <= view.length(b), error_code::invalid_argument, "sequence ", b, " appends ",
                tokens, " tokens but its length is ", view.length(b));
    }
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
