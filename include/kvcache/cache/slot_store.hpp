// Storage shared by the slot-based owners (contiguous and sliding window):
// per layer, a key and a value slab of [slot][kv_head][row][head_dim].
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvcache/cache/row_transfer.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/core/memory.hpp"

namespace kvcache {
namespace detail {

/// Key and value slabs of every layer for a fixed number of slots and rows.
/// A kv_elements pair's key and value slabs hold rows of their own types;
/// every operation runs the same code on each side.
/// @tparam Element stored element type, or a kv_elements pair
/// @tparam Heads a head_config
/// @tparam Memory memory-space policy
template <class Element, class Heads, class Memory>
class slot_store {
public:
    using key_type = key_element_t<Element>;      ///< what key slabs hold
    using value_type = value_element_t<Element>;  ///< what value slabs hold

    slot_store() = default;

    /// Allocates zeroed storage for kv_heads heads; throws out_of_memory (nothing allocated stays).
    slot_store(int layers, int slots, int rows, int kv_heads)
        : layers_(layers), slots_(slots), rows_(rows), kv_heads_(kv_heads) {
        allocate(keys_);
        allocate(values_);
    }

    int layers() const noexcept { return layers_; }
    int slots() const noexcept { return slots_; }
    int rows() const noexcept { return rows_; }
    /// Key elements between KV heads of a slot (value_head_stride for values).
    std::int64_t head_stride() const noexcept { return head_stride_of<key_type>(); }
    /// Key elements between slots (value_slot_stride for values).
    std::int64_t slot_stride() const noexcept { return slot_stride_of<key_type>(); }
    /// Value elements between KV heads of a slot.
    std::int64_t value_head_stride() const noexcept { return head_stride_of<value_type>(); }
    /// Value elements between slots.
    std::int64_t value_slot_stride() const noexcept { return slot_stride_of<value_type>(); }
    key_type* keys(int layer) noexcept { return keys_[layer].data(); }
    value_type* values(int layer) noexcept { return values_[layer].data(); }
    const key_type* keys(int layer) const noexcept { return keys_[layer].data(); }
    const value_type* values(int layer) const noexcept { return values_[layer].data(); }

    /// Bytes of every slab.
    std::size_t bytes() const noexcept {
        return std::size_t(layers_) * slots_ *
               (std::size_t(slot_stride()) * sizeof(key_type) + std::size_t(value_slot_stride()) * sizeof(value_type));
    }

    /// Writes n rows starting at row of slot, from host [token][kv_head][head_dim].
    void write(int layer, int slot, int row, const key_type* keys, const value_type* values, int n) {
        write_side(keys_[layer].data(), slot, row, keys, n);
        write_side(values_[layer].data(), slot, row, values, n);
    }

    /// Reads n rows starting at row of slot into host [token][kv_head][head_dim].
    void read(int layer, int slot, int row, int n, key_type* keys, value_type* values) const {
        read_side(keys_[layer].data(), slot, row, n, keys);
        read_side(values_[layer].data(), slot, row, n, values);
    }

    /// Moves, in every KV head of one layer and slot, the rows at ascending
    /// storage rows kept[j] down to row j (kept[j] >= j), front to back in
    /// pieces that do not overlap their source, so no row is overwritten
    /// before it moved. Returns the rows moved (every KV head counted once).
    std::uint64_t compact_rows(int layer, int slot, const std::vector<int>& kept) {
        std::uint64_t moved = 0;
        for (int j = 0; j < static_cast<int>(kept.size());) {
            const int from = kept[std::size_t(j)];
            if (from == j) {
                ++j;
                continue;
            }
            int count = 1;
            while (count < from - j && j + count < static_cast<int>(kept.size()) && kept[std::size_t(j + count)] == from + count)
                ++count;
            move_rows(keys_[layer].data(), slot, from, j, count);
            move_rows(values_[layer].data(), slot, from, j, count);
            moved += std::uint64_t(count);
            j += count;
        }
        return moved;
    }

    /// Copies the first `rows` rows of every head and layer from slot `from` of
    /// `source` (which may be this store, or one with other shapes) into slot `to`.
    void copy_slot(const slot_store& source, int from, int to, int rows) {
        if (rows <= 0) return;
        for (int l = 0; l < layers_; ++l) {
            copy_slot_side(keys_[l].data(), source, source.keys_[l].data(), from, to, rows);
            copy_slot_side(values_[l].data(), source, source.values_[l].data(), from, to, rows);
        }
    }

private:
    template <class Side>
    using buffers = std::vector<typename Memory::template buffer<Side>>;
    template <class Side>
    static constexpr std::int64_t row_of = row_elements<Side>(Heads::head_dim);

    template <class Side>
    std::int64_t head_stride_of() const noexcept { return std::int64_t(rows_) * row_of<Side>; }
    template <class Side>
    std::int64_t slot_stride_of() const noexcept { return kv_heads_ * head_stride_of<Side>(); }

    template <class Side>
    void allocate(buffers<Side>& slabs) {
        const std::size_t elements = checked_bytes(checked_bytes(std::size_t(slots_), std::size_t(rows_)),
                                                   std::size_t(kv_heads_) * std::size_t(row_of<Side>));
        slabs.reserve(std::size_t(layers_));
        for (int l = 0; l < layers_; ++l) slabs.emplace_back(elements);
    }
    template <class Side>
    void write_side(Side* slab, int slot, int row, const Side* rows, int n) {
        const std::int64_t at = slot * slot_stride_of<Side>() + std::int64_t(row) * row_of<Side>;
        scatter_rows<Side, Heads, Memory>(slab + at, head_stride_of<Side>(), rows, n, kv_heads_);
    }
    template <class Side>
    void read_side(const Side* slab, int slot, int row, int n, Side* rows) const {
        const std::int64_t at = slot * slot_stride_of<Side>() + std::int64_t(row) * row_of<Side>;
        gather_rows<Side, Heads, Memory>(rows, slab + at, head_stride_of<Side>(), n, kv_heads_);
    }
    template <class Side>
    void move_rows(Side* slab, int slot, int from, int to, int count) {
        const std::size_t bytes = std::size_t(count) * std::size_t(row_of<Side>) * sizeof(Side);
        for (int h = 0; h < kv_heads_; ++h) {
            const std::int64_t base = slot * slot_stride_of<Side>() + h * head_stride_of<Side>();
            Memory::copy_within(slab + base + to * row_of<Side>, slab + base + from * row_of<Side>, bytes);
        }
    }
    template <class Side>
    void copy_slot_side(Side* slab, const slot_store& source, const Side* from_slab, int from, int to, int rows) {
        const std::size_t bytes = std::size_t(rows) * std::size_t(row_of<Side>) * sizeof(Side);
        for (int h = 0; h < kv_heads_; ++h) {
            const std::int64_t src = from * source.template slot_stride_of<Side>() + h * source.template head_stride_of<Side>();
            const std::int64_t dst = to * slot_stride_of<Side>() + h * head_stride_of<Side>();
            Memory::copy_within(slab + dst, from_slab + src, bytes);
        }
    }

    int layers_ = 0, slots_ = 0, rows_ = 0, kv_heads_ = 0;
    buffers<key_type> keys_;
    buffers<value_type> values_;
};

}  // namespace detail
}  // namespace kvcache
