// Owner of the sliding-window layout: fixed slots of S sink rows plus a ring
// of R = window + max_chunk - 1 rows, so generation runs without bound in
// fixed memory. Compaction drops chosen rows from view (holes) where they
// are; the ring still decides which positions stay.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvcache/cache/compaction.hpp"
#include "kvcache/cache/owner_base.hpp"
#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/cache/slot_store.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/layout/sliding_window_view.hpp"

namespace kvcache {

/// A sliding-window cache of L layers (StreamingLLM). Each sequence keeps its
/// first `sinks` positions forever and the newest `ring` positions; a query
/// sees the sinks plus keys newer than query - window. Appends come in chunks
/// of at most max_chunk tokens, which the ring is sized for. Keys are stored
/// rotated at their original position (RoPE is applied before the write).
/// @tparam Element stored element type (float, kvcache::half, kvcache::bfloat16, fp8, qint8, qint4) or a
///         kv_elements pair (keys and values of two of them)
/// @tparam Heads a head_config
/// @tparam Memory host_memory or device_memory
template <class Element, class Heads, class Memory = host_memory>
class sliding_window_cache : public detail::owner_base<sliding_window_cache<Element, Heads, Memory>, Element, Heads>,
                             public detail::compaction_calls<sliding_window_cache<Element, Heads, Memory>> {
    static_assert(is_cache_element_v<Element>, "kvcache::sliding_window_cache stores float, kvcache::half, kvcache::bfloat16, kvcache::float8_e4m3, kvcache::float8_e5m2, kvcache::qint8, kvcache::qint4 or a kvcache::kv_elements pair of them");
    using base = detail::owner_base<sliding_window_cache, Element, Heads>;
    friend base;
    friend detail::compaction_calls<sliding_window_cache>;

public:
    using element_type = Element;
    using key_type = key_element_t<Element>;      ///< what key rows are stored as
    using value_type = value_element_t<Element>;  ///< what value rows are stored as
    using heads = Heads;
    using memory = Memory;
    using view_type = sliding_window_view<Element, Heads>;
    static constexpr layout_kind kind = layout_kind::sliding_window;

    /// `slots` sequences of sinks + window + max_chunk - 1 rows in each of `layers` layers.
    sliding_window_cache(int layers, int slots, int window, int sinks, int max_chunk = 1)
        : sliding_window_cache(Heads{}, layers, slots, window, sinks, max_chunk) {
        static_assert(Heads::static_counts, "kvcache: a cache over a dynamic head_config takes the counts as its first argument");
    }

    /// The same for the given head counts (a dynamic head_config's runtime values).
    sliding_window_cache(const Heads& heads, int layers, int slots, int window, int sinks, int max_chunk = 1)
        : base(heads), window_(window), sinks_(sinks), max_chunk_(max_chunk) {
        detail::require_positive(layers, "layers");
        detail::require_positive(slots, "slots");
        detail::require_positive(window, "window");
        require(sinks >= 0, error_code::invalid_argument, "sinks = ", sinks, " must not be negative");
        detail::require_positive(max_chunk, "max_chunk");
        require(window <= 0x3fffffff - max_chunk - sinks, error_code::invalid_argument, "window ", window,
                " + max_chunk ", max_chunk, " + sinks ", sinks, " is too large");
        ring_ = window + max_chunk - 1;
        store_ = store(layers, slots, sinks + ring_, this->kv_heads());
        for (int s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
    }

    int layers() const noexcept { return store_.layers(); }
    int slot_count() const noexcept { return store_.slots(); }
    int window() const noexcept { return window_; }
    int sinks() const noexcept { return sinks_; }
    int ring() const noexcept { return ring_; }
    int max_chunk() const noexcept { return max_chunk_; }

    /// Adds an empty sequence; capacity_exceeded when every slot is taken.
    sequence_id add_sequence() {
        require(!free_slots_.empty(), error_code::capacity_exceeded, "all ", slot_count(),
                " slots of the sliding-window cache are taken");
        const sequence_id id = sequences_.insert(state{free_slots_.back(), 0, {}});
        free_slots_.pop_back();
        return id;
    }

    /// Frees the sequence's slot; not_found for an unknown id.
    void remove_sequence(sequence_id id) {
        free_slots_.push_back(sequences_.at(id).slot);
        sequences_.erase(id);
    }


    /// True when position is kept for a sequence of the given length.
    bool present(int length, int position) const noexcept {
        return position >= 0 && position < length && (position < sinks_ || position >= first_ring(length));
    }

    /// Advances the length by n <= max_chunk (older ring positions are
    /// overwritten by the new rows) and returns the first new position.
    int begin_append(sequence_id id, int n) {
        detail::require_count(n, "n_tokens");
        state& s = sequences_.at(id);
        require(n <= max_chunk_, error_code::capacity_exceeded, "append of ", n, " tokens to sequence ", id,
                " exceeds max_chunk ", max_chunk_, " (ring of ", ring_, " rows for window ", window_, ")");
        require(n <= 0x7fffffff - s.length, error_code::capacity_exceeded, "length ", s.length, " + ", n,
                " overflows int");
        const int first = s.length;
        s.length += n;
        prune_holes(s);  // the ring overwrote the oldest rows, holes among them
        return first;
    }

    using base::write;  // also from rows of the other element type, converted
    /// Writes rows of present positions [first, first + n) of one layer from
    /// host arrays [token][kv_head][head_dim].
    void write(sequence_id id, int layer, int first, span<const key_type> key_rows, span<const value_type> value_rows, int n) {
        base::check_rows(key_rows.size(), value_rows.size(), n, id, layer, "write");
        const key_type* const keys = key_rows.data();
        const value_type* const values = value_rows.data();
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        check_present(id, s.length, first, n);
        check_no_hole(s, id, layer, first, n, "write");
        for_each_segment(first, n, [&](int row, int done, int count) {
            store_.write(layer, s.slot, row, keys + std::size_t(done) * this->key_token_row(),
                         values + std::size_t(done) * this->value_token_row(), count);
        });
    }

    using base::read;  // also into float or 16-bit rows, widened (int8, int4 and fp8 dequantised)

    /// Reads rows of present positions [first, first + n) of one layer into host arrays.
    void read(sequence_id id, int layer, int first, int n, span<key_type> key_rows, span<value_type> value_rows) const {
        base::check_rows(key_rows.size(), value_rows.size(), n, id, layer, "read");
        key_type* const keys = key_rows.data();
        value_type* const values = value_rows.data();
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        check_present(id, s.length, first, n);
        check_no_hole(s, id, layer, first, n, "read");
        for_each_segment(first, n, [&](int row, int done, int count) {
            store_.read(layer, s.slot, row, count, keys + std::size_t(done) * this->key_token_row(),
                        values + std::size_t(done) * this->value_token_row());
        });
    }

    /// Shortens the sequence. Possible while nothing was evicted (length <=
    /// sinks + ring); afterwards the positions a shorter sequence would need
    /// are gone, so it is out_of_range, as is a new length past the end.
    void truncate(sequence_id id, int new_length) {
        state& s = sequences_.at(id);
        base::check_truncate(id, new_length, s.length);
        require(new_length == s.length || s.length <= sinks_ + ring_, error_code::out_of_range,
                "truncate of sequence ", id, " to ", new_length, " needs positions the window evicted (length ",
                s.length, " > sinks ", sinks_, " + ring ", ring_, ")");
        s.length = new_length;
        prune_holes(s);
    }

    /// A new sequence with a copy of id's sinks and ring.
    sequence_id fork(sequence_id id) {
        const state parent = sequences_.at(id);
        const sequence_id child = add_sequence();
        state& c = sequences_.at(child);
        store_.copy_slot(store_, parent.slot, c.slot, store_.rows());
        c.length = parent.length;
        c.holes = parent.holes;
        return child;
    }

    /// Rows of one layer a kernel sees: the present positions less the holes.
    int visible_count(sequence_id id, int layer) const {
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        return static_cast<int>(present_positions_for(s.length).size() - holes_of(s, layer).size());
    }
    /// The positions one layer shows, ascending (visible index i holds the i-th).
    std::vector<int> present_positions(sequence_id id, int layer) const {
        this->check_layer(layer);
        return visible_positions(sequences_.at(id), layer);
    }
    /// True while some layer of the sequence has a hole.
    bool compacted(sequence_id id) const { return !sequences_.at(id).holes.empty(); }

    /// Present positions, ascending: the sinks, then the ring's contents,
    /// less a compaction's holes, which must agree across layers (what
    /// save() records): invalid_argument when they differ.
    std::vector<int> present_positions(sequence_id id) const {
        const state& s = sequences_.at(id);
        std::vector<int> first = visible_positions(s, 0);
        for (int l = 1; l < layers() && !s.holes.empty(); ++l)
            require(s.holes[std::size_t(l)] == s.holes[0], error_code::invalid_argument, "sequence ", id,
                    " keeps different positions in different layers (layer 0 keeps ", first.size(), ", layer ", l,
                    " keeps ", visible_count(id, l), " of ", s.length,
                    "): a saved record holds one set of positions for every layer");
        return first;
    }
    /// The positions this window keeps of a sequence of `length` tokens, ascending.
    std::vector<int> present_positions_for(int length) const {
        std::vector<int> out;
        for (int p = 0; p < std::min(length, sinks_); ++p) out.push_back(p);
        for (int p = first_ring(length); p < length; ++p) out.push_back(p);
        return out;
    }

    /// The view of one layer over a batch. Valid until the cache changes or a
    /// view of a different batch is made; a step_plan's views (plan()) have no such limit.
    view_type view(int layer, const std::vector<sequence_id>& batch) {
        this->check_layer(layer);
        const std::vector<int> table = view_table(batch);
        view_type v = view_over(layer, table_.upload(table), static_cast<int>(batch.size()), table.data());
        v.sequence_ids = table_.label(batch);
        return v;
    }

    /// The index table a view of batch reads: lengths [n], slots [n], then 0
    /// when no sequence of the batch has a hole, else 1, where each layer's
    /// section starts [L], and per layer its section: offsets [n + 1] into
    /// the hole positions that follow (see sliding_window_view).
    std::vector<int> view_table(const std::vector<sequence_id>& batch) const {
        std::vector<int> table = this->length_slot_table(batch);
        const std::size_t n = batch.size();
        bool any = false;
        for (sequence_id id : batch) any = any || !sequences_.at(id).holes.empty();
        table.push_back(any ? 1 : 0);
        if (!any) return table;
        const std::size_t starts = table.size();
        table.resize(starts + std::size_t(layers()));
        for (int l = 0; l < layers(); ++l) {
            table[starts + std::size_t(l)] = static_cast<int>(table.size());
            const std::size_t offsets = table.size();
            table.resize(offsets + n + 1);
            for (std::size_t i = 0; i < n; ++i) {
                const std::vector<int>& holes = holes_of(sequences_.at(batch[i]), l);
                table[offsets + i + 1] = table[offsets + i] + static_cast<int>(holes.size());
                table.insert(table.end(), holes.begin(), holes.end());
            }
        }
        return table;
    }

    /// The view of one layer whose index table (view_table()'s contents, in
    /// the cache's memory space) the caller keeps at table, for n entries;
    /// host_table is the same table in host memory (it says where the
    /// layer's hole section starts). A host cache may pass null: the table
    /// itself is read then; a device cache must pass it.
    view_type view_over(int layer, const int* table, int n, const int* host_table = nullptr) {
        this->check_layer(layer);
        if constexpr (Memory::space == memory_space::host) {
            if (!host_table) host_table = table;
        }
        require(host_table != nullptr || n == 0 || !table, error_code::invalid_argument,
                "view_over of a device cache needs the index table's host copy");
        view_type v = view_type::packed(store_.keys(layer), store_.values(layer), table, table ? table + n : nullptr, n,
                                 sinks_, ring_, window_, this->head_counts());
        v.scales = this->scales(layer);
        if (n > 0 && table && host_table[2 * n] != 0) {
            const int section = host_table[2 * n + 1 + layer];
            v.hole_offsets = table + section;
            v.hole_positions = table + section + n + 1;
        }
        return v;
    }

    std::size_t bytes_reserved() const noexcept { return store_.bytes(); }
    std::size_t bytes_used() const noexcept {
        std::size_t rows = 0;  // of every layer
        for (const auto& entry : sequences_)
            for (int l = 0; l < layers(); ++l)
                rows += present_positions_for(entry.second.length).size() - holes_of(entry.second, l).size();
        return rows * this->token_bytes();
    }

private:
    /// A reservation moved only the length (rows are written later): moving
    /// it back is always possible, unlike a truncate past evicted positions.
    void undo_reservation(sequence_id id, int old_length) { sequences_.at(id).length = old_length; }

    struct state {
        int slot = 0;
        int length = 0;
        std::vector<std::vector<int>> holes;  // per layer once compacted: present positions dropped, ascending
    };

    const std::vector<int>& holes_of(const state& s, int layer) const noexcept {
        static const std::vector<int> none;
        return s.holes.empty() ? none : s.holes[std::size_t(layer)];
    }
    /// Present positions of s less layer's holes.
    std::vector<int> visible_positions(const state& s, int layer) const {
        std::vector<int> out;
        const std::vector<int>& holes = holes_of(s, layer);
        for (int p : present_positions_for(s.length))
            if (!std::binary_search(holes.begin(), holes.end(), p)) out.push_back(p);
        return out;
    }
    /// Forgets holes whose positions are no longer present (the ring moved
    /// past them, or a truncate), and the compaction once none is left.
    void prune_holes(state& s) const {
        bool any = false;
        for (std::vector<int>& holes : s.holes) {
            holes.erase(std::remove_if(holes.begin(), holes.end(), [&](int p) { return !present(s.length, p); }),
                        holes.end());
            any = any || !holes.empty();
        }
        if (!any) s.holes.clear();
    }
    /// out_of_range, naming the position, when [first, first + n) holds a hole of the layer.
    void check_no_hole(const state& s, sequence_id id, int layer, int first, int n, const char* op) const {
        const std::vector<int>& holes = holes_of(s, layer);
        const auto hole = std::lower_bound(holes.begin(), holes.end(), first);
        require(hole == holes.end() || *hole >= first + n, error_code::out_of_range, op, " of positions [", first, ", ",
                std::int64_t(first) + n, ") of sequence ", id, ", layer ", layer, ": position ",
                hole == holes.end() ? 0 : *hole, " is not stored (a compaction dropped it)");
    }
    /// compact() of the listed layers (detail::compaction_calls). A visible
    /// index counts the rows the layer holds now: the sinks, then the ring's
    /// contents, in ascending position, less the rows earlier compactions
    /// dropped. The rows not kept become holes: no longer visible, read or
    /// written; no row moves. The ring still decides what stays: a kept ring
    /// row is overwritten, as any, once its position leaves the ring, and a
    /// sink dropped stays a hole. The slot's memory is fixed, so nothing is
    /// released (bytes_used() falls). Every list is checked before a hole is made.
    void compact_layers(sequence_id id, const std::vector<int>& which, const std::vector<const std::vector<int>*>& lists) {
        state& s = sequences_.at(id);
        std::vector<std::vector<int>> after = s.holes.empty() ? std::vector<std::vector<int>>(std::size_t(layers())) : s.holes;
        for (std::size_t k = 0; k < which.size(); ++k) {
            const std::vector<int> visible = visible_positions(s, which[k]);
            detail::check_kept_list(id, which[k], *lists[k], static_cast<int>(visible.size()));
            std::vector<int>& holes = after[std::size_t(which[k])];
            std::vector<char> keep(visible.size(), 0);
            for (int i : *lists[k]) keep[std::size_t(i)] = 1;
            for (std::size_t i = 0; i < visible.size(); ++i)
                if (!keep[i]) holes.push_back(visible[i]);
            std::sort(holes.begin(), holes.end());
        }
        s.holes = std::move(after);
        prune_holes(s);  // clears a compaction that kept every row
    }
    using store = detail::slot_store<Element, Heads, Memory>;

    int first_ring(int length) const noexcept { return std::max(sinks_, length - ring_); }
    int row_of(int position) const noexcept {
        return position < sinks_ ? position : sinks_ + (position - sinks_) % ring_;
    }

    void check_present(sequence_id id, int length, int first, int n) const {
        base::check_range(id, first, n, length);
        if (n == 0) return;
        // The range is present iff its first position is (present positions
        // form at most two intervals, and a range starting in the sinks must
        // also end there unless the ring follows them without a gap).
        const bool ok = present(length, first) &&
                        (first >= sinks_ || first + n <= sinks_ || first_ring(length) == sinks_);
        require(ok, error_code::out_of_range, "positions [", first, ", ", std::int64_t(first) + n, ") of sequence ",
                id, " are not all present: the window keeps sinks [0, ", std::min(length, sinks_), ") and [",
                first_ring(length), ", ", length, ")");
    }

    /// Calls f(row, done, count) for each run of adjacent rows covering [first, first + n).
    template <class F>
    void for_each_segment(int first, int n, F&& f) const {
        for (int done = 0; done < n;) {
            const int p = first + done;
            const int room = p < sinks_ ? sinks_ - p : ring_ - (p - sinks_) % ring_;
            const int count = std::min(room, n - done);
            f(row_of(p), done, count);
            done += count;
        }
    }

    std::vector<std::int32_t> tokens_of(sequence_id) const { return {}; }

    detail::file_header header() const {
        detail::file_header h;
        h.layout = kind;
        h.element = kinds_of<Element>();
        h.heads = shape_of(this->head_counts());
        h.layers = layers();
        h.parameters[0] = sinks_;
        h.parameters[1] = ring_;
        h.parameters[2] = window_;
        return h;
    }

    /// True when positions (ascending, as the reader checked) are among
    /// what this window keeps at length: all of them, or a compacted
    /// sequence's, with holes.
    bool keeps_subset(int length, span<const int> positions) const noexcept {
        for (int p : positions)
            if (!present(length, p)) return false;
        return true;
    }

    std::vector<sequence_id> restore(const detail::file_records<Element>& records) {
        std::size_t index = 0;
        for (const auto& r : records) {
            require(keeps_subset(r.length, r.positions), error_code::format_error, "sequence ", index, " of ",
                    records.size(), ": a sliding-window record of length ", r.length, " holds ", r.present(),
                    " positions, not among the ones this window keeps");
            ++index;
        }
        require(records.size() <= free_slots_.size(), error_code::capacity_exceeded, "loading ", records.size(),
                " sequences needs as many slots, ", free_slots_.size(), " are free");
        std::vector<sequence_id> ids;
        ids.reserve(records.size());
        const std::size_t key_row = this->key_token_row(), value_row = this->value_token_row();
        for (const auto& r : records) {
            const sequence_id id = add_sequence();
            ids.push_back(id);
            state& s = sequences_.at(id);
            s.length = r.length;
            // A compacted sequence's record lacks its holes: the same in every layer.
            std::vector<int> holes;
            for (int p : present_positions_for(r.length))
                if (!std::binary_search(r.positions.begin(), r.positions.end(), p)) holes.push_back(p);
            if (!holes.empty()) s.holes.assign(std::size_t(layers()), holes);
            detail::for_each_position_run(r.positions, [&](std::size_t i, std::size_t j) {
                for (int l = 0; l < layers(); ++l)
                    write(id, l, r.positions[i], span<const key_type>(r.keys(l) + i * key_row, (j - i) * key_row),
                          span<const value_type>(r.values(l) + i * value_row, (j - i) * value_row),
                          static_cast<int>(j - i));
            });
        }
        return ids;
    }

    int window_, sinks_, max_chunk_, ring_ = 1;
    store store_;
    std::vector<int> free_slots_;
    detail::sequence_registry<state> sequences_;
    detail::index_table<Memory> table_;
};

}  // namespace kvcache
