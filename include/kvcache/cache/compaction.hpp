// Bookkeeping of compacted sequences shared by the owners that compact by
// moving kept rows to the front of a sequence's storage (paged, contiguous):
// which positions each layer stores, the checks of a kept list, the storage
// row of a position, and the compaction sections of a view's index table.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/layout/detail/compacted_rows.hpp"

namespace kvcache {
namespace detail {

/// The checks of one layer's kept list, the same for every owner: each
/// visible index inside [0, visible) (out_of_range), ascending without
/// repeats (invalid_argument); the message names the sequence, the layer,
/// the index and the limit.
inline void check_kept_list(sequence_id id, int layer, const std::vector<int>& kept, int visible) {
    for (std::size_t j = 0; j < kept.size(); ++j) {
        require(kept[j] >= 0 && kept[j] < visible, error_code::out_of_range, "compact of sequence ", id, ", layer ",
                layer, ": kept[", j, "] = ", kept[j], " is outside its visible rows [0, ", visible, ")");
        require(j == 0 || kept[j] > kept[j - 1], error_code::invalid_argument, "compact of sequence ", id, ", layer ",
                layer, ": kept[", j, "] = ", kept[j], " does not ascend past kept[", j - 1, "] = ", kept[j - 1],
                " (indices must be ascending, without repeats)");
    }
}

/// Which positions one layer of a compacted sequence stores: rows
/// [0, kept.size()) hold the positions in kept, and each later row r
/// (appended since) holds position r + dropped.
struct layer_rows {
    std::vector<int> kept;  // ascending; its last entry is never kept.size() - 1 + dropped (normalize())
    int dropped = 0;        // positions below the tail that are not stored

    int tail_start() const noexcept { return static_cast<int>(kept.size()) + dropped; }
    int position_at(int row) const noexcept {
        return row < static_cast<int>(kept.size()) ? kept[std::size_t(row)] : row + dropped;
    }
    /// The row holding position, or -1 when it is not stored.
    int row_at(int position) const noexcept {
        if (position >= tail_start()) return position - dropped;
        const auto found = std::lower_bound(kept.begin(), kept.end(), position);
        return found != kept.end() && *found == position ? static_cast<int>(found - kept.begin()) : -1;
    }
};

/// The layer_rows of a compacted sequence, behind a pointer so that every
/// other sequence's bookkeeping grows by one pointer only (what a load of
/// many small records allocates is bounded by it); copies are deep (fork).
/// Empty: storage row == position in every layer.
class layer_table {
public:
    layer_table() = default;
    layer_table(const layer_table& other)
        : rows_(other.rows_ ? std::make_unique<std::vector<layer_rows>>(*other.rows_) : nullptr) {}
    layer_table(layer_table&&) noexcept = default;
    layer_table& operator=(layer_table other) noexcept {
        rows_ = std::move(other.rows_);
        return *this;
    }
    layer_table& operator=(std::vector<layer_rows> rows) {
        rows_ = std::make_unique<std::vector<layer_rows>>(std::move(rows));
        return *this;
    }
    bool empty() const noexcept { return !rows_; }
    void clear() noexcept { rows_.reset(); }
    const std::vector<layer_rows>& rows() const { return *rows_; }
    layer_rows& operator[](std::size_t layer) { return (*rows_)[layer]; }
    const layer_rows& operator[](std::size_t layer) const { return (*rows_)[layer]; }
    layer_rows* begin() noexcept { return rows_ ? rows_->data() : nullptr; }
    layer_rows* end() noexcept { return rows_ ? rows_->data() + rows_->size() : nullptr; }
    const layer_rows* begin() const noexcept { return rows_ ? rows_->data() : nullptr; }
    const layer_rows* end() const noexcept { return rows_ ? rows_->data() + rows_->size() : nullptr; }

