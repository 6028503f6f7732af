// int4 storage in groups of 32 values along the head dimension, each group
// with a half scale and a half minimum: the element type and the row
// quantisation every append path shares.
//
// A stored int4 row is ceil(head_dim / 2) bytes of 4-bit codes (the value at
// even d in the low nibble, odd d in the high one), then one 4-byte group
// record per 32 values (half scale, then half minimum; unaligned, so read and
// written with memcpy). The value at d is minimum + code * scale of its group.
// Groups along the head dimension, not along tokens (KIVI's per-channel keys),
// because a row must stand alone: append, fork, compaction and the page moves
// copy whole rows, and a token-group would make the last page's rows depend on
// rows not yet written. The asymmetric code (a minimum, codes 0..15) keeps the
// 16 levels for the range the group really has; a symmetric code would spend
// half of them on a sign most groups do not need.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/core/half.hpp"

namespace kvcache {

/// One stored byte of an int4 row: two 4-bit codes, the even index's in the
/// low nibble. Values are read through qint4_code and the row's group records
/// (qint4_group_of), never by indexing the row with d.
struct qint4 {
    std::uint8_t bits = 0;  ///< two codes: low nibble first
};
static_assert(sizeof(qint4) == 1 && std::is_trivially_copyable_v<qint4>, "kvcache: qint4 must be exactly one byte");

/// Values per int4 group (the last group of a row may be shorter).
inline constexpr int qint4_group_size = 32;
/// Bytes of one group record: half scale, half minimum.
inline constexpr int qint4_group_bytes = 4;

/// Groups of one int4 row.
KVCACHE_HOST_DEVICE constexpr int qint4_groups(int head_dim) noexcept {
    return (head_dim + qint4_group_size - 1) / qint4_group_size;
}
/// Bytes of an int4 row's codes (before its group records).
KVCACHE_HOST_DEVICE constexpr int qint4_code_bytes(int head_dim) noexcept { return (head_dim + 1) / 2; }
/// Bytes of one stored int4 row: codes, then group records.
KVCACHE_HOST_DEVICE constexpr int qint4_row_bytes(int head_dim) noexcept {
    return qint4_code_bytes(head_dim) + qint4_groups(head_dim) * qint4_group_bytes;
}

/// A group's scale and minimum, widened: the value of code c is minimum + c * scale.
struct qint4_group {
    float scale = 0.0f;    ///< step between codes
    float minimum = 0.0f;  ///< the value of code 0
};

/// The 4-bit code (0..15) of an int4 row at d.
KVCACHE_HOST_DEVICE inline int qint4_code(const qint4* row, int d) noexcept {
    const unsigned byte = row[d >> 1].bits;
    return int((d & 1) ? (byte >> 4) : (byte & 0xFu));
}

/// The scale and minimum of group g of an int4 row of head_dim values.
KVCACHE_HOST_DEVICE inline qint4_group qint4_group_of(const qint4* row, int head_dim, int g) noexcept {
    std::uint16_t raw[2];
    std::memcpy(raw, static_cast<const void*>(row + qint4_code_bytes(head_dim) + g * qint4_group_bytes), sizeof raw);
    return {static_cast<float>(half::from_bits(raw[0])), static_cast<float>(half::from_bits(raw[1]))};
}

/// The value an int4 row holds at d: minimum + code * scale of d's group (in
/// float, one rounding; the reference backend recomputes it in double).
KVCACHE_HOST_DEVICE inline float qint4_value(const qint4* row, int head_dim, int d) noexcept {
    const qint4_group g = qint4_group_of(row, head_dim, d / qint4_group_size);
    return g.minimum + float(qint4_code(row, d)) * g.scale;
}

namespace detail {

KVCACHE_HOST_DEVICE inline std::uint16_t half_step_up(std::uint16_t h) noexcept {
    if ((h & 0x7fffu) == 0) return 0x0001u;          // +-0 -> smallest positive subnormal
    return (h & 0x8000u) ? std::uint16_t(h - 1) : std::uint16_t(h + 1);
}
KVCACHE_HOST_DEVICE inline std::uint16_t half_step_down(std::uint16_t h) noexcept {
    if ((h & 0x7fffu) == 0) return 0x8001u;          // +-0 -> smallest negative subnormal
    return (h & 0x8000u) ? std::uint16_t(h + 1) : std::uint16_t(h - 1);
}
/// The largest half not above x (x finite).
KVCACHE_HOST_DEVICE inline std::uint16_t half_at_or_below(float x) noexcept {
    std::uint16_t h = half(x).bits;
    if (static_cast<float>(half::from_bits(h)) > x) h = half_step_down(h);
    return h;
}
/// The smallest half not below x (x finite, not negative).
KVCACHE_HOST_DEVICE inline std::uint16_t half_at_or_above(float x) noexcept {
    std::uint16_t h = half(x).bits;
    if (static_cast<float>(half::from_bits(h)) < x) h = half_step_up(h);
    return h;
}
KVCACHE_HOST_DEVICE inline bool half_is_finite(std::uint16_t h) noexcept { return (h & 0x7c00u) != 0x7c00u; }
KVCACHE_HOST_DEVICE inline float quiet_nan() noexcept { return bits_to_float(0x7fc00000u); }

}  // namespace detail

/// Quantises one group of an int4 row given its extremes: chooses the half
/// minimum (rounded down from `lowest`) and the half scale (rounded up, so that
/// minimum + 15 * scale reaches `highest`) and writes them to the group's
/// record; returns them widened. A group whose minimum or scale does not fit a
/// half returns a NaN scale (the caller marks the row NaN). Shared by every
/// append path so the stored bytes agree bit for bit.
KVCACHE_HOST_DEVICE inline qint4_group qint4_choose_group(float lowest, float highest) noexcept {
    const std::uint16_t minimum = detail::half_at_or_below(lowest);
    const float low = static_cast<float>(half::from_bits(minimum));
    std::uint16_t scale = detail::half_at_or_above((highest - low) / 15.0f);
    // (highest - low) / 15 rounds in float: step up until 15 steps really cover the range.
    while (detail::half_is_finite(scale) && static_cast<float>(half::from_bits(scale)) * 15.0f < highest - low)
        scale = detail::half_step_up(scale);
    if (!detail::half_is_finite(minimum) || !detail::half_is_finite(scale)) return {detail::quiet_nan(), detail::quiet_nan()};
    return {static_cast<float>(half::from_bits(scale)), low};
}

/// The code of x in a group: (x - minimum) / scale rounded to nearest even and
/// clamped to [0, 15]; 0 when the scale is 0 (every value of the group equals
/// the minimum).
KVCACHE_HOST_DEVICE inline int qint4_code_of(float x, qint4_group g) noexcept {
    if (g.scale == 0.0f) return 0;
    float q = ::rintf((x - g.minimum) / g.scale);
    q = q > 15.0f ? 15.0f : (q < 0.0f ? 0.0f : q);
    return int(q);
}

/// Writes group g's record (scale, minimum) of an int4 row.
KVCACHE_HOST_DEVICE inline void set_qint4_group(qint4* row, int head_dim, int g, qint4_group group) noexcept {
    const std::uint16_t raw[2] = {half(group.scale).bits, half(group.minimum).bits};
    std::memcpy(static_cast<void*>(row + qint4_code_bytes(head_dim) + g * qint4_group_bytes), raw, sizeof raw);
}

/// Quantises one row of head_dim values (already widened to float) into an
/// int4 row: per group of 32, minimum = the group's smallest value rounded down
/// to a half, scale = (largest - minimum) / 15 rounded up to a half, code =
/// (x - minimum) / scale rounded to nearest even and clamped to [0, 15]. Every
/// value of the group is then within scale / 2 of what it reads back as.
/// A row holding any NaN or infinity, or a group whose minimum or scale does not
/// fit a half (|x| near 65504), stores NaN scales and minima in every group, so
/// the whole row reads as NaN, as an int8 row does; it never silently becomes a
/// finite number.
/// @tparam Widen callable int -> float giving the row's value at d
template <class Widen>
KVCACHE_HOST_DEVICE inline void quantise_row(Widen widen, int head_dim, qint4* out) noexcept {
    const int groups = qint4_groups(head_dim);
    bool finite = true;
    for (int d = 0; d < head_dim; ++d)
        if (!(fabsf(widen(d)) <= 3.402823466e38f)) finite = false;  // NaN and infinities both fail
    for (int g = 0; finite && g < groups; ++g) {
        const int begin = g * qint4_group_size, end = begin + qint4_group_size < head_dim ? begin + qint4_group_size : head_dim;
        float lowest = widen(begin), highest = lowest;
        for (int d = begin + 1; d < end; ++d) {
            const float x = widen(d);
            lowest = x < lowest ? x : lowest;
            highest = x > highest ? x : highest;
        }
        const qint4_group group = qint4_choose_group(lowest, highest);
        if (group.scale != group.scale) {
            finite = false;
            break;
        }
        set_qint4_group(out, head_dim, g, group);
        for (int d = begin; d < end; d += 2) {
            const int low = qint4_code_of(widen(d), group);
            const int high = d + 1 < end ? qint4_code_of(widen(d + 1), group) : 0;
            out[d >> 1].bits = std::uint8_t(low | (high << 4));
        }
    }
    if (finite) return;
    for (int i = 0; i < qint4_code_bytes(head_dim); ++i) out[i].bits = 0;
    for (int g = 0; g < groups; ++g) set_qint4_group(out, head_dim, g, {detail::quiet_nan(), detail::quiet_nan()});
}

}  // namespace kvcache
