// What every cache owner offers on top of its own primitives: the host-side
// append convenience, keep_only, and save/load to streams and files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/cache/serialization.hpp"
#include "kvcache/cache/step_plan.hpp"

namespace kvcache {
namespace detail {

/// Calls f(i, j) for each maximal [i, j) of ascending positions that are
/// consecutive (a std::vector or a span).
template <class Positions, class F>
void for_each_position_run(const Positions& positions, F&& f) {
    std::size_t i = 0;
    while (i < positions.size()) {
        std::size_t j = i + 1;
        while (j < positions.size() && positions[j] == positions[j - 1] + 1) ++j;
        f(i, j);
        i = j;
    }
}

/// CRTP base of the owners. Derived provides layers(), header(),
/// present_positions(), tokens_of(), read(), write(), begin_append(),
/// remove_sequence(), restore(records) (all-or-nothing) and a
/// sequence_registry sequences_ whose states have a length (and, for the
/// slot-based owners, a slot); it makes this base a friend.
/// @tparam Derived the owner
/// @tparam Element stored element type, or a kv_elements pair
/// @tparam Heads a head_config
template <class Derived, class Element, class Heads>
class owner_base {
public:
    using key_type = key_element_t<Element>;      ///< what key rows are stored as
    using value_type = value_element_t<Element>;  ///< what value rows are stored as

    /// True when rows of these buffers' element types are what the cache
    /// stores, so append and write take them as they are.
    template <class Keys, class Values>
    static constexpr bool stores_as_is = std::is_same_v<detail::range_element_t<Keys>, key_type> &&
                                         std::is_same_v<detail::range_element_t<Values>, value_type>;


    /// The step plan type of this owner (what plan() returns).
    using plan_type = step_plan<Derived>;

    /// True when id names a live sequence.
    bool contains(sequence_id id) const { return derived().sequences_.contains(id); }
    /// Live sequences.
    std::size_t sequence_count() const noexcept { return derived().sequences_.size(); }
    /// Ids of the live sequences.
    std::vector<sequence_id> sequences() const { return derived().sequences_.ids(); }
    /// Positions of a sequence; not_found for an unknown id.
    int length(sequence_id id) const { return derived().sequences_.at(id).length; }

    /// The head configuration: for a dynamic one, the counts it was built with.
    const Heads& head_counts() const noexcept { return heads_; }
    /// Query heads.
    int query_heads() const noexcept { return heads_.query_heads(); }
    /// Key/value heads.
    int kv_heads() const noexcept { return heads_.kv_heads(); }

    /// Sets the scales the stored keys and values of one layer are read
    /// through (an fp8 cache: a stored key k means float(k) * scales.key, and
    /// float rows appended are divided by it before rounding). Per layer, as
    /// fp8 checkpoints ship k_scale and v_scale. Set them before the first
    /// sequence: rows already stored were narrowed with the old ones. Throws
    /// invalid_argument for a cache whose element type has no scale, a scale
    /// that is not finite and positive, a scale other than 1 for a side a
    /// kv_elements pair stores without one (its other side fp8), or a cache
    /// that holds sequences, and out_of_range for a bad layer; nothing changes then.
    void set_scales(int layer, kv_scales scales) {
        const Derived& self = derived();
        check_layer(layer);
        require(has_scaled_side_v<Element>, error_code::invalid_argument, "set_scales on layer ", layer, ": a ",
                kvcache::element_name<Element>(), " cache stores values as they are (only fp8 caches take scales)");
        const auto usable = [](float x) { return x > 0.0f && x <= std::numeric_limits<float>::max(); };
        require(usable(scales.key), error_code::invalid_argument, "set_scales on layer ", layer, ": key scale ",
                scales.key, " is not a finite positive number");
        require(usable(scales.value), error_code::invalid_argument, "set_scales on layer ", layer, ": value scale ",
                scales.value, " is not a finite positive number");
        require(is_scaled_element_v<key_type> || scales.key == 1.0f, error_code::invalid_argument, "set_scales on layer ",
                layer, ": key scale ", scales.key, " for keys stored as ", element_traits<key_type>::name,
                ", which take no scale (1 only)");
        require(is_scaled_element_v<value_type> || scales.value == 1.0f, error_code::invalid_argument,
                "set_scales on layer ", layer, ": value scale ", scales.value, " for values stored as ",
                element_traits<value_type>::name, ", which take no scale (1 only)");
        require(self.sequences_.size() == 0, error_code::invalid_argument, "set_scales on layer ", layer,
                ": the cache holds ", self.sequences_.size(),
                " sequences whose rows were stored with the old scales (set scales before the first sequence)");
        if (scales_.empty()) scales_.assign(std::size_t(self.layers()), kv_scales{});
        scales_[std::size_t(layer)] = scales;
    }

