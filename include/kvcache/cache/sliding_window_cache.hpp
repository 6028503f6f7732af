// Owner of the sliding-window layout: fixed slots of S sink rows plus a ring
// of R = window + max_chunk - 1 rows, so generation runs without bound in
// fixed memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvcache/cache/owner_base.hpp"
#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/cache/slot_store.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/layout/sliding_window_view.hpp"

namespace kvcache {

/// A sliding-window cache of L layers (StreamingLLM). Each sequence keeps its
/// first `sinks` positions forever and the newest `ring` positions; a query
/// sees the sinks plus keys newer than query - window. Appends come in chunks
/// of at most max_chunk tokens, which the ring is sized for. Keys are stored
/// rotated at their original position (RoPE is applied before the write).
/// @tparam Element stored element type (float, kvcache::half or kvcache::bfloat16)
/// @tparam Heads a head_config
/// @tparam Memory host_memory or device_memory
template <class Element, class Heads, class Memory = host_memory>
class sliding_window_cache : public detail::owner_base<sliding_window_cache<Element, Heads, Memory>, Element, Heads> {
    static_assert(is_element_v<Element> || std::is_same_v<Element, qint8>, "kvcache::sliding_window_cache stores float, kvcache::half, kvcache::bfloat16, kvcache::float8_e4m3, kvcache::float8_e5m2 or kvcache::qint8");
    using base = detail::owner_base<sliding_window_cache, Element, Heads>;
    friend base;

public:
    using element_type = Element;
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
        const sequence_id id = sequences_.insert(state{free_slots_.back(), 0});
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
        return first;
    }

    using base::write;  // also from rows of the other element type, converted
    /// Writes rows of present positions [first, first + n) of one layer from
    /// host arrays [token][kv_head][head_dim].
    void write(sequence_id id, int layer, int first, span<const Element> key_rows, span<const Element> value_rows, int n) {
        base::check_rows(key_rows.size(), value_rows.size(), n, id, layer, "write");
        const Element* const keys = key_rows.data();
        const Element* const values = value_rows.data();
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        check_present(id, s.length, first, n);
        for_each_segment(first, n, [&](int row, int done, int count) {
            const std::size_t at = std::size_t(done) * this->token_row();
            store_.write(layer, s.slot, row, keys + at, values + at, count);
        });
    }

    /// Reads rows of present positions [first, first + n) of one layer into host arrays.
    void read(sequence_id id, int layer, int first, int n, span<Element> key_rows, span<Element> value_rows) const {
        base::check_rows(key_rows.size(), value_rows.size(), n, id, layer, "read");
        Element* const keys = key_rows.data();
        Element* const values = value_rows.data();
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        check_present(id, s.length, first, n);
        for_each_segment(first, n, [&](int row, int done, int count) {
            const std::size_t at = std::size_t(done) * this->token_row();
            store_.read(layer, s.slot, row, count, keys + at, values + at);
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
    }

    /// A new sequence with a copy of id's sinks and ring.
    sequence_id fork(sequence_id id) {
        const state parent = sequences_.at(id);
        const sequence_id child = add_sequence();
        state& c = sequences_.at(child);
        store_.copy_slot(store_, parent.slot, c.slot, store_.rows());
        c.length = parent.length;
        return child;
    }

    /// Present positions, ascending: the sinks, then the ring's contents.
    std::vector<int> present_positions(sequence_id id) const { return present_positions_for(this->length(id)); }
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
        view_type v = view_over(layer, table_.upload(view_table(batch)), static_cast<int>(batch.size()));
        v.sequence_ids = table_.label(batch);
        return v;
    }

    /// The index table a view of batch reads: lengths, then slots.
    std::vector<int> view_table(const std::vector<sequence_id>& batch) const { return this->length_slot_table(batch); }

    /// The view of one layer whose index table (view_table()'s contents, in
    /// the cache's memory space) the caller keeps at table, for n entries
    /// (the table's host copy, which a paged cache reads, is not needed here).
    view_type view_over(int layer, const int* table, int n, const int* /*host_table*/ = nullptr) {
        this->check_layer(layer);
        view_type v = view_type::packed(store_.keys(layer), store_.values(layer), table, table ? table + n : nullptr, n,
                                 sinks_, ring_, window_, this->head_counts());
        v.scales = this->scales(layer);
        return v;
    }

    std::size_t bytes_reserved() const noexcept { return store_.bytes(); }
    std::size_t bytes_used() const noexcept {
        std::size_t rows = 0;
        for (const auto& entry : sequences_) rows += present_positions_for(entry.second.length).size();
        return rows * layers() * 2 * this->token_row() * sizeof(Element);
    }

private:
    /// A reservation moved only the length (rows are written later): moving
    /// it back is always possible, unlike a truncate past evicted positions.
    void undo_reservation(sequence_id id, int old_length) { sequences_.at(id).length = old_length; }

    struct state {
        int slot = 0;
        int length = 0;
    };
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
        h.element = element_traits<Element>::kind;
        h.heads = shape_of(this->head_counts());
        h.layers = layers();
        h.parameters[0] = sinks_;
        h.parameters[1] = ring_;
        h.parameters[2] = window_;
        return h;
    }

    /// True when positions are exactly what this window keeps at length.
    bool keeps_exactly(int length, span<const int> positions) const noexcept {
        const int sinks = std::min(length, sinks_), ring_from = first_ring(length);
        const std::size_t kept = std::size_t(sinks) + std::size_t(std::max(0, length - ring_from));
        if (positions.size() != kept) return false;
        std::size_t i = 0;
        for (int p = 0; p < sinks; ++p)
            if (positions[i++] != p) return false;
        for (int p = ring_from; p < length; ++p)
            if (positions[i++] != p) return false;
        return true;
    }

    std::vector<sequence_id> restore(const detail::file_records<Element>& records) {
        std::size_t index = 0;
        for (const auto& r : records) {
            require(keeps_exactly(r.length, r.positions), error_code::format_error, "sequence ", index, " of ",
                    records.size(), ": a sliding-window record of length ", r.length, " holds ", r.present(),
                    " positions, not the ones this window keeps");
            ++index;
        }
        require(records.size() <= free_slots_.size(), error_code::capacity_exceeded, "loading ", records.size(),
                " sequences needs as many slots, ", free_slots_.size(), " are free");
        std::vector<sequence_id> ids;
        ids.reserve(records.size());
        const std::size_t row = this->token_row();
        for (const auto& r : records) {
            const sequence_id id = add_sequence();
            ids.push_back(id);
            sequences_.at(id).length = r.length;
            detail::for_each_position_run(r.positions, [&](std::size_t i, std::size_t j) {
                for (int l = 0; l < layers(); ++l)
                    write(id, l, r.positions[i], span<const Element>(r.keys(l) + i * row, (j - i) * row),
                          span<const Element>(r.values(l) + i * row, (j - i) * row), static_cast<int>(j - i));
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
