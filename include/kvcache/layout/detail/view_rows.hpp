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
/// has members keys, values, lengths and sequences, and offset(seq, kv_head, position) in elements.
/// @tparam Derived the view
/// @tparam Element stored element type
template <class Derived, class Element>
struct view_rows {
    KVCACHE_HOST_DEVICE int sequence_count() const noexcept { return self().sequences; }
    KVCACHE_HOST_DEVICE int length(int seq) const noexcept { return self().lengths[seq]; }
    /// The head configuration object (a base of the view; the runtime counts of a dynamic one).
    KVCACHE_HOST_DEVICE constexpr const auto& head_counts() const noexcept {
        return static_cast<const typename Derived::heads&>(self());
    }

    /// Key row of (seq, kv_head, position).
    KVCACHE_HOST_DEVICE Element* key(int seq, int kv_head, int position) const noexcept {
        return self().keys + self().offset(seq, kv_head, position);
    }
    /// Value row of (seq, kv_head, position).
    KVCACHE_HOST_DEVICE Element* value(int seq, int kv_head, int position) const noexcept {
        return self().values + self().offset(seq, kv_head, position);
    }

protected:
    /// The run of count rows from position (visible index first_visible) of one KV head.
    KVCACHE_HOST_DEVICE position_run<Element> rows_from(int seq, int kv_head, int first_visible, int position, int count,
                                                        int stride) const noexcept {
        position_run<Element> r = no_rows(first_visible, position, stride);
        const std::int64_t at = self().offset(seq, kv_head, position);
        r.keys = self().keys + at;
        r.values = self().values + at;
        r.count = count;
        return r;
    }
    /// The empty run a view returns past its last visible position.
    KVCACHE_HOST_DEVICE static position_run<Element> no_rows(int first_visible, int position, int stride) noexcept {
        position_run<Element> r;
        r.first_visible = first_visible;
        r.first_position = position;
        r.stride = stride;
        return r;
    }

private:
    KVCACHE_HOST_DEVICE constexpr const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace detail
}  // namespace kvcache