    /// The scales of one layer (1 and 1 until set_scales; always so for
    /// element types without a scale). Throws out_of_range for a bad layer.
    kv_scales scales(int layer) const {
        check_layer(layer);
        return scales_.empty() ? kv_scales{} : scales_[std::size_t(layer)];
    }

    /// Appends n tokens' rows for one layer from host arrays laid out
    /// [token][kv_head][head_dim]. Layer 0 opens the step: it reserves n new
    /// positions for every layer (begin_append) and writes its rows; layers
    /// 1..L-1 then fill those same last n positions. Throws on a bad layer,
    /// n, or (layer > 0) n larger than the sequence; nothing changes then.
    void append(sequence_id id, int layer, span<const key_type> keys, span<const value_type> values, int n) {
        Derived& self = derived();
        check_layer(layer);
        check_rows(keys.size(), values.size(), n, id, layer, "append");
        if (layer == 0) {
            // begin_append checks capacity first; a failing write afterwards
            // would be a device fault, not bad input.
            const int first = self.begin_append(id, n);
            try {
                self.write(id, 0, first, keys, values, n);
            } catch (...) {
                self.truncate(id, first);
                throw;
            }
        } else {
            const int length = self.length(id);
            require(n <= length, error_code::out_of_range, "append of ", n, " tokens to layer ", layer,
                    " of sequence ", id, " exceeds the ", length, " positions layer 0 reserved");
            self.write(id, layer, length - n, keys, values, n);
        }
    }

    /// Plans one step of a batch: reserves new_tokens[i] positions for
    /// batch[i] in every layer (none when new_tokens is empty: a plan to
    /// attend only) and builds the tables every layer's view and kernel call
    /// of the step uses, uploaded on stream for a device cache. Throws, with
    /// nothing reserved, on an unknown or repeated id, a size mismatch, a
    /// negative count, or when the cache cannot hold the new tokens.
    /// @tparam D the owner (deduced: defers naming its memory policy to the call)
    template <class D = Derived>
    step_plan<D> plan(const std::vector<sequence_id>& batch, const std::vector<int>& new_tokens = {},
                      typename D::memory::stream_type stream = {}) {
        step_plan<D> p;
        replan(p, batch, new_tokens, stream);
        return p;
    }

    /// plan() into an existing plan, reusing its buffers (no allocation once
    /// they are large enough). On an error the plan and the cache are unchanged.
    /// @tparam D the owner (deduced)
    template <class D = Derived>
    void replan(step_plan<D>& p, const std::vector<sequence_id>& batch, const std::vector<int>& new_tokens = {},
                typename D::memory::stream_type stream = {}) {
        replan_reserving(p, batch, new_tokens, stream,
                         [&](std::size_t i) { derived().reserve_for_plan(batch[i], new_tokens[i], stream); });
    }

