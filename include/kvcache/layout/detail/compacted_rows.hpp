// The row arithmetic of a compacted sequence, shared by the views whose
// owners compact by moving kept rows to the front of a sequence's storage
// (paged and contiguous): visible index v is storage row v; the first k rows
// hold the kept positions, the rows after them the positions appended since.
#pragma once

#include "kvcache/core/config.hpp"

namespace kvcache {
namespace detail {

/// The three optional tables of a compacted batch, as a view carries them:
/// per entry i, dropped[i] positions are not stored, and its first
/// k = kept_offsets[i+1] - kept_offsets[i] storage rows hold the ascending
/// positions kept_positions[kept_offsets[i] ..]; row v >= k holds position
/// v + dropped[i]. A null dropped means no entry is compacted (row == position).
struct compacted_rows {
    const int* dropped = nullptr;        ///< per batch entry: positions no longer stored; null: none in any entry
    const int* kept_offsets = nullptr;   ///< with dropped: entries + 1 offsets into kept_positions
    const int* kept_positions = nullptr; ///< with dropped: each entry's leading kept rows' positions, ascending

    /// Rows entry seq stores when its length is `length`.
    KVCACHE_HOST_DEVICE int stored_count(int seq, int length) const noexcept {
        return dropped ? length - dropped[seq] : length;
    }
    /// Position held by storage row (== visible index) i.
    KVCACHE_HOST_DEVICE int position_at(int seq, int i) const noexcept {
        if (!dropped) return i;
        const int first = kept_offsets[seq], kept = kept_offsets[seq + 1] - first;
        return i < kept ? kept_positions[first + i] : i + dropped[seq];
    }
    /// Storage row of a stored position: a binary search of the kept
    /// positions or, past them, position - dropped.
    KVCACHE_HOST_DEVICE int row_of_position(int seq, int position) const noexcept {
        if (!dropped) return position;
        const int first = kept_offsets[seq], kept = kept_offsets[seq + 1] - first;
        if (position >= kept + dropped[seq]) return position - dropped[seq];
        int low = 0, high = kept;
        while (low < high) {
            const int middle = (low + high) / 2;
            if (kept_positions[first + middle] < position) low = middle + 1;
            else high = middle;
        }
        return low;
    }
    /// At most count rows from visible index visible_begin (holding position
    /// p) whose positions are consecutive: a run never reaches past the kept
    /// rows while it starts inside them (the owners keep the kept rows' last
    /// position short of the tail's first, see their normalize()).
    KVCACHE_HOST_DEVICE int consecutive_rows(int seq, int visible_begin, int p, int count) const noexcept {
        if (!dropped) return count;
        const int first = kept_offsets[seq], kept = kept_offsets[seq + 1] - first;
        if (visible_begin >= kept) return count;
        int c = 1;
        while (c < count && visible_begin + c < kept && kept_positions[first + visible_begin + c] == p + c) ++c;
        return c;
    }
};

}  // namespace detail
}  // namespace kvcache
