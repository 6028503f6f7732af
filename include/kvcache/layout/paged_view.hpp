// The paged layout: a pool of fixed-size pages and a per-sequence page table
// in CSR form. Inside a page the owner's order is head-major,
// [kv_head][token_in_page][head_dim], separately for keys and values, so one
// KV head's rows in a page are contiguous (a run is up to a page long). The
// in-page strides are view fields, so a view also reads pools laid out
// token-major, [token_in_page][kv_head][head_dim], as vLLM's and FlashInfer's
// NHD caches are.
#pragma once

#include <cstdint>

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/heads.hpp"
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

}  // namespace detail

/// View of a batch of sequences stored in pages. Sequence i owns the pages
/// page_indices[page_offsets[i] .. page_offsets[i+1]); its position p lives in
/// page page_indices[page_offsets[i] + p / page_size] at row p % page_size.
/// Key row (page, kv_head, row) starts at
/// keys[page * page_stride + kv_head * head_stride + row * row_stride] (values alike);
/// packed() sets head_stride = page_size * head_dim and row_stride = head_dim,
/// token_major() head_stride = head_dim and row_stride = kv_heads * head_dim.
/// The page size is a runtime value: one compiled kernel serves every size.
/// @tparam Element stored element type (float or kvcache::half)
/// @tparam Heads a head_config
template <class Element, class Heads>
struct paged_view : detail::view_rows<paged_view<Element, Heads>, Element> {
    using element_type = Element;
    using heads = Heads;
    static constexpr layout_kind kind = layout_kind::paged;

    Element* keys = nullptr;            ///< key plane of page 0
    Element* values = nullptr;          ///< value plane of page 0
    const int* page_offsets = nullptr;  ///< sequences + 1 entries into page_indices
    const int* page_indices = nullptr;  ///< pool page ids, in position order per sequence
    const int* lengths = nullptr;       ///< tokens held by each batch entry
    int sequences = 0;                  ///< batch entries
    int page_size = 1;                  ///< tokens per page (>= 1)
    int page_shift = 0;                 ///< log2(page_size) when a power of two, else -1
    std::int64_t page_stride = 0;       ///< elements from one page's key plane to the next (>= kv_heads*page_size*head_dim)
    std::int64_t head_stride = 0;       ///< elements between KV heads inside a page
    int row_stride = 0;                 ///< elements between consecutive tokens of a page (>= head_dim)
    attention_visibility mask{};  ///< which present keys a query sees: a window and sinks (backends set it from attention_options)
    const std::int64_t* sequence_ids = nullptr;  ///< host memory, for messages only: the owner's id of entry i; null: none
    Heads head_counts{};  ///< the head counts: empty when compiled, the runtime values of a dynamic configuration

    /// A view with page_shift derived and packed head-major pages
    /// (page_stride = kv_heads * page_size * head_dim), as paged_cache stores them.
    KVCACHE_HOST_DEVICE static constexpr paged_view packed(Element* keys, Element* values, const int* page_offsets,
                                                           const int* page_indices, const int* lengths, int sequences,
                                                           int page_size, Heads heads = Heads{}) noexcept {
        paged_view v = with_table(keys, values, page_offsets, page_indices, lengths, sequences, page_size, heads);
        v.page_stride = std::int64_t(heads.kv_heads()) * page_size * Heads::head_dim;
        v.head_stride = std::int64_t(page_size) * Heads::head_dim;
        v.row_stride = Heads::head_dim;
        return v;
    }

    /// A view over a pool the caller owns whose pages are token-major,
    /// [page][token_in_page][kv_head][head_dim] for keys and again for values
    /// (vLLM's and FlashInfer's NHD order); page_stride defaults to a packed page.
    /// page_offsets, page_indices and lengths are the caller's and must outlive the view.
    KVCACHE_HOST_DEVICE static constexpr paged_view token_major(Element* keys, Element* values, const int* page_offsets,
                                                                const int* page_indices, const int* lengths,
                                                                int sequences, int page_size, Heads heads = Heads{},
                                                                std::int64_t page_stride = 0) noexcept {
        paged_view v = with_table(keys, values, page_offsets, page_indices, lengths, sequences, page_size, heads);
        v.row_stride = heads.kv_heads() * Heads::head_dim;
        v.head_stride = Heads::head_dim;
        v.page_stride = page_stride > 0 ? page_stride : std::int64_t(page_size) * v.row_stride;
        return v;
    }


    KVCACHE_HOST_DEVICE int visible_count(int seq) const noexcept { return lengths[seq]; }
    KVCACHE_HOST_DEVICE int visible_position(int, int i) const noexcept { return i; }

    /// Position / page_size (a shift for powers of two).
    KVCACHE_HOST_DEVICE int page_of(int position) const noexcept {
        return page_shift >= 0 ? position >> page_shift : position / page_size;
    }
    /// Position % page_size.
    KVCACHE_HOST_DEVICE int row_of(int position) const noexcept {
        return page_shift >= 0 ? position & (page_size - 1) : position % page_size;
    }
    /// Pool page id holding the sequence's position.
    KVCACHE_HOST_DEVICE int page(int seq, int position) const noexcept {
        return page_indices[page_offsets[seq] + page_of(position)];
    }
    /// Element offset of row (seq, kv_head, position) from keys (and from values).
    KVCACHE_HOST_DEVICE std::int64_t offset(int seq, int kv_head, int position) const noexcept {
        return page(seq, position) * page_stride +
               kv_head * head_stride + std::int64_t(row_of(position)) * row_stride;
    }

    /// From visible_begin to the end of its page (or of the sequence).
    KVCACHE_HOST_DEVICE position_run<Element> run(int seq, int kv_head, int visible_begin) const noexcept {
        const int n = lengths[seq];
        if (visible_begin >= n) return this->no_rows(visible_begin, visible_begin, row_stride);
        const int to_page_end = page_size - row_of(visible_begin);
        return this->rows_from(seq, kv_head, visible_begin, visible_begin,
                               n - visible_begin < to_page_end ? n - visible_begin : to_page_end, row_stride);
    }

    KVCACHE_HOST_DEVICE attention_visibility visibility() const noexcept { return mask; }

private:
    KVCACHE_HOST_DEVICE static constexpr paged_view with_table(Element* keys, Element* values, const int* page_offsets,
                                                               const int* page_indices, const int* lengths,
                                                               int sequences, int page_size, Heads heads) noexcept {
        paged_view v;
        v.keys = keys;
        v.values = values;
        v.page_offsets = page_offsets;
        v.page_indices = page_indices;
        v.lengths = lengths;
        v.sequences = sequences;
        v.page_size = page_size;
        v.page_shift = detail::power_of_two_shift(page_size);
        v.head_counts = heads;
        return v;
    }
};

static_assert(is_layout_view_v<paged_view<float, head_config<1, 1, 8>>>, "paged_view must satisfy the layout interface");
static_assert(is_layout_view_v<paged_view<half, head_config<4, 2, 16>>>, "paged_view must satisfy the layout interface");

}  // namespace kvcache