    /// append() from rows of another element type (float rows into a half or
    /// bfloat16 cache, or 16-bit rows into float; into a kv_elements pair
    /// each side converted to its own type), converted on the way in.
    /// @tparam Keys a sized buffer of float, kvcache::half or kvcache::bfloat16
    /// @tparam Values a sized buffer of the same element type
    template <class Keys, class Values, class = std::enable_if_t<!stores_as_is<Keys, Values>>>
    void append(sequence_id id, int layer, const Keys& keys, const Values& values, int n) {
        const kv_scales s = scales(layer);  // checks the layer
        check_input_rows(make_span(keys).size(), make_span(values).size(), n, id, layer, "append");
        const std::vector<key_type> key_rows = converted_rows<key_type>(keys, s.key);
        const std::vector<value_type> value_rows = converted_rows<value_type>(values, s.value);
        append(id, layer, span<const key_type>(key_rows), span<const value_type>(value_rows), n);
    }

    /// Derived's write() from rows of another element type (float rows into a
    /// half or bfloat16 cache, or 16-bit rows into float; into a kv_elements
    /// pair each side converted to its own type), converted on the way in.
    /// @tparam Keys a sized buffer of float, kvcache::half or kvcache::bfloat16
    /// @tparam Values a sized buffer of the same element type
    template <class Keys, class Values, class = std::enable_if_t<!stores_as_is<Keys, Values>>>
    void write(sequence_id id, int layer, int first, const Keys& key_rows, const Values& value_rows, int n) {
        const kv_scales s = scales(layer);  // checks the layer
        check_input_rows(make_span(key_rows).size(), make_span(value_rows).size(), n, id, layer, "write");
        const std::vector<key_type> keys = converted_rows<key_type>(key_rows, s.key);
        const std::vector<value_type> values = converted_rows<value_type>(value_rows, s.value);
        derived().write(id, layer, first, span<const key_type>(keys), span<const value_type>(values), n);
    }

    /// Derived's read() into float, half or bfloat16 rows [token][kv_head][head_dim]:
    /// the values attention sees (widen_row: fp8 times its layer scale, int8
    /// and int4 dequantised with their rows' scales), narrowed to Out where Out
    /// is 16-bit. The same checks and errors as read() of stored rows, counted in
    /// head_dim values a row.
    /// @tparam Out float, kvcache::half or kvcache::bfloat16 (not Element itself)
    template <class Out, class = std::enable_if_t<is_activation_element_v<Out> &&
                                                  !(std::is_same_v<Out, key_type> && std::is_same_v<Out, value_type>)>>
    void read(sequence_id id, int layer, int first, int n, span<Out> key_rows, span<Out> value_rows) const {
        const kv_scales s = scales(layer);  // checks the layer
        require_count(n, "n_tokens");
        const std::int64_t row = std::int64_t(kv_heads()) * Heads::head_dim;
        require_elements(key_rows.size(), n, row, "keys", "tokens x (kv_heads x head_dim)", " (read of sequence ", id,
                         ", layer ", layer, ")");
        require_elements(value_rows.size(), n, row, "values", "tokens x (kv_heads x head_dim)", " (read of sequence ",
                         id, ", layer ", layer, ")");
        std::vector<key_type> keys(std::size_t(n) * key_token_row());
        std::vector<value_type> values(std::size_t(n) * value_token_row());
        derived().read(id, layer, first, n, span<key_type>(keys), span<value_type>(values));
        constexpr int dim = Heads::head_dim;
        std::vector<float> widened(dim);
        const auto widen_into = [&](const auto& from, float scale, Out* to) {
            using side = typename std::decay_t<decltype(from)>::value_type;
            constexpr std::size_t stored = std::size_t(row_elements<side>(dim));
            for (std::size_t r = 0; r < std::size_t(n) * std::size_t(kv_heads()); ++r) {
                widen_row(from.data() + r * stored, dim, scale, widened.data());
                for (int d = 0; d < dim; ++d) to[r * dim + std::size_t(d)] = from_float<Out>(widened[std::size_t(d)]);
            }
        };
        widen_into(keys, s.key, key_rows.data());
        widen_into(values, s.value, value_rows.data());
    }