    /// One layer's stored positions (row == position when never compacted).
    const layer_rows& layer(int l) const noexcept {
        static const layer_rows every_position{};
        return empty() ? every_position : (*rows_)[std::size_t(l)];
    }
    /// The fewest positions a layer no longer stores: length less this is
    /// the rows of the fullest layer, what the sequence's storage must hold.
    int fewest_dropped() const noexcept {
        int d = empty() ? 0 : INT_MAX;
        for (const layer_rows& r : *this) d = std::min(d, r.dropped);
        return d;
    }
    /// Absorbs kept rows that continue into the tail, and forgets the
    /// compaction once every layer stores every position again.
    void normalize() noexcept {
        bool all = true;
        for (layer_rows& r : *this) {
            while (!r.kept.empty() && r.kept.back() == static_cast<int>(r.kept.size()) - 1 + r.dropped) r.kept.pop_back();
            all = all && r.kept.empty() && r.dropped == 0;
        }
        if (all) clear();
    }
    /// Storage rows [0, n) that hold position == row in every layer and
    /// always will (later rows land after a compacted layer's kept ones).
    std::size_t identity_rows() const noexcept {
        std::size_t n = SIZE_MAX;
        for (const layer_rows& r : *this) {
            if (r.dropped == 0) continue;  // a layer that stores every position
            std::size_t j = 0;
            while (j < r.kept.size() && r.kept[j] == static_cast<int>(j)) ++j;
            n = std::min(n, j);
        }
        return n;
    }
    /// Drops, in every layer, the rows of positions >= new_length (a truncate
    /// of a sequence to new_length); then normalize().
    void truncate(int new_length) {
        for (layer_rows& r : *this) {
            if (new_length >= r.tail_start()) continue;  // only rows appended since the compaction go
            const std::size_t stay = std::lower_bound(r.kept.begin(), r.kept.end(), new_length) - r.kept.begin();
            r.kept.resize(stay);
            r.dropped = new_length - static_cast<int>(stay);
        }
        normalize();
    }
    /// The same stored positions in each of `layers` layers (a loaded record
    /// of `length` positions holding the ascending `positions`).
    /// @tparam Positions a sized range of int
    template <class Positions>
    void assign_everywhere(int layers, int length, const Positions& positions) {
        layer_rows kept;
        kept.kept.assign(positions.begin(), positions.end());
        kept.dropped = length - static_cast<int>(kept.kept.size());
        *this = std::vector<layer_rows>(std::size_t(layers), kept);
        normalize();
    }

    /// The positions one layer stores of a sequence of `length`, ascending
    /// (visible index i holds the i-th).
    std::vector<int> positions(int l, int length) const {
        const layer_rows& r = this->layer(l);
        std::vector<int> out(std::size_t(length - r.dropped));
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = r.position_at(static_cast<int>(i));
        return out;
    }
    /// The positions every one of `layers` layers stores, which must agree
    /// (what a saved record holds): invalid_argument, naming the sequence
    /// and the counts, when they differ.
    std::vector<int> common_positions(sequence_id id, int length, int layers) const {
        std::vector<int> first = positions(0, length);
        for (int l = 1; l < layers && !empty(); ++l)
            require(positions(l, length) == first, error_code::invalid_argument, "sequence ", id,
                    " keeps different positions in different layers (layer 0 keeps ", first.size(), ", layer ", l,
                    " keeps ", length - this->layer(l).dropped, " of ", length,
                    "): a saved record holds one set of positions for every layer");
        return first;
    }

    /// Storage row of position first of one layer, after checking that all
    /// of positions [first, first + n) (n > 0, inside the length) are stored
    /// there; their rows are then consecutive. out_of_range names the first
    /// position that is not.
    int stored_row(sequence_id id, int length, int layer, int first, int n, const char* op) const {
        const layer_rows& r = this->layer(layer);
        const int row = r.row_at(first), last = r.row_at(first + n - 1);
        if (row >= 0 && last - row == n - 1) return row;
        int missing = first;  // name the first position that is not stored
        while (r.row_at(missing) >= 0) ++missing;
        throw_error(error_code::out_of_range, op, " of positions [", first, ", ", first + n, ") of sequence ", id,
                    ", layer ", layer, ": position ", missing, " is not stored (compaction kept ", length - r.dropped,
                    " of its ", length, " positions)");
    }

    /// The stored positions of every layer once the listed layers keep the
    /// rows at visible indices *lists[k] (ascending, no repeats, inside the
    /// layer's visible rows). Throws out_of_range (an index outside) or
    /// invalid_argument (not ascending), changing nothing.
    std::vector<layer_rows> after_compaction(sequence_id id, int length, int layers, const std::vector<int>& which,
                                             const std::vector<const std::vector<int>*>& lists) const {
        std::vector<layer_rows> after = empty() ? std::vector<layer_rows>(std::size_t(layers)) : rows();
        for (std::size_t k = 0; k < which.size(); ++k) {
            const int l = which[k];
            const std::vector<int>& kept = *lists[k];
            const layer_rows& before = this->layer(l);
            const int visible = length - before.dropped;
            layer_rows& r = after[std::size_t(l)];
            check_kept_list(id, l, kept, visible);
            r.kept.clear();
            for (int i : kept) r.kept.push_back(before.position_at(i));
            r.dropped = length - static_cast<int>(kept.size());
        }
        return after;
    }

private:
    std::unique_ptr<std::vector<layer_rows>> rows_;
};

/// The layers and lists of compact(id, kept) over every layer: kept[l] is
/// layer l's list; invalid_argument unless there is one list per layer.
struct every_layer_lists {
    std::vector<int> which;
    std::vector<const std::vector<int>*> lists;

