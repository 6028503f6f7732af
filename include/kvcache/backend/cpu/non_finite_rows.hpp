// Value rows that hold a NaN or an infinity, found in the tiles that some
// query row sees only in part. The kernels fold a tile's values into every
// row of a block at once, a key the row does not see with weight 0; but 0 x
// NaN is NaN, so such a row would turn NaN from a value it never attends to
// (a later token of the same prefill chunk, a key past a window's edge),
// where the reference keeps it finite. Tiles every row sees whole need none
// of this, so the scan costs nothing on the walk's other tiles.
#pragma once

#include <cmath>
#include <cstdint>

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/key_tiles.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/stored_row.hpp"

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// The mask of a row that sees all `count` keys of a tile.
constexpr std::uint32_t full_tile_mask(int count) noexcept {
    return count >= 32 ? ~0u : (1u << count) - 1u;
}

/// Bit t set where value row t (t < tile.count) reads as a NaN or an
/// infinity somewhere, as attention reads it (an int8 row through its NaN
/// scale, an int4 row through its NaN group records).
/// @tparam Dim head dimension
/// @tparam Key the tile's key type (not read)
/// @tparam Value the stored element type of its value rows
template <int Dim, class Key, class Value>
std::uint32_t non_finite_values(const key_tile<Key, Value>& tile) noexcept {
    std::uint32_t found = 0;
    float row[Dim];
    for (int t = 0; t < tile.count; ++t) {
        widen_row(tile.values[t], Dim, 1.0f, row);
        bool finite = true;
        for (int d = 0; d < Dim && finite; ++d) finite = std::isfinite(row[d]);
        if (!finite) found |= 1u << t;
    }
    return found;
}

/// A stored row of zeros for head dimension Dim: an int8 row's scale and an
/// int4 row's group records are zero too, so it reads as zeros in every type.
/// @tparam Dim head dimension
/// @tparam Element the stored element type
template <int Dim, class Element>
const Element* zero_row() noexcept {
    static const Element zeros[row_elements<Element>(Dim)] = {};
    return zeros;
}

/// The tile with the value rows of `keys` (bit t: key t) replaced by zero_row.
/// @tparam Dim head dimension
/// @tparam Key the tile's key type
/// @tparam Value the stored element type of its value rows
template <int Dim, class Key, class Value>
key_tile<Key, Value> with_zero_values(key_tile<Key, Value> tile, std::uint32_t keys) noexcept {
    for (int t = 0; t < tile.count; ++t)
        if ((keys >> t) & 1u) tile.values[t] = zero_row<Dim, Value>();
    return tile;
}

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