    /// Removes every sequence not in keep; throws not_found (and removes
    /// nothing) when an id in keep is unknown.
    void keep_only(const std::vector<sequence_id>& keep) {
        Derived& self = derived();
        for (sequence_id id : keep) (void)self.length(id);
        for (sequence_id id : self.sequences())
            if (std::find(keep.begin(), keep.end(), id) == keep.end()) self.remove_sequence(id);
    }

    /// Saves every sequence (see serialization.hpp for the format).
    void save(std::ostream& out) const { save(out, derived().sequences()); }

    /// Saves the given sequences; throws not_found before writing anything
    /// when one is unknown.
    void save(std::ostream& out, const std::vector<sequence_id>& ids) const {
        const Derived& self = derived();
        for (sequence_id id : ids) (void)self.length(id);
        std::vector<sequence_record<Element>> records;
        const std::size_t key_row = key_token_row(), value_row = value_token_row();
        for (sequence_id id : ids) {
            sequence_record<Element> rec;
            rec.length = self.length(id);
            rec.positions = self.present_positions(id);
            rec.tokens = self.tokens_of(id);
            const std::size_t present = rec.positions.size();
            rec.keys.assign(self.layers(), std::vector<key_type>(present * key_row));
            rec.values.assign(self.layers(), std::vector<value_type>(present * value_row));
            for (int l = 0; l < self.layers(); ++l) {
                for_each_position_run(rec.positions, [&](std::size_t i, std::size_t j) {  // one read per run
                    self.read(id, l, rec.positions[i], static_cast<int>(j - i),
                              span<key_type>(rec.keys[l].data() + i * key_row, (j - i) * key_row),
                              span<value_type>(rec.values[l].data() + i * value_row, (j - i) * value_row));
                });
            }
            records.push_back(std::move(rec));
        }
        write_file(out, header_with_scales(), records);
    }

    /// Loads every sequence of a saved file as new sequences and returns their
    /// ids in file order. The file is the rest of the stream; it is checked
    /// whole (magic, version, configuration, every count against the bytes
    /// present, checksum) before anything large is allocated, and the cache
    /// changes only once it is known to fit; on any error the cache is unchanged.
    std::vector<sequence_id> load(std::istream& in) {
        const auto records = read_file<Element>(in, header_with_scales());
        return derived().restore(records);
    }

    /// save(stream) to a file.
    void save_file(const std::string& path) const {
        auto out = open_for_save(path);
        save(out);
    }
    /// save(stream, ids) to a file.
    void save_file(const std::string& path, const std::vector<sequence_id>& ids) const {
        auto out = open_for_save(path);
        save(out, ids);
    }
    /// load(stream) from a file; errors name the path.
    std::vector<sequence_id> load_file(const std::string& path) {
        auto in = open_for_load(path);
        try {
            return load(in);
        } catch (const error& e) {
            rethrow_for_file(e, path);
        }
    }

protected:
    owner_base() = default;
    /// Takes the head counts; throws invalid_argument when a dynamic configuration's are unset.
    explicit owner_base(const Heads& heads) : heads_(heads) {
        require(heads.valid(), error_code::invalid_argument,
                "the head counts are not set: a cache over a dynamic head_config takes them as its first argument, "
                "e.g. head_config<dynamic, dynamic, ", Heads::head_dim, ">{32, 8}");
    }
    /// Key elements of one token in one layer as stored: kv_heads x row_elements
    /// (row_elements: head_dim, more for qint8 and qint4, whose rows carry their scales).
    std::size_t key_token_row() const noexcept { return std::size_t(kv_heads()) * row_elements<key_type>(Heads::head_dim); }
    /// Value elements of one token in one layer as stored (key_token_row for the values' type).
    std::size_t value_token_row() const noexcept {
        return std::size_t(kv_heads()) * row_elements<value_type>(Heads::head_dim);
    }
    /// Bytes of one token's keys and values in one layer as stored.
    std::size_t token_bytes() const noexcept {
        return key_token_row() * sizeof(key_type) + value_token_row() * sizeof(value_type);
    }

