// Owners of the contiguous layout: a fixed "static" cache (slots x max
// length, allocated once) and a "dynamic" one that grows geometrically; both
// compact (keep chosen rows per layer at their true positions, at the front
// of the slot, so the slot's room is given back to later tokens).
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
#include "kvcache/layout/contiguous_view.hpp"

namespace kvcache {

/// Whether a contiguous cache may reallocate when slots or capacity run out.
enum class contiguous_growth {
    fixed,     ///< static cache: running out is error_code::capacity_exceeded
    geometric  ///< dynamic cache: slots and capacity double (at least) on demand
};

/// A cache of L layers in contiguous slabs, one slot per sequence, each slot
/// holding up to capacity() positions: [slot][kv_head][position][head_dim].
/// @tparam Element stored element type (float, kvcache::half, kvcache::bfloat16, fp8, qint8, qint4) or a
///         kv_elements pair (keys and values of two of them)
/// @tparam Heads a head_config
/// @tparam Memory host_memory or device_memory
template <class Element, class Heads, class Memory = host_memory>
class contiguous_cache : public detail::owner_base<contiguous_cache<Element, Heads, Memory>, Element, Heads>,
                         public detail::compaction_calls<contiguous_cache<Element, Heads, Memory>> {
    static_assert(is_cache_element_v<Element>, "kvcache::contiguous_cache stores float, kvcache::half, kvcache::bfloat16, kvcache::float8_e4m3, kvcache::float8_e5m2, kvcache::qint8, kvcache::qint4 or a kvcache::kv_elements pair of them");
    using base = detail::owner_base<contiguous_cache, Element, Heads>;
    friend base;
    friend detail::compaction_calls<contiguous_cache>;

public:
    using element_type = Element;
    using key_type = key_element_t<Element>;      ///< what key rows are stored as
    using value_type = value_element_t<Element>;  ///< what value rows are stored as
    using heads = Heads;
    using memory = Memory;
    using view_type = contiguous_view<Element, Heads>;
    static constexpr layout_kind kind = layout_kind::contiguous;

    /// Allocates layers x slots x max_length rows (zeroed). Throws
    /// invalid_argument for non-positive sizes, out_of_memory when allocation fails.
    contiguous_cache(int layers, int slots, int max_length, contiguous_growth growth = contiguous_growth::fixed)
        : contiguous_cache(Heads{}, layers, slots, max_length, growth) {
        static_assert(Heads::static_counts, "kvcache: a cache over a dynamic head_config takes the counts as its first argument");
    }

    /// The same for the given head counts (a dynamic head_config's runtime values).
    contiguous_cache(const Heads& heads, int layers, int slots, int max_length,
                     contiguous_growth growth = contiguous_growth::fixed)
        : base(heads), growth_(growth) {
        detail::require_positive(layers, "layers");
        detail::require_positive(slots, "slots");
        detail::require_positive(max_length, "max_length");
        store_ = store(layers, slots, max_length, this->kv_heads());
        free_slots_.reserve(slots);
        for (int s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
    }

    int layers() const noexcept { return store_.layers(); }
    int slot_count() const noexcept { return store_.slots(); }
    /// Positions each slot holds now (grows for the dynamic variant).
    int capacity() const noexcept { return store_.rows(); }
    contiguous_growth growth() const noexcept { return growth_; }

    /// Adds an empty sequence; capacity_exceeded when every slot is taken
    /// (fixed growth), or out_of_memory when growing fails.
    sequence_id add_sequence() {
        if (free_slots_.empty()) {
            require(growth_ == contiguous_growth::geometric, error_code::capacity_exceeded, "all ", slot_count(),
                    " slots of the contiguous cache are taken");
            regrow(2 * slot_count(), capacity());
        }
        const int slot = free_slots_.back();
        const sequence_id id = sequences_.insert(state{slot, 0, {}});
        free_slots_.pop_back();
        return id;
    }

    /// Frees the sequence's slot; not_found for an unknown id.
    void remove_sequence(sequence_id id) {
        const int slot = sequences_.at(id).slot;
        free_slots_.push_back(slot);
        sequences_.erase(id);
    }

    /// Storage slot of a sequence.
    int slot(sequence_id id) const { return sequences_.at(id).slot; }

    /// Reserves n new positions at the end of the sequence and returns the
    /// first; kernels then write their rows through view(). capacity_exceeded
    /// names the length and capacity when a fixed slot would overflow.
    int begin_append(sequence_id id, int n) {
        detail::require_count(n, "n_tokens");
        state& s = sequences_.at(id);
        require(n <= 0x7fffffff - s.length, error_code::capacity_exceeded, "length ", s.length, " + ", n,
                " overflows int");
        const int stored = stored_rows(s);  // the length, less what a compaction dropped
        if (n > capacity() - stored) {
            require(growth_ == contiguous_growth::geometric, error_code::capacity_exceeded, "append of ", n,
                    " tokens to sequence ", id, " (length ", s.length, ", ", stored, " rows stored) exceeds the slot capacity ",
                    capacity());
            const std::int64_t wanted = std::max<std::int64_t>(std::int64_t(stored) + n, 2 * std::int64_t(capacity()));
            regrow(slot_count(), static_cast<int>(std::min<std::int64_t>(wanted, 0x7fffffff)));
        }
        const int first = s.length;
        s.length += n;
        return first;
    }

    using base::write;  // also from rows of the other element type, converted
    /// Writes rows of positions [first, first + n) of one layer from host
    /// arrays [token][kv_head][head_dim]; the positions must be below length().
    void write(sequence_id id, int layer, int first, span<const key_type> key_rows, span<const value_type> value_rows, int n) {
        base::check_rows(key_rows.size(), value_rows.size(), n, id, layer, "write");
        const key_type* const keys = key_rows.data();
        const value_type* const values = value_rows.data();
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        base::check_range(id, first, n, s.length);
        if (n == 0) return;
        store_.write(layer, s.slot, s.compaction.stored_row(id, s.length, layer, first, n, "write"), keys, values, n);
    }

    using base::read;  // also into float or 16-bit rows, widened (int8, int4 and fp8 dequantised)

    /// Reads rows of positions [first, first + n) of one layer into host arrays.
    void read(sequence_id id, int layer, int first, int n, span<key_type> key_rows, span<value_type> value_rows) const {
        base::check_rows(key_rows.size(), value_rows.size(), n, id, layer, "read");
        key_type* const keys = key_rows.data();
        value_type* const values = value_rows.data();
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        base::check_range(id, first, n, s.length);
        if (n == 0) return;
        store_.read(layer, s.slot, s.compaction.stored_row(id, s.length, layer, first, n, "read"), n, keys, values);
    }

    /// Shortens the sequence to new_length; out_of_range when past the end.
    /// A compacted sequence drops, in every layer, the rows of positions at
    /// or past new_length (the next append lands at position new_length).
    void truncate(sequence_id id, int new_length) {
        state& s = sequences_.at(id);
        base::check_truncate(id, new_length, s.length);
        s.compaction.truncate(new_length);
        s.length = new_length;
    }

    /// A new sequence with a copy of id's rows and compaction (contiguous slots share nothing).
    sequence_id fork(sequence_id id) {
        detail::layer_table compaction = sequences_.at(id).compaction;  // copied first: add_sequence may regrow
        const sequence_id child = add_sequence();
        const state& parent = sequences_.at(id);
        state& c = sequences_.at(child);
        store_.copy_slot(store_, parent.slot, c.slot, stored_rows(parent));
        c.length = parent.length;
        c.compaction = std::move(compaction);
        return child;
    }

    /// Rows the sequence stores in one layer (length(id) until a compaction drops some).
    int visible_count(sequence_id id, int layer) const {
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        return s.length - s.compaction.layer(layer).dropped;
    }
    /// The positions of the rows one layer stores, ascending (visible index i holds the i-th).
    std::vector<int> present_positions(sequence_id id, int layer) const {
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        return s.compaction.positions(layer, s.length);
    }
    /// True while some layer of the sequence holds fewer rows than its length.
    bool compacted(sequence_id id) const { return !sequences_.at(id).compaction.empty(); }
    /// Rows moved by compact() so far (of one layer, every KV head).
    std::uint64_t rows_moved_by_compaction() const noexcept { return rows_moved_; }

    /// Positions a kernel may read: all of [0, length) unless the sequence was
    /// compacted, then those of its layers, which must agree (what save()
    /// records): invalid_argument when layers keep different positions.
    std::vector<int> present_positions(sequence_id id) const {
        const state& s = sequences_.at(id);
        return s.compaction.common_positions(id, s.length, layers());
    }

    /// The view of one layer over a batch (batch slot i is batch[i]). It stays
    /// valid until the cache changes or a view of a different batch is made;
    /// a step_plan's views (plan()) have no such limit.
    view_type view(int layer, const std::vector<sequence_id>& batch) {
        this->check_layer(layer);
        const std::vector<int> table = view_table(batch);
        view_type v = view_over(layer, table_.upload(table), static_cast<int>(batch.size()), table.data());
        v.sequence_ids = table_.label(batch);
        return v;
    }

    /// The index table a view of batch reads: lengths [n], slots [n], then
    /// the compaction sections of a batch with a compacted sequence (as the
    /// paged cache's: a marker, each layer's start, per layer dropped [n],
    /// offsets [n + 1] and kept positions).
    std::vector<int> view_table(const std::vector<sequence_id>& batch) const {
        std::vector<int> table = this->length_slot_table(batch);
        detail::append_compaction_sections(table, batch.size(), layers(), [&](std::size_t i) -> const detail::layer_table& {
            return sequences_.at(batch[i]).compaction;
        });
        return table;
    }

    /// The view of one layer whose index table (view_table()'s contents, in
    /// the cache's memory space) the caller keeps at table, for n entries;
    /// host_table is the same table in host memory (it says where the
    /// layer's compaction section starts). A host cache may pass null: the
    /// table itself is read then; a device cache must pass it.
    view_type view_over(int layer, const int* table, int n, const int* host_table = nullptr) {
        this->check_layer(layer);
        if constexpr (Memory::space == memory_space::host) {
            if (!host_table) host_table = table;
        }
        require(host_table != nullptr || n == 0 || !table, error_code::invalid_argument,
                "view_over of a device cache needs the index table's host copy");
        view_type v = view_type::packed(store_.keys(layer), store_.values(layer), table, table ? table + n : nullptr, n,
                                 capacity(), this->head_counts());
        v.scales = this->scales(layer);
        detail::attach_compaction(v, table, host_table, 2 * n, layer, n);
        return v;
    }

    /// Bytes of every slab, used or not.
    std::size_t bytes_reserved() const noexcept { return store_.bytes(); }
    /// Bytes holding rows of live positions.
    std::size_t bytes_used() const noexcept {
        std::size_t rows = 0;  // of every layer
        for (const auto& entry : sequences_)
            for (int l = 0; l < layers(); ++l) rows += std::size_t(entry.second.length - entry.second.compaction.layer(l).dropped);
        return rows * this->token_bytes();
    }

private:
    struct state {
        int slot = 0;
        int length = 0;
        detail::layer_table compaction;  // per layer once compacted; empty: row == position everywhere
    };

    /// Rows of the layer that stores the most: what s's slot must hold.
    static int stored_rows(const state& s) noexcept { return s.length - s.compaction.fewest_dropped(); }

    /// compact() of the listed layers (detail::compaction_calls), as
    /// paged_cache::compact does: the kept rows move in order to the front of
    /// the slot and keep their true positions; later tokens land after them,
    /// so the slot's capacity counts stored rows, not positions. Nothing is
    /// shared between slots, so nothing is copied first; the slot's memory
    /// stays reserved (bytes_used() falls). Every list is checked before a row moves.
    void compact_layers(sequence_id id, const std::vector<int>& which, const std::vector<const std::vector<int>*>& lists) {
        state& s = sequences_.at(id);
        std::vector<detail::layer_rows> after = s.compaction.after_compaction(id, s.length, layers(), which, lists);
        for (std::size_t k = 0; k < which.size(); ++k) rows_moved_ += store_.compact_rows(which[k], s.slot, *lists[k]);
        s.compaction = std::move(after);
        s.compaction.normalize();
    }
    using store = detail::slot_store<Element, Heads, Memory>;

    std::vector<std::int32_t> tokens_of(sequence_id) const { return {}; }

    detail::file_header header() const {
        detail::file_header h;
        h.layout = kind;
        h.element = kinds_of<Element>();
        h.heads = shape_of(this->head_counts());
        h.layers = layers();
        return h;
    }

    /// Allocates the new store first, so a failure leaves everything as it was.
    void regrow(int slots, int rows) {
        store grown(layers(), slots, rows, this->kv_heads());
        for (const auto& entry : sequences_)
            grown.copy_slot(store_, entry.second.slot, entry.second.slot, stored_rows(entry.second));
        for (int s = slots - 1; s >= store_.slots(); --s) free_slots_.insert(free_slots_.begin(), s);
        store_ = std::move(grown);
    }

    std::vector<sequence_id> restore(const detail::file_records<Element>& records) {
        // A record holding fewer positions than its length (a compacted
        // sequence's) comes back compacted the same in every layer; a slot
        // needs only its stored rows.
        int longest = 0;
        for (const auto& r : records) longest = std::max(longest, r.present());
        const std::size_t free = free_slots_.size();
        if (growth_ == contiguous_growth::fixed) {
            require(records.size() <= free, error_code::capacity_exceeded, "loading ", records.size(),
                    " sequences needs as many slots, ", free, " are free");
            require(longest <= capacity(), error_code::capacity_exceeded, "saved sequence of ", longest,
                    " stored positions exceeds the slot capacity ", capacity());
        } else if (records.size() > free || longest > capacity()) {
            const std::size_t slots = std::max<std::size_t>(slot_count(), sequences_.size() + records.size());
            require(slots <= 0x7fffffff, error_code::capacity_exceeded, "loading ", records.size(),
                    " sequences would need ", slots, " slots, more than an int counts");
            const int rows = std::max(capacity(), longest);
            // Every slot gets the longest record's rows: bound that by what the
            // file's bytes justify, or one file of many empty records and one
            // long one could make us reserve records x longest.
            const std::size_t position_bytes = std::size_t(layers()) * this->token_bytes();
            const long double wanted = static_cast<long double>(slots) * rows * position_bytes;
            const std::uint64_t reserved = bytes_reserved();
            const std::uint64_t allowance = std::max<std::uint64_t>(reserved, detail::load_growth_factor * records.file_bytes());
            require(wanted <= static_cast<long double>(reserved) + allowance, error_code::capacity_exceeded,
                    "loading ", records.size(), " sequences (longest ", longest, ") would grow the dynamic cache to ",
                    slots, " slots x ", rows, " positions = ", static_cast<std::uint64_t>(wanted),
                    " bytes from ", reserved, "; a load may add at most max(the current reservation, ",
                    detail::load_growth_factor, " x the file's ", records.file_bytes(), " bytes) = ", allowance,
                    " bytes (make the cache with more slots or length first, or use a paged_cache)");
            regrow(static_cast<int>(slots), rows);
        }
        std::vector<sequence_id> ids;
        ids.reserve(records.size());
        for (const auto& r : records) {
            const sequence_id id = add_sequence();
            ids.push_back(id);
            state& s = sequences_.at(id);
            s.length = r.length;  // positions the reader checked ascend inside [0, length)
            if (r.present() < r.length) s.compaction.assign_everywhere(layers(), r.length, r.positions);
            const std::size_t key_row = this->key_token_row(), value_row = this->value_token_row();
            detail::for_each_position_run(r.positions, [&](std::size_t i, std::size_t j) {
                for (int l = 0; l < layers(); ++l)
                    write(id, l, r.positions[i], span<const key_type>(r.keys(l) + i * key_row, (j - i) * key_row),
                          span<const value_type>(r.values(l) + i * value_row, (j - i) * value_row),
                          static_cast<int>(j - i));
            });
        }
        return ids;
    }

    contiguous_growth growth_;
    store store_;
    std::vector<int> free_slots_;  // a stack: the lowest slot is used first
    detail::sequence_registry<state> sequences_;
    detail::index_table<Memory> table_;
    std::uint64_t rows_moved_ = 0;
};

/// The static cache: a contiguous cache that never reallocates.
/// @tparam Element stored element type
/// @tparam Heads a head_config
/// @tparam Memory host_memory or device_memory
template <class Element, class Heads, class Memory = host_memory>
class static_cache : public contiguous_cache<Element, Heads, Memory> {
public:
    /// layers x slots x max_length rows, allocated once.
    static_cache(int layers, int slots, int max_length)
        : contiguous_cache<Element, Heads, Memory>(layers, slots, max_length, contiguous_growth::fixed) {}
    /// The same for the given head counts.
    static_cache(const Heads& heads, int layers, int slots, int max_length)
        : contiguous_cache<Element, Heads, Memory>(heads, layers, slots, max_length, contiguous_growth::fixed) {}
};

/// The dynamic cache: a contiguous cache whose slots and capacity grow
/// geometrically (every row moves on growth; views made before are stale).
/// @tparam Element stored element type
/// @tparam Heads a head_config
/// @tparam Memory host_memory or device_memory
template <class Element, class Heads, class Memory = host_memory>
class dynamic_cache : public contiguous_cache<Element, Heads, Memory> {
public:
    /// Starts with layers x initial_slots x initial_length rows.
    dynamic_cache(int layers, int initial_slots = 1, int initial_length = 64)
        : contiguous_cache<Element, Heads, Memory>(layers, initial_slots, initial_length,
                                                   contiguous_growth::geometric) {}
    /// The same for the given head counts.
    dynamic_cache(const Heads& heads, int layers, int initial_slots = 1, int initial_length = 64)
        : contiguous_cache<Element, Heads, Memory>(heads, layers, initial_slots, initial_length,
                                                   contiguous_growth::geometric) {}
};

}  // namespace kvcache
