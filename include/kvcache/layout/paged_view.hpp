// The paged layout: a pool of fixed-size pages and a per-sequence page table
// in CSR form. Inside a page the owner's order is head-major,
// [kv_head][token_in_page][head_dim], separately for keys and values, so one
// KV head's rows in a page are contiguous (a run is up to a page long). The
// in-page order is a template parameter, so a view also reads pools laid out
// token-major, [token_in_page][kv_head][head_dim], as vLLM's and FlashInfer's
// NHD caches are; as a compile-time choice it costs the head-major kernels
// nothing (runtime in-page strides cost the sm_90 prefill 40 registers).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/layout/detail/compacted_rows.hpp"
#include "kvcache/layout/detail/view_rows.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

namespace detail {

/// log2(n) when n is a power of two, else -1; lets views divide by a shift.
KVCACHE_HOST_DEVICE constexpr int power_of_two_shift(int n) noexcept {
    if (n <= 0 || (n & (n - 1)) != 0) return -1;
    int shift = 0;
    while ((1 << shift) != n) ++shift;
    return shift;
}

/// A paged view's value plane stride: none of its own for one element type
/// (values share page_stride), value_page_stride for a kv_elements pair.
template <bool Pair>
struct paged_value_plane {};
template <>
struct paged_value_plane<true> {
    std::int64_t value_page_stride = 0;  ///< elements from one page's value plane to the next
};

}  // namespace detail

/// How a page orders its rows: head-major [kv_head][token_in_page][head_dim]
/// (paged_cache's, one KV head's rows contiguous) or token-major
/// [token_in_page][kv_head][head_dim] (vLLM's and FlashInfer's NHD).
enum class page_order : int { head_major = 0, token_major = 1 };