    /// Rows of an activation type converted to the stored Side (write/append
    /// of float rows), divided by scale first for fp8.
    /// @tparam Side the stored type of the side (key_type or value_type)
    /// @tparam Rows a sized buffer of float, kvcache::half or kvcache::bfloat16
    template <class Side, class Rows>
    static std::vector<Side> converted_rows(const Rows& rows, float scale) {
        using Input = detail::range_element_t<Rows>;
        static_assert(is_activation_element_v<Input>, "kvcache: K/V rows are float, kvcache::half or kvcache::bfloat16");
        const auto in = make_span(rows);
        if constexpr (is_row_quantised_v<Side>) {
            // Each head_dim values become one quantised row with its own scales
            // (the layer scale does not apply). A size that is not whole rows
            // keeps its remainder, so check_rows still refuses it.
            constexpr std::size_t dim = Heads::head_dim, stored = row_elements<Side>(Heads::head_dim);
            const std::size_t whole = in.size() / dim;
            std::vector<Side> out(whole * stored + in.size() % dim);
            for (std::size_t r = 0; r < whole; ++r)
                quantise_row([&](int d) { return to_float(in[r * dim + std::size_t(d)]); }, int(dim), out.data() + r * stored);
            (void)scale;
            return out;
        } else {
            std::vector<Side> out(in.size());
            for (std::size_t i = 0; i < in.size(); ++i) out[i] = from_float_scaled<Side>(to_float(in[i]), scale);
            return out;
        }
    }

    /// replan() with the reservation of entry i made by reserve(i) (the paged
    /// cache also records token ids).
    template <class D, class Reserve>
    void replan_reserving(step_plan<D>& p, const std::vector<sequence_id>& batch, const std::vector<int>& new_tokens,
                          typename D::memory::stream_type stream, Reserve&& reserve) {
        Derived& self = derived();
        self.sequences_.require_all(batch);
        require(new_tokens.empty() || new_tokens.size() == batch.size(), error_code::invalid_argument, "new_tokens has ",
                new_tokens.size(), " entries but the batch has ", batch.size(), " sequences (one each, or none)");
        for (std::size_t i = 0; i < batch.size(); ++i) {
            for (std::size_t j = 0; j < i; ++j)
                require(batch[j] != batch[i], error_code::invalid_argument, "sequence ", batch[i],
                        " appears twice in the batch (entries ", j, " and ", i, ")");
            if (!new_tokens.empty())
                require(new_tokens[i] >= 0, error_code::invalid_argument, "new_tokens[", i, "] = ", new_tokens[i],
                        " of sequence ", batch[i], " is negative");
        }
        std::vector<int> old_lengths;
        for (sequence_id id : batch) old_lengths.push_back(self.length(id));
        std::size_t reserved = 0;
        try {
            for (; reserved < batch.size(); ++reserved)
                if (!new_tokens.empty() && new_tokens[reserved] > 0) reserve(reserved);
            std::vector<int> table = self.view_table(batch);
            const std::size_t offsets_at = table.size();
            table.push_back(0);
            for (std::size_t i = 0; i < batch.size(); ++i)
                table.push_back(table.back() + (new_tokens.empty() ? 0 : new_tokens[i]));
            p.assign(&self, batch, std::move(table), offsets_at, stream);
        } catch (...) {
            for (std::size_t i = 0; i < reserved; ++i) self.undo_reservation(batch[i], old_lengths[i]);
            throw;
        }
    }

    /// A plan's reservation of n positions; the paged cache orders its copy
    /// on write on the plan's stream, the other owners copy nothing.
    /// @tparam Stream the memory policy's stream type
    template <class Stream>
    void reserve_for_plan(sequence_id id, int n, Stream) {
        derived().begin_append(id, n);
    }

    /// Gives back positions reserved past old_length by a plan that failed.
    void undo_reservation(sequence_id id, int old_length) { derived().truncate(id, old_length); }

