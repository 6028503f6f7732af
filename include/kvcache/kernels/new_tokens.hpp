// Which of a sequence's new tokens the layout still holds after their space
// was reserved: a chunk longer than a sliding window loses its oldest tokens.
#pragma once

#include "kvcache/core/config.hpp"

namespace kvcache {
namespace detail {

/// Index of the first of the `tokens` new tokens (the last positions of the
/// sequence) that is present; tokens when none is. Present positions are
/// ascending in visible index and a layout drops the oldest first, so the
/// present new tokens are a suffix: token t at position p is present exactly
/// when visible index count - (length - p) holds p.
/// @tparam Layout a layout view
template <class Layout>
KVCACHE_HOST_DEVICE int first_present_new_token(const Layout& view, int sequence, int tokens) {
    const int length = view.length(sequence);
    const int count = view.visible_count(sequence);
    int low = 0, high = tokens;  // binary search for the first present token
    while (low < high) {
        const int t = (low + high) / 2;
        const int position = length - tokens + t;
        const int index = count - (length - position);
        if (index >= 0 && view.visible_position(sequence, index) == position)
            high = t;
        else
            low = t + 1;
    }
    return low;
}

/// True when the layout holds position: a binary search of the visible
/// positions, which ascend (a sliding window keeps its sinks and a suffix).
/// @tparam Layout a layout view
template <class Layout>
KVCACHE_HOST_DEVICE bool is_present(const Layout& view, int sequence, int position) {
    if (position < 0 || position >= view.length(sequence)) return false;
    int low = 0, high = view.visible_count(sequence);
    while (low < high) {
        const int middle = (low + high) / 2;
        if (view.visible_position(sequence, middle) < position)
            low = middle + 1;
        else
            high = middle;
    }
    return low < view.visible_count(sequence) && view.visible_position(sequence, low) == position;
}

}  // namespace detail
}  // namespace kvcache