    every_layer_lists(sequence_id id, const std::vector<std::vector<int>>& kept, int layers) {
        require(static_cast<int>(kept.size()) == layers, error_code::invalid_argument, "compact of sequence ", id,
                " got ", kept.size(), " lists of kept rows for ", layers, " layers");
        for (int l = 0; l < layers; ++l) {
            which.push_back(l);
            lists.push_back(&kept[std::size_t(l)]);
        }
    }
};

/// The two public compact() calls of an owner (the contiguous and
/// sliding-window ones), written once: each checks the layer or the list
/// count and hands the owner's compact_layers(id, which, lists) the layers
/// and their kept lists, which checks every list before anything changes.
/// What happens to the kept and dropped rows is the owner's (see its
/// compact_layers).
/// @tparam Owner the owner deriving from this (CRTP), befriending it
template <class Owner>
class compaction_calls {
public:
    /// Keeps, in one layer of the sequence, only the rows at the visible
    /// indices `kept` (ascending, no repeats, each below visible_count(id,
    /// layer)), at their true positions; length(id) does not change.
    /// Throws, with nothing changed: not_found (unknown id), out_of_range (a
    /// bad layer or index), invalid_argument (indices not ascending or repeated).
    void compact(sequence_id id, int layer, const std::vector<int>& kept) {
        Owner& owner = static_cast<Owner&>(*this);
        owner.check_layer(layer);
        owner.compact_layers(id, {layer}, {&kept});
    }

    /// compact() of every layer at once: kept[l] is layer l's list (layers may
    /// keep different rows and counts). All or nothing: a bad list changes no layer.
    void compact(sequence_id id, const std::vector<std::vector<int>>& kept) {
        Owner& owner = static_cast<Owner&>(*this);
        const every_layer_lists every(id, kept, owner.layers());
        owner.compact_layers(id, every.which, every.lists);
    }
};

/// Appends to a view's index table the marker (0: no entry of the batch is
/// compacted) and, when one is, where each layer's section starts [layers]
/// and per layer its section: dropped [n], offsets [n + 1] into the kept
/// positions that follow (detail::compacted_rows's tables).
/// @tparam TableOf const layer_table&(std::size_t i): batch entry i's compaction
template <class TableOf>
void append_compaction_sections(std::vector<int>& table, std::size_t n, int layers, TableOf&& table_of) {
    bool any = false;
    for (std::size_t i = 0; i < n; ++i) any = any || !table_of(i).empty();
    table.push_back(any ? 1 : 0);
    if (!any) return;
    const std::size_t starts = table.size();
    table.resize(starts + std::size_t(layers));
    for (int l = 0; l < layers; ++l) {
        table[starts + std::size_t(l)] = static_cast<int>(table.size());
        const std::size_t dropped = table.size();
        table.resize(dropped + 2 * n + 1);
        for (std::size_t i = 0; i < n; ++i) {
            const layer_rows& r = table_of(i).layer(l);
            table[dropped + i] = r.dropped;
            table[dropped + n + 1 + i] = table[dropped + n + i] + static_cast<int>(r.kept.size());
            table.insert(table.end(), r.kept.begin(), r.kept.end());
        }
    }
}

/// Points a view's compaction tables at layer's section of an index table
/// (table in the view's memory space, host_table its host copy) whose marker
/// (see append_compaction_sections) is at host_table[marker], for n entries.
inline void attach_compaction(compacted_rows& view, const int* table, const int* host_table, int marker, int layer,
                              int n) noexcept {
    if (n == 0 || !table || host_table[marker] == 0) return;
    const int section = host_table[marker + 1 + layer];
    view.dropped = table + section;
    view.kept_offsets = table + section + n;
    view.kept_positions = table + section + 2 * n + 1;
}

}  // namespace detail
}  // namespace kvcache