/// View of a batch of sequences stored in pages. Sequence i owns the pages
/// page_indices[page_offsets[i] .. page_offsets[i+1]); its position p lives in
/// page page_indices[page_offsets[i] + p / page_size] at row p % page_size.
/// Key row (page, kv_head, row) starts at keys[page * page_stride +
/// (kv_head * page_size + row) * head_dim] head-major, or at
/// keys[page * page_stride + (row * kv_heads + kv_head) * head_dim] token-major
/// (values alike; a kv_elements pair's values at value_page_stride, in rows
/// of their own type).
/// The page size is a runtime value: one compiled kernel serves every size.
///
/// Compacted sequences (paged_cache::compact): with `dropped` set, a
/// sequence stores visible_count = length - dropped[i] rows, visible index v
/// in storage row v (page v / page_size, row v % page_size). Its first
/// k = kept_offsets[i+1] - kept_offsets[i] rows hold the kept positions
/// kept_positions[kept_offsets[i] ..] (ascending); the rows after them hold
/// the consecutive positions appended since, so row v >= k holds position
/// v + dropped[i]. A sequence with dropped 0 and no kept positions is stored
/// as it was written (row == position); a null `dropped` means that for all.
/// @tparam Element stored element type (float, kvcache::half, kvcache::bfloat16, fp8 read through scales, qint8,
///         qint4, or a kv_elements pair; const for a read-only view)
/// @tparam Heads a head_config
/// @tparam Order the in-page order of rows
template <class Element, class Heads, page_order Order = page_order::head_major>
struct paged_view : detail::view_rows<paged_view<Element, Heads, Order>, Element>, detail::compacted_rows,
                    detail::paged_value_plane<is_kv_pair_v<Element>>, Heads {
    using element_type = Element;
    using key_type = key_element_t<Element>;      ///< what key rows hold
    using value_type = value_element_t<Element>;  ///< what value rows hold
    using heads = Heads;
    static constexpr layout_kind kind = layout_kind::paged;
    static constexpr page_order order = Order;  ///< the in-page order of rows

    // The head counts are a base (Heads): query_heads(), kv_heads(), group_size() are the
    // view's own, constants for a compiled configuration, which then adds no bytes.

    key_type* keys = nullptr;           ///< key plane of page 0
    value_type* values = nullptr;       ///< value plane of page 0
    const int* page_offsets = nullptr;  ///< sequences + 1 entries into page_indices
    const int* page_indices = nullptr;  ///< pool page ids, in position order per sequence
    const int* lengths = nullptr;       ///< tokens held by each batch entry
    // dropped, kept_offsets, kept_positions: the compaction tables, from detail::compacted_rows.
    int sequences = 0;                  ///< batch entries
    int page_size = 1;                  ///< tokens per page (>= 1)
    int page_shift = 0;                 ///< log2(page_size) when a power of two, else -1
    std::int64_t page_stride = 0;       ///< elements from one page's key plane to the next (>= kv_heads*page_size*head_dim); values alike, unless a pair
    // value_page_stride (a kv_elements pair only): from detail::paged_value_plane.
    kv_scales scales{};  ///< what stored keys and values are multiplied by when read (fp8); 1 and 1 for other types
    attention_visibility mask{};  ///< which present keys a query sees: a window and sinks (backends set it from attention_options)
    const std::int64_t* sequence_ids = nullptr;  ///< host memory, for messages only: the owner's id of entry i; null: none

    /// A view with page_shift derived and packed pages (page_stride =
    /// kv_heads * page_size * head_dim), as paged_cache stores them. Over a
    /// pool the caller owns (a token-major view over vLLM's blocks, say),
    /// page_offsets, page_indices and lengths are the caller's and must
    /// outlive the view; set page_stride afterwards for padded pages.
    KVCACHE_HOST_DEVICE static constexpr paged_view packed(key_type* keys, value_type* values, const int* page_offsets,
                                                           const int* page_indices, const int* lengths, int sequences,
                                                           int page_size, Heads heads = Heads{}) noexcept {
        paged_view v;
        v.keys = keys;
        v.values = values;
        v.page_offsets = page_offsets;
        v.page_indices = page_indices;
        v.lengths = lengths;
        v.sequences = sequences;
        v.page_size = page_size;
        v.page_shift = detail::power_of_two_shift(page_size);
        v.page_stride = std::int64_t(heads.kv_heads()) * page_size * row_elements<key_type>(Heads::head_dim);
        if constexpr (is_kv_pair_v<Element>)
            v.value_page_stride = std::int64_t(heads.kv_heads()) * page_size * row_elements<value_type>(Heads::head_dim);
        static_cast<Heads&>(v) = heads;
        return v;
    }

    KVCACHE_HOST_DEVICE int visible_count(int seq) const noexcept { return this->stored_count(seq, lengths[seq]); }
    KVCACHE_HOST_DEVICE int visible_position(int seq, int i) const noexcept { return this->position_at(seq, i); }
    /// Storage row (== visible index) of a present position: the position
    /// itself unless the sequence was compacted, then a binary search of its
    /// kept positions or, past them, position - dropped.
    KVCACHE_HOST_DEVICE int stored_row(int seq, int position) const noexcept { return this->row_of_position(seq, position); }

    /// Storage row / page_size (a shift for powers of two).
    KVCACHE_HOST_DEVICE int page_of(int row) const noexcept {
        return page_shift >= 0 ? row >> page_shift : row / page_size;
    }
    /// Storage row % page_size.
    KVCACHE_HOST_DEVICE int row_of(int row) const noexcept {
        return page_shift >= 0 ? row & (page_size - 1) : row % page_size;
    }
    /// Pool page id holding the sequence's position.
    KVCACHE_HOST_DEVICE int page(int seq, int position) const noexcept { return page_at(seq, stored_row(seq, position)); }
    /// Element offset of row (seq, kv_head, position) from keys (and from values, unless a pair).
    KVCACHE_HOST_DEVICE std::int64_t offset(int seq, int kv_head, int position) const noexcept {
        return row_offset(seq, kv_head, stored_row(seq, position));
    }
    /// A pair's value element offset of row (seq, kv_head, position) from values.
    KVCACHE_HOST_DEVICE std::int64_t value_offset(int seq, int kv_head, int position) const noexcept {
        return value_row_offset(seq, kv_head, stored_row(seq, position));
    }
    /// Pool page id holding storage row `row` of the sequence.
    KVCACHE_HOST_DEVICE int page_at(int seq, int row) const noexcept { return page_indices[page_offsets[seq] + page_of(row)]; }
    /// Element offset of storage row `row` of (seq, kv_head) from keys (and values, unless a pair).
    KVCACHE_HOST_DEVICE std::int64_t row_offset(int seq, int kv_head, int row) const noexcept {
        return plane_offset(seq, kv_head, row, page_stride, row_elements<key_type>(Heads::head_dim));
    }
    /// A pair's value element offset of storage row `row` of (seq, kv_head) from values.
    KVCACHE_HOST_DEVICE std::int64_t value_row_offset(int seq, int kv_head, int row) const noexcept {
        if constexpr (is_kv_pair_v<Element>)
            return plane_offset(seq, kv_head, row, this->value_page_stride, row_elements<value_type>(Heads::head_dim));
        else
            return row_offset(seq, kv_head, row);
    }
    /// Elements from one (key) row of a page to the next.
    KVCACHE_HOST_DEVICE constexpr int row_stride() const noexcept { return rows_apart(row_elements<key_type>(Heads::head_dim)); }
    /// Value elements from one row of a page to the next.
    KVCACHE_HOST_DEVICE constexpr int value_row_stride() const noexcept {
        return rows_apart(row_elements<value_type>(Heads::head_dim));
    }

    /// From visible_begin to the end of its page (or of the sequence); in a
    /// compacted sequence's kept rows, also no further than its positions
    /// stay consecutive.
    KVCACHE_HOST_DEVICE position_run<Element> run(int seq, int kv_head, int visible_begin) const noexcept {
        const int n = visible_count(seq);
        const int p = visible_position(seq, visible_begin);
        if (visible_begin >= n) return this->no_rows(visible_begin, p, row_stride(), value_row_stride());
        const int to_page_end = page_size - row_of(visible_begin);
        const int count = this->consecutive_rows(seq, visible_begin, p, n - visible_begin < to_page_end ? n - visible_begin : to_page_end);
        position_run<Element> r = this->no_rows(visible_begin, p, row_stride(), value_row_stride());
        const std::int64_t at = row_offset(seq, kv_head, visible_begin);
        r.keys = this->keys + at;
        if constexpr (is_kv_pair_v<Element>) r.values = this->values + value_row_offset(seq, kv_head, visible_begin);
        else r.values = this->values + at;
        r.count = count;
        return r;
    }

    KVCACHE_HOST_DEVICE attention_visibility visibility() const noexcept { return mask; }

    /// Offset of storage row `row` of (seq, kv_head) in a plane whose pages
    /// are plane_stride elements apart and whose rows are row_length long.
    KVCACHE_HOST_DEVICE std::int64_t plane_offset(int seq, int kv_head, int row, std::int64_t plane_stride,
                                                  int row_length) const noexcept {
        if constexpr (Order == page_order::head_major)
            return page_at(seq, row) * plane_stride + (std::int64_t(kv_head) * page_size + row_of(row)) * row_length;
        else
            return page_at(seq, row) * plane_stride + (std::int64_t(row_of(row)) * this->kv_heads() + kv_head) * row_length;
    }
    /// Elements from one row of a page to the next, for rows row_length long.
    KVCACHE_HOST_DEVICE constexpr int rows_apart(int row_length) const noexcept {
        if constexpr (Order == page_order::head_major) return row_length;
        else return this->kv_heads() * row_length;
    }

    /// The same view over other key and value bases of the same element
    /// (const Element for a read-only view; see read_only()).
    /// @tparam To Element, or Element with const added or removed
    template <class To>
    KVCACHE_HOST_DEVICE constexpr paged_view<To, Heads, Order> with_elements(key_element_t<To>* new_keys,
                                                                             value_element_t<To>* new_values) const noexcept {
        static_assert(std::is_same_v<std::remove_const_t<To>, std::remove_const_t<Element>>,
                      "kvcache: with_elements changes only the elements' constness");
        auto v = paged_view<To, Heads, Order>::packed(new_keys, new_values, page_offsets, page_indices, lengths,
                                                      sequences, page_size, this->head_counts());
        v.page_stride = page_stride;
        if constexpr (is_kv_pair_v<Element>) v.value_page_stride = this->value_page_stride;
        v.dropped = dropped;
        v.kept_offsets = kept_offsets;
        v.kept_positions = kept_positions;
        v.mask = mask;
        v.scales = scales;
        v.sequence_ids = sequence_ids;
        return v;
    }
    /// This view with const elements: attention takes it, append does not compile.
    KVCACHE_HOST_DEVICE constexpr paged_view<const Element, Heads, Order> read_only() const noexcept {
        return with_elements<const Element>(keys, values);
    }
};

static_assert(is_layout_view_v<paged_view<float, head_config<1, 1, 8>>>, "paged_view must satisfy the layout interface");
static_assert(is_layout_view_v<paged_view<half, head_config<4, 2, 16>>>, "paged_view must satisfy the layout interface");
static_assert(is_layout_view_v<paged_view<const half, head_config<4, 2, 16>>>, "a read-only paged_view must satisfy the layout interface");
static_assert(is_layout_view_v<paged_view<half, head_config<4, 2, 16>, page_order::token_major>>,
              "a token-major paged_view must satisfy the layout interface");
static_assert(is_layout_view_v<paged_view<kv_elements<qint8, qint4>, head_config<4, 2, 32>>>,
              "a paged_view of a K/V pair must satisfy the layout interface");
static_assert(is_layout_view_v<paged_view<const kv_elements<half, qint4>, head_config<4, 2, 32>>>,
              "a read-only paged_view of a K/V pair must satisfy the layout interface");

/// A paged view over token-major pages, [page][token_in_page][kv_head][head_dim].
/// @tparam Element stored element type  @tparam Heads a head_config
template <class Element, class Heads>
using token_major_paged_view = paged_view<Element, Heads, page_order::token_major>;

}  // namespace kvcache
