// Moving token rows between host arrays laid out [token][kv_head][head_dim]
// and cache storage, where each KV head's rows are contiguous. Rows are
// regrouped on the host first so each head is one copy (one cudaMemcpy on
// device memory rather than one per row); the regrouping alone serves page
// files, which hold token-major rows of head-major pages.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvcache/core/stored_row.hpp"
#include "kvcache/core/memory.hpp"

namespace kvcache {
namespace detail {

/// Host rows [token][kv_head][row] of n tokens to head-major planes
/// [kv_head][token][row], as a pool page holds them.
/// @tparam Element stored element type
template <class Element>
void token_rows_to_planes(const Element* rows, Element* planes, int n, int kv, int row) {
    for (int h = 0; h < kv; ++h)
        for (int t = 0; t < n; ++t)
            std::copy_n(rows + (std::size_t(t) * kv + h) * row, row, planes + (std::size_t(h) * n + t) * row);
}

/// The reverse of token_rows_to_planes.
/// @tparam Element stored element type
template <class Element>
void planes_to_token_rows(const Element* planes, Element* rows, int n, int kv, int row) {
    for (int h = 0; h < kv; ++h)
        for (int t = 0; t < n; ++t)
            std::copy_n(planes + (std::size_t(h) * n + t) * row, row, rows + (std::size_t(t) * kv + h) * row);
}

/// Copies n tokens' rows from host source [token][kv_head][head_dim] to
/// storage where head h (of kv_heads) has its first row at destination + h * head_stride.
/// @tparam Element stored element type
/// @tparam Heads a head_config
/// @tparam Memory memory-space policy of the destination
template <class Element, class Heads, class Memory>
void scatter_rows(Element* destination, std::int64_t head_stride, const Element* source, int n, int kv) {
    if (n <= 0) return;
    constexpr int dim = row_elements<Element>(Heads::head_dim);
    std::vector<Element> staging(std::size_t(n) * dim);
    for (int h = 0; h < kv; ++h) {
        for (int t = 0; t < n; ++t)
            std::copy_n(source + (std::size_t(t) * kv + h) * dim, dim, staging.data() + std::size_t(t) * dim);
        Memory::copy_from_host(destination + h * head_stride, staging.data(), staging.size() * sizeof(Element));
    }
}

/// The reverse of scatter_rows: storage rows to host [token][kv_head][head_dim].
/// @tparam Element stored element type
/// @tparam Heads a head_config
/// @tparam Memory memory-space policy of the source
template <class Element, class Heads, class Memory>
void gather_rows(Element* destination, const Element* source, std::int64_t head_stride, int n, int kv) {
    if (n <= 0) return;
    constexpr int dim = row_elements<Element>(Heads::head_dim);
    std::vector<Element> staging(std::size_t(n) * dim);
    for (int h = 0; h < kv; ++h) {
        Memory::copy_to_host(staging.data(), source + h * head_stride, staging.size() * sizeof(Element));
        for (int t = 0; t < n; ++t)
            std::copy_n(staging.data() + std::size_t(t) * dim, dim, destination + (std::size_t(t) * kv + h) * dim);
    }
}

}  // namespace detail
}  // namespace kvcache
