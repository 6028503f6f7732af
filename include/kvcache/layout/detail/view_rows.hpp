// What every layout view derives from its own offset(): the batch accessors,
// key()/value() row pointers and the building of a position_run, written once.
// Each view keeps its public data members; this base holds none.
#pragma once

#include <cstdint>

#include "kvcache/core/config.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace detail {

/// Storage slot of batch entry seq: slots[seq], or seq itself when slots is null.
KVCACHE_HOST_DEVICE constexpr int slot_of(const int* slots, int seq) noexcept { return slots ? slots[seq] : seq; }

/// CRTP base of the views. Derived derives from its head configuration too,
/// has members keys, values, lengths and sequences, and offset(seq, kv_head,
/// position) in key elements; a view of a kv_elements pair also has
/// value_offset(seq, kv_head, position) in value elements (its value rows
/// differ in size), a view of one type reads values at offset() too.
/// @tparam Derived the view
/// @tparam Element stored element type, or a kv_elements pair
template <class Derived, class Element>
struct view_rows {
    using key_type = key_element_t<Element>;      ///< what a key row's elements are
    using value_type = value_element_t<Element>;  ///< what a value row's elements are

    KVCACHE_HOST_DEVICE int sequence_count() const noexcept { return self().sequences; }
    KVCACHE_HOST_DEVICE int length(int seq) const noexcept { return self().lengths[seq]; }
    /// The head configuration object (a base of the view; the runtime counts of a dynamic one).
    KVCACHE_HOST_DEVICE constexpr const auto& head_counts() const noexcept {
        return static_cast<const typename Derived::heads&>(self());
    }

    /// Key row of (seq, kv_head, position).
    KVCACHE_HOST_DEVICE key_type* key(int seq, int kv_head, int position) const noexcept {
        return self().keys + self().offset(seq, kv_head, position);
    }
    /// Value row of (seq, kv_head, position).
    KVCACHE_HOST_DEVICE value_type* value(int seq, int kv_head, int position) const noexcept {
        if constexpr (is_kv_pair_v<Element>) return self().values + self().value_offset(seq, kv_head, position);
        else return self().values + self().offset(seq, kv_head, position);
    }

protected:
    /// The run of count rows from position (visible index first_visible) of
    /// one KV head; value_stride: a pair's value rows' stride (ignored for one type).
    KVCACHE_HOST_DEVICE position_run<Element> rows_from(int seq, int kv_head, int first_visible, int position, int count,
                                                        int stride, int value_stride = 0) const noexcept {
        position_run<Element> r = no_rows(first_visible, position, stride, value_stride);
        if constexpr (is_kv_pair_v<Element>) {
            r.keys = key(seq, kv_head, position);
            r.values = value(seq, kv_head, position);
        } else {
            const std::int64_t at = self().offset(seq, kv_head, position);  // one offset for both planes
            r.keys = self().keys + at;
            r.values = self().values + at;
        }
        r.count = count;
        return r;
    }
    /// The empty run a view returns past its last visible position.
    KVCACHE_HOST_DEVICE static position_run<Element> no_rows(int first_visible, int position, int stride,
                                                             int value_stride = 0) noexcept {
        position_run<Element> r;
        r.first_visible = first_visible;
        r.first_position = position;
        r.stride = stride;
        if constexpr (is_kv_pair_v<Element>) r.value_stride = value_stride;
        else (void)value_stride;
        return r;
    }

private:
    KVCACHE_HOST_DEVICE constexpr const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace detail
}  // namespace kvcache
