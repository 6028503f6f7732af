// What one attention call moves and computes, counted on the host so the CPU
// and CUDA benches (and bench/peers) divide by the same numbers, and so the
// counts themselves are tested (bench/tests/attention_counts_test.cpp)
// without a GPU. Bytes are what a kernel must touch at least: it is the
// memory roofline the "fraction of copy bandwidth" columns compare against.
#pragma once

#include <cstddef>

#include "kvcache/core/element.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache::bench {

/// The shape of one decode or prefill call.
struct attention_shape {
    layout_kind layout = layout_kind::paged;
    element_kind element = element_kind::fp16;  ///< the cache's stored type
    int batch = 1;                              ///< sequences in the call
    int query_heads = 32;
    int kv_heads = 8;
    int head_dim = 128;
    int visible = 1024;    ///< keys each decode query sees (the context)
    int page_size = 16;    ///< tokens per page (paged layout only)
};

/// Bytes of one query/output element: the cache's type, half for an fp8,
/// int8 or int4 cache (they sit under 16-bit activations), float for fp32.
inline std::size_t activation_size(element_kind element) noexcept {
    return is_scaled_kind(element) || element == element_kind::int8 || element == element_kind::int4
               ? 2
               : static_cast<std::size_t>(element_size(element));
}

/// Bytes of K and V one decode step reads: every visible row of every KV
/// head, once, as stored (an int8 row's scale included).
inline std::size_t decode_kv_bytes(const attention_shape& s) noexcept {
    return std::size_t(s.batch) * std::size_t(s.visible) * 2 * std::size_t(s.kv_heads) *
           std::size_t(stored_row_bytes(s.element, s.head_dim));  // core/element.hpp: an int8 row's scale included
}

/// Bytes a decode step moves at least: K/V (decode_kv_bytes), the fp8 scales
/// (one float each for K and V), the queries read and the outputs written,
/// each sequence's length, and a paged view's page table entries (one int per page).
inline std::size_t decode_bytes(const attention_shape& s) noexcept {
    const std::size_t scales = is_scaled_kind(s.element) ? 2 * sizeof(float) : 0;
    const std::size_t q_and_o =
        2 * std::size_t(s.batch) * std::size_t(s.query_heads) * std::size_t(s.head_dim) * activation_size(s.element);
    const std::size_t lengths = std::size_t(s.batch) * sizeof(int);
    const std::size_t pages_per_sequence =
        s.layout == layout_kind::paged ? (std::size_t(s.visible) + std::size_t(s.page_size) - 1) / std::size_t(s.page_size) : 0;
    const std::size_t tables = std::size_t(s.batch) * pages_per_sequence * sizeof(int);
    return decode_kv_bytes(s) + scales + q_and_o + lengths + tables;
}

/// Bytes an append of `tokens` new rows per sequence moves: the K and V rows
/// read in the activation type and written in the stored type (an int8
/// row's scale included).
inline std::size_t append_bytes(const attention_shape& s, int tokens) noexcept {
    const std::size_t rows = std::size_t(s.batch) * std::size_t(tokens) * 2 * std::size_t(s.kv_heads);
    return rows * (std::size_t(s.head_dim) * activation_size(s.element) + std::size_t(stored_row_bytes(s.element, s.head_dim)));
}

/// Keys a causal chunk of `chunk` queries after `prefix` cached tokens sees
/// in all: query i (0-based) sees prefix + i + 1 keys.
inline double causal_keys_seen(int prefix, int chunk) noexcept {
    return double(chunk) * double(prefix) + double(chunk) * (double(chunk) + 1) / 2.0;
}

/// Floating-point operations of causal prefill attention for `batch`
/// sequences: QK^T and PV are head_dim multiply-adds (2 FLOPs each) per
/// visible key and query head each; softmax is not counted.
inline double prefill_flops(int batch, int query_heads, int head_dim, int prefix, int chunk) noexcept {
    return 4.0 * double(batch) * double(query_heads) * double(head_dim) * causal_keys_seen(prefix, chunk);
}

/// Bytes a device-to-device copy of `bytes` moves: each byte read once and written once.
inline double copy_bytes_moved(std::size_t bytes) noexcept { return 2.0 * double(bytes); }

}  // namespace kvcache::bench
