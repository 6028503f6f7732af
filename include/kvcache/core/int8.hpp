// int8 storage with one float scale per row: the element type and the row
// quantisation every append path shares.
//
// A stored int8 row is head_dim signed bytes followed by the row's float scale
// (4 bytes, possibly unaligned, so read and written with memcpy). Keeping the
// scale inside the row means paging, copy-on-write, forks, the prefix cache,
// save/load and the sliding window copy it with the row and need nothing new.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvcache/core/config.hpp"

namespace kvcache {

/// One stored int8 value of a row quantised with a per-row scale: the value
/// at d means float(bits) * the row's scale (row_scale_of). Range [-127, 127]
/// (-128 is never written, so the range is symmetric).
struct qint8 {
    std::int8_t bits = 0;  ///< the quantised value
};
static_assert(sizeof(qint8) == 1 && std::is_trivially_copyable_v<qint8>, "kvcache: qint8 must be exactly one byte");

/// Bytes of the scale stored after an int8 row's values.
inline constexpr int qint8_scale_bytes = static_cast<int>(sizeof(float));

/// Writes a qint8 row's scale after its head_dim values.
KVCACHE_HOST_DEVICE inline void set_row_scale(qint8* row, int head_dim, float scale) noexcept {
    std::memcpy(static_cast<void*>(row + head_dim), &scale, sizeof scale);
}

/// Quantises one row of head_dim values (already widened to float) into a
/// qint8 row: scale = max|x| / 127, q = x / scale rounded to nearest even and
/// clamped to [-127, 127]. An all-zero row stores scale 0 (reads back zeros), and
/// so does a row so small that max|x| / 127 underflows to 0.
/// A row holding any NaN or infinity stores scale NaN and zero values, so the
/// whole row reads as NaN and attention propagates it as a 16-bit cache would;
/// it never silently becomes a finite number.
/// @tparam Widen callable int -> float giving the row's value at d
template <class Widen>
KVCACHE_HOST_DEVICE inline void quantise_row(Widen widen, int head_dim, qint8* out) noexcept {
    float largest = 0.0f;
    bool finite = true;
    for (int d = 0; d < head_dim; ++d) {
        const float x = widen(d);
        if (!(fabsf(x) <= 3.402823466e38f)) finite = false;  // NaN and infinities both fail
        else if (fabsf(x) > largest) largest = fabsf(x);
    }
    if (!finite || largest == 0.0f) {
        for (int d = 0; d < head_dim; ++d) out[d].bits = 0;
        const std::uint32_t quiet_nan = 0x7fc00000u;
        float scale = 0.0f;
        if (!finite) std::memcpy(&scale, &quiet_nan, sizeof scale);
        set_row_scale(out, head_dim, scale);
        return;
    }
    const float scale = largest / 127.0f;
    if (scale == 0.0f) {  // largest below 127 * the smallest subnormal: the row reads as zeros
        for (int d = 0; d < head_dim; ++d) out[d].bits = 0;
        set_row_scale(out, head_dim, 0.0f);
        return;
    }
    for (int d = 0; d < head_dim; ++d) {
        // rintf rounds to nearest even under the default rounding mode (host and device).
        float q = ::rintf(widen(d) / scale);
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        out[d].bits = static_cast<std::int8_t>(q);
    }
    set_row_scale(out, head_dim, scale);
}

}  // namespace kvcache
