// Storage shared by the slot-based owners (contiguous and sliding window):
// per layer, a key and a value slab of [slot][kv_head][row][head_dim].
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvcache/cache/row_transfer.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/core/memory.hpp"

namespace kvcache {
namespace detail {

/// Key and value slabs of every layer for a fixed number of slots and rows.
/// @tparam Element stored element type
/// @tparam Heads a head_config
/// @tparam Memory memory-space policy
template <class Element, class Heads, class Memory>
class slot_store {
    using buffer = typename Memory::template buffer<Element>;

public:
    slot_store() = default;

    /// Allocates zeroed storage for kv_heads heads; throws out_of_memory (nothing allocated stays).
    slot_store(int layers, int slots, int rows, int kv_heads)
        : layers_(layers), slots_(slots), rows_(rows), kv_heads_(kv_heads) {
        const std::size_t elements = checked_bytes(checked_bytes(std::size_t(slots), std::size_t(rows)),
                                                   std::size_t(kv_heads) * row_elements<Element>(Heads::head_dim));
        keys_.reserve(layers);
        values_.reserve(layers);
        for (int l = 0; l < layers; ++l) {
            keys_.emplace_back(elements);
            values_.emplace_back(elements);
        }
    }

    int layers() const noexcept { return layers_; }
    int slots() const noexcept { return slots_; }
    int rows() const noexcept { return rows_; }
    std::int64_t head_stride() const noexcept { return std::int64_t(rows_) * row_elements<Element>(Heads::head_dim); }
    std::int64_t slot_stride() const noexcept { return kv_heads_ * head_stride(); }
    Element* keys(int layer) noexcept { return keys_[layer].data(); }
    Element* values(int layer) noexcept { return values_[layer].data(); }
    const Element* keys(int layer) const noexcept { return keys_[layer].data(); }
    const Element* values(int layer) const noexcept { return values_[layer].data(); }

    /// Bytes of every slab.
    std::size_t bytes() const noexcept {
        return std::size_t(layers_) * 2 * slots_ * std::size_t(slot_stride()) * sizeof(Element);
    }

    /// Writes n rows starting at row of slot, from host [token][kv_head][head_dim].
    void write(int layer, int slot, int row, const Element* keys, const Element* values, int n) {
        const std::int64_t at = slot * slot_stride() + std::int64_t(row) * row_elements<Element>(Heads::head_dim);
        scatter_rows<Element, Heads, Memory>(keys_[layer].data() + at, head_stride(), keys, n, kv_heads_);
        scatter_rows<Element, Heads, Memory>(values_[layer].data() + at, head_stride(), values, n, kv_heads_);
    }

    /// Reads n rows starting at row of slot into host [token][kv_head][head_dim].
    void read(int layer, int slot, int row, int n, Element* keys, Element* values) const {
        const std::int64_t at = slot * slot_stride() + std::int64_t(row) * row_elements<Element>(Heads::head_dim);
        gather_rows<Element, Heads, Memory>(keys, keys_[layer].data() + at, head_stride(), n, kv_heads_);
        gather_rows<Element, Heads, Memory>(values, values_[layer].data() + at, head_stride(), n, kv_heads_);
    }

    /// Moves, in every KV head of one layer and slot, the rows at ascending
    /// storage rows kept[j] down to row j (kept[j] >= j), front to back in
    /// pieces that do not overlap their source, so no row is overwritten
    /// before it moved. Returns the rows moved (every KV head counted once).
    std::uint64_t compact_rows(int layer, int slot, const std::vector<int>& kept) {
        const std::int64_t dim = row_elements<Element>(Heads::head_dim);
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
            const std::size_t bytes = std::size_t(count) * std::size_t(dim) * sizeof(Element);
            for (int h = 0; h < kv_heads_; ++h) {
                const std::int64_t base = slot * slot_stride() + h * head_stride();
                Memory::copy_within(keys_[layer].data() + base + j * dim, keys_[layer].data() + base + from * dim, bytes);
                Memory::copy_within(values_[layer].data() + base + j * dim, values_[layer].data() + base + from * dim, bytes);
            }
            moved += std::uint64_t(count);
            j += count;
        }
        return moved;
    }

    /// Copies the first `rows` rows of every head and layer from slot `from` of
    /// `source` (which may be this store, or one with other shapes) into slot `to`.
    void copy_slot(const slot_store& source, int from, int to, int rows) {
        if (rows <= 0) return;
        const std::size_t bytes = std::size_t(rows) * row_elements<Element>(Heads::head_dim) * sizeof(Element);
        for (int l = 0; l < layers_; ++l)
            for (int h = 0; h < kv_heads_; ++h) {
                const std::int64_t src = from * source.slot_stride() + h * source.head_stride();
                const std::int64_t dst = to * slot_stride() + h * head_stride();
                Memory::copy_within(keys_[l].data() + dst, source.keys_[l].data() + src, bytes);
                Memory::copy_within(values_[l].data() + dst, source.values_[l].data() + src, bytes);
            }
    }

private:
    int layers_ = 0, slots_ = 0, rows_ = 0, kv_heads_ = 0;
    std::vector<buffer> keys_, values_;
};

}  // namespace detail
}  // namespace kvcache