    void check_layer(int layer) const {
        const int layers = derived().layers();
        require(layer >= 0 && layer < layers, error_code::out_of_range, "layer ", layer, " is outside [0, ", layers,
                ")");
    }
    /// Throws unless [first, first + n) lies inside [0, length).
    static void check_range(sequence_id id, int first, int n, int length) {
        require_count(n, "n_tokens");
        require(first >= 0 && first <= length && n <= length - first, error_code::out_of_range, "positions [", first,
                ", ", std::int64_t(first) + n, ") of sequence ", id, " are outside its length ", length);
    }

    /// Throws invalid_argument unless host buffers of keys and values hold n
    /// rows of one layer ([token][kv_head][head_dim]) for an operation on id.
    void check_rows(std::size_t keys, std::size_t values, int n, sequence_id id, int layer, const char* op) const {
        require_count(n, "n_tokens");
        require_elements(keys, n, std::int64_t(key_token_row()), "keys", "tokens x (kv_heads x head_dim)", " (", op,
                         " of sequence ", id, ", layer ", layer, ")");
        require_elements(values, n, std::int64_t(value_token_row()), "values", "tokens x (kv_heads x head_dim)", " (",
                         op, " of sequence ", id, ", layer ", layer, ")");
    }

    /// check_rows on rows not yet quantised (float or 16-bit input to a qint8 or
    /// qint4 cache): head_dim values a row, counted before they shrink to
    /// stored rows, so a buffer with a part row is refused naming its own size.
    /// Nothing to check here for the other types (check_rows counts the same).
    void check_input_rows(std::size_t keys, std::size_t values, int n, sequence_id id, int layer, const char* op) const {
        if constexpr (has_row_quantised_side_v<Element>) {
            require_count(n, "n_tokens");
            const std::int64_t row = std::int64_t(kv_heads()) * Heads::head_dim;
            require_elements(keys, n, row, "keys", "tokens x (kv_heads x head_dim)", " (", op, " of sequence ", id,
                             ", layer ", layer, ")");
            require_elements(values, n, row, "values", "tokens x (kv_heads x head_dim)", " (", op, " of sequence ", id,
                             ", layer ", layer, ")");
        } else {
            (void)keys, (void)values, (void)n, (void)id, (void)layer, (void)op;
        }
    }

    /// Throws out_of_range unless new_length lies in [0, length].
    static void check_truncate(sequence_id id, int new_length, int length) {
        require(new_length >= 0 && new_length <= length, error_code::out_of_range, "truncate of sequence ", id,
                " to ", new_length, " is outside [0, ", length, "]");
    }
    /// Every position of [0, length): what an owner that keeps all rows presents.
    static std::vector<int> all_positions(int length) {
        std::vector<int> out(length);
        for (int i = 0; i < length; ++i) out[i] = i;
        return out;
    }
    /// The slot owners' view table: batch lengths, then batch slots (every
    /// owner's table starts with the lengths; step_plan reads them there).
    std::vector<int> length_slot_table(const std::vector<sequence_id>& batch) const {
        const auto& sequences = derived().sequences_;
        sequences.require_all(batch);
        std::vector<int> table(2 * batch.size());
        for (std::size_t i = 0; i < batch.size(); ++i) {
            table[i] = sequences.at(batch[i]).length;
            table[batch.size() + i] = sequences.at(batch[i]).slot;
        }
        return table;
    }

private:
    /// Derived's header with the per-layer scales a file of an fp8 cache records.
    detail::file_header header_with_scales() const {
        detail::file_header h = derived().header();
        if (has_scaled_side_v<Element>)
            for (int l = 0; l < derived().layers(); ++l) h.scales.push_back(scales(l));
        return h;
    }

    Heads heads_{};
    std::vector<kv_scales> scales_;  ///< [layer] once set_scales was called; empty: all 1
    Derived& derived() { return static_cast<Derived&>(*this); }
    const Derived& derived() const { return static_cast<const Derived&>(*this); }
};

}  // namespace detail
}  // namespace kvcache
