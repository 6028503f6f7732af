// Eight elements of a row at a time through the context's vector accesses:
// one load16 of 8 16-bit elements, two of 4 floats, or one load8 of 8 fp8
// elements. Rows start at multiples of head_dim (a multiple of 8) elements, so
// these addresses are 16-byte aligned (8-byte for fp8) whenever the row's base
// pointer is. fp8 is widened and narrowed unscaled: the bodies apply a layer's
// scales where they cost one multiply per row or per output, not per element.
// int8 (qint8) rows are head_dim + 4 bytes apart (the row's scale follows its
// values), so they are only 4-byte aligned: they are read a byte at a time and
// widened unscaled too; the bodies apply each row's scale once per row.
#pragma once

#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
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

/// Reads 8 elements from p (16-byte aligned; 8-byte for fp8; any address for
/// qint8) widened to float; qint8 gives the plain integers (the row's scale is
/// applied by the caller).
/// @tparam Element float, kvcache::half, kvcache::bfloat16, an fp8 type or kvcache::qint8
/// @tparam Context an execution context
template <class Element, class Context>
KVCACHE_HOST_DEVICE inline void load8(Context& ctx, const Element* p, float (&out)[8]) {
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
    static_assert(!has_row_scale_v<Element>, "kvcache: qint8 rows are written whole, with their scale");
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

/// Bytes rounded up to a multiple of 16, so every shared-memory region starts aligned.
KVCACHE_HOST_DEVICE constexpr unsigned long long align16(unsigned long long bytes) noexcept {
    return (bytes + 15ull) / 16ull * 16ull;
}

}  // namespace detail
}  // namespace kvcache
