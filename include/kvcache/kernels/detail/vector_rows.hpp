// Eight elements of a row at a time through the context's vector accesses:
// one load16 of 8 16-bit elements, two of 4 floats, or one load8 of 8 fp8
// elements. Rows start at multiples of head_dim (a multiple of 8) elements, so
// these addresses are 16-byte aligned (8-byte for fp8) whenever the row's base
// pointer is. fp8 is widened and narrowed unscaled: the bodies apply a layer's
// scales where they cost one multiply per row or per output, not per element.
// int8 (qint8) rows are head_dim + 4 bytes apart (the row's scale follows its
// values), so they are only 4-byte aligned: they are read a byte at a time and
// widened unscaled too; the bodies apply each row's scale once per row.
// int4 (qint4) rows pack two codes a byte and end with a record per group of 32
// values: load_row8 reads a piece with its group's record and dequantises it;
// a row that reads NaN loads as zeros and row_factor carries the NaN instead
// (see row_factor for why).
#pragma once

#include <cmath>
#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/int4.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/execution/vector16.hpp"

/// Asks nvcc's device pass to unroll the next loop (constant trip counts keep
/// per-thread accumulator arrays in registers); nothing elsewhere.
#if defined(__CUDA_ARCH__)
#define KVCACHE_UNROLL _Pragma("unroll")
#else
#define KVCACHE_UNROLL
#endif

namespace kvcache {
namespace detail {

/// True for a stored element whose rows carry their own scale after the
/// values (qint8): the bodies read the scale with the row and apply it.
/// @tparam Element a stored element type (possibly const)
template <class Element>
inline constexpr bool has_row_scale_v = std::is_same_v<std::remove_cv_t<Element>, qint8>;

/// True for int4 (qint4) rows: packed codes, read through load_row8 only.
/// @tparam Element a stored element type (possibly const)
template <class Element>
inline constexpr bool is_qint4_v = std::is_same_v<std::remove_cv_t<Element>, qint4>;

/// Reads 8 elements from p (16-byte aligned; 8-byte for fp8; any address for
/// qint8) widened to float; qint8 gives the plain integers (the row's scale is
/// applied by the caller).
/// @tparam Element float, kvcache::half, kvcache::bfloat16, an fp8 type or kvcache::qint8
/// @tparam Context an execution context
template <class Element, class Context>
KVCACHE_HOST_DEVICE inline void load8(Context& ctx, const Element* p, float (&out)[8]) {
    static_assert(!is_qint4_v<Element>, "kvcache: qint4 rows are read with load_row8 (codes and group records)");
    if constexpr (has_row_scale_v<Element>) {
        (void)ctx;
        for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(p[i].bits);
    } else if constexpr (sizeof(Element) == 1) {
        const vector8 v = ctx.load8(p);
        for (int i = 0; i < 8; ++i) out[i] = to_float(Element::from_bits(vector8_byte(v, i)));
    } else if constexpr (sizeof(Element) == 2) {
        const vector16 v = ctx.load16(p);
        for (int i = 0; i < 8; ++i) out[i] = to_float(vector16_get<Element>(v, i));
    } else {
        const vector16 low = ctx.load16(p);
        const vector16 high = ctx.load16(p + 4);
        for (int i = 0; i < 4; ++i) {
            out[i] = vector16_float(low, i);
            out[4 + i] = vector16_float(high, i);
        }
    }
}

/// Writes 8 floats to p (16-byte aligned; 8-byte for fp8), narrowed to Element
/// (fp8: rounded to nearest even, saturating). Not for qint8, whose rows are
/// quantised whole (append_kernel).
/// @tparam Element float, kvcache::half, kvcache::bfloat16 or an fp8 type
/// @tparam Context an execution context
template <class Element, class Context>
KVCACHE_HOST_DEVICE inline void store8(Context& ctx, Element* p, const float (&in)[8]) {
    static_assert(!has_row_scale_v<Element> && !is_qint4_v<Element>,
                  "kvcache: qint8 and qint4 rows are written whole, with their scales");
    if constexpr (sizeof(Element) == 1) {
        vector8 v{};
        for (int i = 0; i < 8; ++i) set_byte(v, i, from_float<Element>(in[i]).bits);
        ctx.store8(p, v);
    } else if constexpr (sizeof(Element) == 2) {
        vector16 v{};
        for (int i = 0; i < 8; ++i) vector16_set(v, i, from_float<Element>(in[i]));
        ctx.store16(p, v);
    } else {
        vector16 low{}, high{};
        for (int i = 0; i < 4; ++i) {
            set_float(low, i, in[i]);
            set_float(high, i, in[4 + i]);
        }
        ctx.store16(p, low);
        ctx.store16(p + 4, high);
    }
}

/// Reads the 8 values [c, c + 8) of a stored row of Dim values (c a multiple
/// of 8) as load8 does; a qint4 row's piece is its 4 code bytes, dequantised
/// with the record of its group (a piece never straddles two: 32 is a multiple
/// of 8) as fmaf(code, scale, minimum), one rounding on every target. A qint4
/// piece whose group is NaN (the whole row then is) loads as zeros: the value
/// is the load times row_factor, which is NaN for that row.
/// @tparam Dim the head dimension (values per row)
/// @tparam Element float, kvcache::half, kvcache::bfloat16, an fp8 type, kvcache::qint8 or kvcache::qint4
/// @tparam Context an execution context
template <int Dim, class Element, class Context>
KVCACHE_HOST_DEVICE inline void load_row8(Context& ctx, const Element* row, int c, float (&out)[8]) {
    if constexpr (is_qint4_v<Element>) {
        (void)ctx;
        const qint4_group g = qint4_group_of(row, Dim, c / qint4_group_size);
        const bool nan = g.scale != g.scale;
        for (int i = 0; i < 4; ++i) {
            const unsigned byte = row[c / 2 + i].bits;
            out[2 * i] = nan ? 0.0f : ::fmaf(float(byte & 0xFu), g.scale, g.minimum);
            out[2 * i + 1] = nan ? 0.0f : ::fmaf(float(byte >> 4), g.scale, g.minimum);
        }
    } else {
        load8(ctx, row + c, out);
    }
}

/// What every value load_row8 gives of a row is multiplied by: a qint8 row's
/// scale; for a qint4 row 1, or NaN when the row reads NaN (its group 0 is NaN
/// exactly then: quantise_row marks every group); 1 for the other types. The
/// attention tile applies it to a key's logit and a value's softmax weight,
/// never to the values in shared memory: a weight of 0 (a key a query row does
/// not see) must leave that row finite, and 0 times a NaN value would not.
/// @tparam Dim the head dimension (values per row)
/// @tparam Element a stored element type
template <int Dim, class Element>
KVCACHE_HOST_DEVICE inline float row_factor(const Element* row) {
    if constexpr (is_qint4_v<Element>) {
        const float scale = qint4_group_of(row, Dim, 0).scale;
        return scale != scale ? scale : 1.0f;
    } else {
        return row_scale_of(row, Dim);
    }
}

/// Bytes rounded up to a multiple of 16, so every shared-memory region starts aligned.
KVCACHE_HOST_DEVICE constexpr unsigned long long align16(unsigned long long bytes) noexcept {
    return (bytes + 15ull) / 16ull * 16ull;
}

}  // namespace detail
}  // namespace kvcache
