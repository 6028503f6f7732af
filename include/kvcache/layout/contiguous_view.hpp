// The contiguous layout: one preallocated slab per sequence slot, positions
// 0..capacity-1 in order. Strides are stored in the view so callers can hand
// in their own tensors (any row order, padding between slots or heads).
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
/// A contiguous view's value strides: none of their own for one element type
/// (values share the key strides), three for a kv_elements pair.
template <bool Pair>
struct contiguous_value_strides {};
template <>
struct contiguous_value_strides<true> {
    std::int64_t value_slot_stride = 0;      ///< value elements between slots
    std::int64_t value_head_stride = 0;      ///< value elements between KV heads of a slot
    std::int64_t value_position_stride = 0;  ///< value elements between consecutive positions
};
}  // namespace detail

/// View of a batch of sequences stored in contiguous slabs,
/// element (slot, kv_head, position, d) at
/// keys[slot * slot_stride + kv_head * head_stride + position * position_stride + d]
/// (the same for values; a kv_elements pair's values at value_slot_stride,
/// value_head_stride and value_position_stride, in elements of their own type).
/// Default strides give [slot][kv_head][position][head_dim].
/// Batch entry i reads storage slot slots[i], or slot i when slots is null.
///
/// Compacted sequences (contiguous_cache::compact): with `dropped` set, the
/// positions are those of detail::compacted_rows: visible index v is storage
/// row v of the slot, its first kept rows hold kept_positions, the rows after
/// them position v + dropped[i]. Null (the default, and a caller's own
/// tensors) means row == position.
/// @tparam Element stored element type (float, kvcache::half, kvcache::bfloat16, fp8 read through scales, qint8,
///         qint4, or a kv_elements pair; const for a read-only view)
/// @tparam Heads a head_config
template <class Element, class Heads>
struct contiguous_view : detail::view_rows<contiguous_view<Element, Heads>, Element>, detail::compacted_rows,
                         detail::contiguous_value_strides<is_kv_pair_v<Element>>, Heads {
    using element_type = Element;
    using key_type = key_element_t<Element>;      ///< what key rows hold
    using value_type = value_element_t<Element>;  ///< what value rows hold
    using heads = Heads;
    static constexpr layout_kind kind = layout_kind::contiguous;

    // The head counts are a base (Heads): query_heads(), kv_heads(), group_size() are the
    // view's own, constants for a compiled configuration, which then adds no bytes.

    key_type* keys = nullptr;         ///< base of the key slabs
    value_type* values = nullptr;     ///< base of the value slabs
    const int* lengths = nullptr;     ///< lengths[i]: tokens held by batch entry i
    const int* slots = nullptr;       ///< storage slot of batch entry i; null: identity
    int sequences = 0;                ///< batch entries
    int capacity = 0;                 ///< positions each slot can hold
    std::int64_t slot_stride = 0;     ///< elements between slots
    std::int64_t head_stride = 0;     ///< elements between KV heads of a slot
    std::int64_t position_stride = 0; ///< elements between consecutive positions (>= head_dim)
    // value_slot_stride, value_head_stride, value_position_stride (a kv_elements pair
    // only): from detail::contiguous_value_strides.
    kv_scales scales{};  ///< what stored keys and values are multiplied by when read (fp8); 1 and 1 for other types
    attention_visibility mask{};  ///< which present keys a query sees: a window and sinks (backends set it from attention_options)
    const std::int64_t* sequence_ids = nullptr;  ///< host memory, for messages only: the owner's id of entry i; null: none

    /// Strides of the packed [slot][kv_head][position][head_dim] order for the given capacity.
    KVCACHE_HOST_DEVICE static constexpr contiguous_view packed(key_type* keys, value_type* values, const int* lengths,
                                                                const int* slots, int sequences, int capacity,
                                                                Heads heads = Heads{}) noexcept {
        const std::int64_t head_stride = std::int64_t(capacity) * row_elements<key_type>(Heads::head_dim);
        return strided(keys, values, lengths, sequences, capacity, std::int64_t(heads.kv_heads()) * head_stride,
                       head_stride, row_elements<key_type>(Heads::head_dim), slots, heads);
    }

    /// A view over memory the caller owns and lays out (another engine's
    /// cache, a framework tensor): element (slot, kv_head, position, d) at
    /// keys[slot * slot_stride + kv_head * head_stride + position * position_stride + d].
    /// Token-major per sequence, as llama.cpp stores K and V, is
    /// head_stride = head_dim, position_stride = kv_heads * head_dim; rows must
    /// be head_dim contiguous elements. For a kv_elements pair the value
    /// strides are the key strides counted in value rows instead of key rows
    /// (stride / key row length * value row length), which is right when
    /// the key strides are whole key rows; set the value_* strides afterwards
    /// otherwise. lengths (and slots, null for identity)
    /// are the caller's too and must outlive the view; read-only attention
    /// never writes through keys or values. A dynamic head configuration
    /// passes its counts as heads.
    KVCACHE_HOST_DEVICE static constexpr contiguous_view strided(key_type* keys, value_type* values, const int* lengths,
                                                                 int sequences, int capacity, std::int64_t slot_stride,
                                                                 std::int64_t head_stride, std::int64_t position_stride,
                                                                 const int* slots = nullptr,
                                                                 Heads heads = Heads{}) noexcept {
        contiguous_view v;
        v.keys = keys;
        v.values = values;
        v.lengths = lengths;
        v.slots = slots;
        v.sequences = sequences;
        v.capacity = capacity;
        v.slot_stride = slot_stride;
        v.head_stride = head_stride;
        v.position_stride = position_stride;
        if constexpr (is_kv_pair_v<Element>) {
            constexpr std::int64_t key_row = row_elements<key_type>(Heads::head_dim);
            constexpr std::int64_t value_row = row_elements<value_type>(Heads::head_dim);
            v.value_slot_stride = slot_stride / key_row * value_row;
            v.value_head_stride = head_stride / key_row * value_row;
            v.value_position_stride = position_stride / key_row * value_row;
        }
        static_cast<Heads&>(v) = heads;
        return v;
    }

    // dropped, kept_offsets, kept_positions: the compaction tables, from detail::compacted_rows.

    KVCACHE_HOST_DEVICE int visible_count(int seq) const noexcept { return this->stored_count(seq, lengths[seq]); }
    KVCACHE_HOST_DEVICE int visible_position(int seq, int i) const noexcept { return this->position_at(seq, i); }

    /// Element offset of row (seq, kv_head, position) from keys (and from values, unless a pair).
    KVCACHE_HOST_DEVICE std::int64_t offset(int seq, int kv_head, int position) const noexcept {
        return detail::slot_of(slots, seq) * slot_stride + kv_head * head_stride +
               std::int64_t(this->row_of_position(seq, position)) * position_stride;
    }
    /// A pair's value element offset of row (seq, kv_head, position) from values.
    KVCACHE_HOST_DEVICE std::int64_t value_offset(int seq, int kv_head, int position) const noexcept {
        return detail::slot_of(slots, seq) * this->value_slot_stride + kv_head * this->value_head_stride +
               std::int64_t(this->row_of_position(seq, position)) * this->value_position_stride;
    }

    /// From visible_begin to the end, unless it starts in a compacted
    /// sequence's kept rows: then no further than their positions stay consecutive.
    KVCACHE_HOST_DEVICE position_run<Element> run(int seq, int kv_head, int visible_begin) const noexcept {
        const int n = visible_count(seq), stride = static_cast<int>(position_stride);
        int value_stride = stride;
        if constexpr (is_kv_pair_v<Element>) value_stride = static_cast<int>(this->value_position_stride);
        const int p = visible_position(seq, visible_begin);
        if (visible_begin >= n) return this->no_rows(visible_begin, p, stride, value_stride);
        return this->rows_from(seq, kv_head, visible_begin, p, this->consecutive_rows(seq, visible_begin, p, n - visible_begin),
                               stride, value_stride);
    }

    KVCACHE_HOST_DEVICE attention_visibility visibility() const noexcept { return mask; }

    /// The same view over other key and value bases of the same element
    /// (const Element for a read-only view; see read_only()).
    /// @tparam To Element, or Element with const added or removed
    template <class To>
    KVCACHE_HOST_DEVICE constexpr contiguous_view<To, Heads> with_elements(key_element_t<To>* new_keys,
                                                                           value_element_t<To>* new_values) const noexcept {
        static_assert(std::is_same_v<std::remove_const_t<To>, std::remove_const_t<Element>>,
                      "kvcache: with_elements changes only the elements' constness");
        auto v = contiguous_view<To, Heads>::strided(new_keys, new_values, lengths, sequences, capacity, slot_stride,
                                                     head_stride, position_stride, slots, this->head_counts());
        if constexpr (is_kv_pair_v<Element>) {
            v.value_slot_stride = this->value_slot_stride;
            v.value_head_stride = this->value_head_stride;
            v.value_position_stride = this->value_position_stride;
        }
        v.dropped = dropped;
        v.kept_offsets = kept_offsets;
        v.kept_positions = kept_positions;
        v.mask = mask;
        v.scales = scales;
        v.sequence_ids = sequence_ids;
        return v;
    }
    /// This view with const elements: attention takes it, append does not compile.
    KVCACHE_HOST_DEVICE constexpr contiguous_view<const Element, Heads> read_only() const noexcept {
        return with_elements<const Element>(keys, values);
    }
};

static_assert(is_layout_view_v<contiguous_view<float, head_config<1, 1, 8>>>, "contiguous_view must satisfy the layout interface");
static_assert(is_layout_view_v<contiguous_view<half, head_config<4, 2, 16>>>, "contiguous_view must satisfy the layout interface");
static_assert(is_layout_view_v<contiguous_view<const half, head_config<4, 2, 16>>>, "a read-only contiguous_view must satisfy the layout interface");
static_assert(is_layout_view_v<contiguous_view<kv_elements<half, qint8>, head_config<4, 2, 16>>>,
              "a contiguous_view of a K/V pair must satisfy the layout interface");

}  // namespace kvcache
