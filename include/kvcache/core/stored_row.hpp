// What one stored K or V row is, for every element type: its size in
// elements, the scale an int8 row carries, and which types quantise a whole row
// at once (int8, int4) instead of converting value by value.
#pragma once

#include <cstring>
#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/core/int4.hpp"
#include "kvcache/core/int8.hpp"

namespace kvcache {

/// True for the element types whose rows are quantised whole, with their own
/// scales stored inside the row (qint8, qint4): written by quantise_row, never
/// value by value.
/// @tparam Element a stored element type
template <class Element>
inline constexpr bool is_row_quantised_v =
    std::is_same_v<std::remove_cv_t<Element>, qint8> || std::is_same_v<std::remove_cv_t<Element>, qint4>;

/// Elements one stored row occupies: head_dim for the float types; qint8 rows
/// carry their float scale after the values (head_dim + 4); qint4 rows are
/// packed codes then a record per group of 32 (qint4_row_bytes).
/// @tparam Element the stored element type
template <class Element>
KVCACHE_HOST_DEVICE constexpr int row_elements(int head_dim) noexcept {
    if constexpr (std::is_same_v<std::remove_cv_t<Element>, qint8>) return head_dim + qint8_scale_bytes;
    else if constexpr (std::is_same_v<std::remove_cv_t<Element>, qint4>) return qint4_row_bytes(head_dim);
    else return head_dim;
}

/// The scale stored with a row: the float after a qint8 row's head_dim values,
/// 1 for every other type (fp8's scales are per layer, kv_scales; qint4's are
/// per group, qint4_group_of).
/// @tparam Element the stored element type
template <class Element>
KVCACHE_HOST_DEVICE inline float row_scale_of(const Element* row, int head_dim) noexcept {
    if constexpr (std::is_same_v<Element, qint8>) {
        float scale;
        std::memcpy(&scale, static_cast<const void*>(row + head_dim), sizeof scale);  // the row need not be 4-aligned
        return scale;
    } else {
        (void)row;
        (void)head_dim;
        return 1.0f;
    }
}

}  // namespace kvcache
