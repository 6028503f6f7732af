// The sliding-window layout (StreamingLLM): per slot, S "sink" rows holding
// positions 0..S-1 forever, then a ring of R rows holding the most recent
// positions. Position p >= S lives in ring row (p - S) % R. Keys are stored
// already rotated (RoPE) at their original logical position; nothing is
// re-rotated when positions move in the ring.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/layout/detail/view_rows.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

namespace detail {
/// A sliding-window view's value strides: none of their own for one element
/// type (values share the key strides), two for a kv_elements pair.
template <bool Pair>
struct window_value_strides {};
template <>
struct window_value_strides<true> {
    std::int64_t value_slot_stride = 0;  ///< value elements between slots
    std::int64_t value_head_stride = 0;  ///< value elements between KV heads of a slot
};
}  // namespace detail

/// View of a batch of sliding-window sequences. Slot storage is
/// [slot][kv_head][row][head_dim] with rows 0..sinks-1 the sinks and
/// rows sinks..sinks+ring-1 the ring; element (slot, kv_head, row, d) is at
/// keys[slot * slot_stride + kv_head * head_stride + row * head_dim + d]
/// (values alike; a kv_elements pair's at value_slot_stride and
/// value_head_stride, rows of their own type).
/// Present positions: [0, min(length, sinks)) and [max(sinks, length - ring), length).
/// ring >= window so every key a query may see is present; with
/// ring = window + chunk - 1, a chunk of new tokens still sees its own window.
///
/// Compacted sequences (sliding_window_cache::compact): with hole_offsets
/// set, entry i's present positions hole_positions[hole_offsets[i] ..
/// hole_offsets[i+1]) (ascending) are not visible; the other rows stay where
/// the ring put them. Null (the default) means no holes in any entry.
/// @tparam Element stored element type (float, kvcache::half, kvcache::bfloat16, fp8 read through scales, qint8,
///         qint4, or a kv_elements pair; const for a read-only view)
/// @tparam Heads a head_config
template <class Element, class Heads>
struct sliding_window_view : detail::view_rows<sliding_window_view<Element, Heads>, Element>,
                             detail::window_value_strides<is_kv_pair_v<Element>>, Heads {
    using element_type = Element;
    using key_type = key_element_t<Element>;      ///< what key rows hold
    using value_type = value_element_t<Element>;  ///< what value rows hold
    using heads = Heads;
    static constexpr layout_kind kind = layout_kind::sliding_window;

    // The head counts are a base (Heads): query_heads(), kv_heads(), group_size() are the
    // view's own, constants for a compiled configuration, which then adds no bytes.

    key_type* keys = nullptr;      ///< base of the key slabs
    value_type* values = nullptr;  ///< base of the value slabs
    const int* lengths = nullptr;  ///< logical tokens of batch entry i (unbounded)
    const int* slots = nullptr;    ///< storage slot of batch entry i; null: identity
    int sequences = 0;             ///< batch entries
    int sinks = 0;                 ///< S: first positions kept forever
    int ring = 1;                  ///< R: ring rows for recent positions (>= window)
    int window = 1;                ///< W: a query sees keys newer than query - W (plus sinks)
    std::int64_t slot_stride = 0;  ///< elements between slots (>= kv_heads * head_stride)
    std::int64_t head_stride = 0;  ///< elements between KV heads of a slot (>= (sinks + ring) * head_dim)
    const int* hole_offsets = nullptr;    ///< sequences + 1 offsets into hole_positions; null: no holes anywhere
    const int* hole_positions = nullptr;  ///< with hole_offsets: each entry's present positions a compaction dropped, ascending
    kv_scales scales{};  ///< what stored keys and values are multiplied by when read (fp8); 1 and 1 for other types
    const std::int64_t* sequence_ids = nullptr;  ///< host memory, for messages only: the owner's id of entry i; null: none

    /// Packed strides for the given sinks and ring.
    KVCACHE_HOST_DEVICE static constexpr sliding_window_view packed(key_type* keys, value_type* values,
                                                                    const int* lengths, const int* slots,
                                                                    int sequences, int sinks, int ring,
                                                                    int window, Heads heads = Heads{}) noexcept {
        sliding_window_view v;
        v.keys = keys;
        v.values = values;
        v.lengths = lengths;
        v.slots = slots;
        v.sequences = sequences;
        v.sinks = sinks;
        v.ring = ring;
        v.window = window;
        v.head_stride = std::int64_t(sinks + ring) * row_elements<key_type>(Heads::head_dim);
        v.slot_stride = std::int64_t(heads.kv_heads()) * v.head_stride;
        if constexpr (is_kv_pair_v<Element>) {
            v.value_head_stride = std::int64_t(sinks + ring) * row_elements<value_type>(Heads::head_dim);
            v.value_slot_stride = std::int64_t(heads.kv_heads()) * v.value_head_stride;
        }
        static_cast<Heads&>(v) = heads;
        return v;
    }


    /// Present sink positions: min(length, sinks).
    KVCACHE_HOST_DEVICE int sink_count(int seq) const noexcept {
        const int n = lengths[seq];
        return n < sinks ? n : sinks;
    }
    /// Oldest present ring position: max(sinks, length - ring).
    KVCACHE_HOST_DEVICE int first_ring_position(int seq) const noexcept {
        const int from = lengths[seq] - ring;
        return from > sinks ? from : sinks;
    }
    /// Present rows, holes included.
    KVCACHE_HOST_DEVICE int present_count(int seq) const noexcept {
        const int n = lengths[seq];
        return sink_count(seq) + (n > sinks ? n - first_ring_position(seq) : 0);
    }
    /// The j-th present position (holes included).
    KVCACHE_HOST_DEVICE int present_position(int seq, int j) const noexcept {
        const int s = sink_count(seq);
        return j < s ? j : first_ring_position(seq) + (j - s);
    }
    /// Holes of the entry (present positions a compaction dropped).
    KVCACHE_HOST_DEVICE int hole_count(int seq) const noexcept {
        return hole_offsets ? hole_offsets[seq + 1] - hole_offsets[seq] : 0;
    }
    KVCACHE_HOST_DEVICE int visible_count(int seq) const noexcept { return present_count(seq) - hole_count(seq); }
    /// Present index j = i + m, m the holes h_t with (present index of h_t) - t <= i
    /// (nondecreasing in t, so a binary search).
    KVCACHE_HOST_DEVICE int visible_position(int seq, int i) const noexcept {
        const int k = hole_count(seq);
        if (k == 0) return present_position(seq, i);
        const int* holes = hole_positions + hole_offsets[seq];
        const int s = sink_count(seq), ring_from = first_ring_position(seq);
        int low = 0, high = k;
        while (low < high) {
            const int t = (low + high) / 2;
            const int index = holes[t] < sinks ? holes[t] : s + (holes[t] - ring_from);
            if (index - t <= i) low = t + 1;
            else high = t;
        }
        return present_position(seq, i + low);
    }

    /// Storage row of a present position.
    KVCACHE_HOST_DEVICE int row_of(int position) const noexcept {
        return position < sinks ? position : sinks + (position - sinks) % ring;
    }
    /// Element offset of row (seq, kv_head, position) from keys (and from values, unless a pair).
    KVCACHE_HOST_DEVICE std::int64_t offset(int seq, int kv_head, int position) const noexcept {
        return detail::slot_of(slots, seq) * slot_stride + kv_head * head_stride + std::int64_t(row_of(position)) * row_elements<key_type>(Heads::head_dim);
    }
    /// A pair's value element offset of row (seq, kv_head, position) from values.
    KVCACHE_HOST_DEVICE std::int64_t value_offset(int seq, int kv_head, int position) const noexcept {
        return detail::slot_of(slots, seq) * this->value_slot_stride + kv_head * this->value_head_stride +
               std::int64_t(row_of(position)) * row_elements<value_type>(Heads::head_dim);
    }

    /// Positions stay consecutive and rows adjacent up to the ring's wrap
    /// point; before anything is evicted (length <= sinks + ring) row ==
    /// position, so the sinks and the ring form one run.
    KVCACHE_HOST_DEVICE position_run<Element> run(int seq, int kv_head, int visible_begin) const noexcept {
        const int n = lengths[seq];
        constexpr int key_row = row_elements<key_type>(Heads::head_dim), value_row = row_elements<value_type>(Heads::head_dim);
        if (visible_begin >= visible_count(seq)) return this->no_rows(visible_begin, n, key_row, value_row);
        const int p = visible_position(seq, visible_begin);
        int count;
        if (n <= sinks + ring) {
            count = n - p;
        } else if (p < sinks) {
            count = sinks - p;
        } else {
            const int to_wrap = ring - (p - sinks) % ring;
            count = n - p < to_wrap ? n - p : to_wrap;
        }
        if (hole_count(seq) > 0) {  // no further than the next hole
            const int* holes = hole_positions + hole_offsets[seq];
            int low = 0, high = hole_count(seq);
            while (low < high) {
                const int t = (low + high) / 2;
                if (holes[t] < p) low = t + 1;
                else high = t;
            }
            if (low < hole_count(seq) && holes[low] - p < count) count = holes[low] - p;
        }
        return this->rows_from(seq, kv_head, visible_begin, p, count, key_row, value_row);
    }

    KVCACHE_HOST_DEVICE attention_visibility visibility() const noexcept { return {window, sinks}; }

    /// The same view over other key and value bases of the same element
    /// (const Element for a read-only view; see read_only()).
    /// @tparam To Element, or Element with const added or removed
    template <class To>
    KVCACHE_HOST_DEVICE constexpr sliding_window_view<To, Heads> with_elements(key_element_t<To>* new_keys,
                                                                               value_element_t<To>* new_values) const noexcept {
        static_assert(std::is_same_v<std::remove_const_t<To>, std::remove_const_t<Element>>,
                      "kvcache: with_elements changes only the elements' constness");
        auto v = sliding_window_view<To, Heads>::packed(new_keys, new_values, lengths, slots, sequences, sinks, ring,
                                                        window, this->head_counts());
        v.slot_stride = slot_stride;
        v.head_stride = head_stride;
        if constexpr (is_kv_pair_v<Element>) {
            v.value_slot_stride = this->value_slot_stride;
            v.value_head_stride = this->value_head_stride;
        }
        v.hole_offsets = hole_offsets;
        v.hole_positions = hole_positions;
        v.sequence_ids = sequence_ids;
        v.scales = scales;
        return v;
    }
    /// This view with const elements: attention takes it, append does not compile.
    KVCACHE_HOST_DEVICE constexpr sliding_window_view<const Element, Heads> read_only() const noexcept {
        return with_elements<const Element>(keys, values);
    }
};

static_assert(is_layout_view_v<sliding_window_view<float, head_config<1, 1, 8>>>, "sliding_window_view must satisfy the layout interface");
static_assert(is_layout_view_v<sliding_window_view<half, head_config<4, 2, 16>>>, "sliding_window_view must satisfy the layout interface");
static_assert(is_layout_view_v<sliding_window_view<kv_elements<float, qint4>, head_config<4, 2, 32>>>,
              "a sliding_window_view of a K/V pair must satisfy the layout interface");

}  // namespace kvcache
