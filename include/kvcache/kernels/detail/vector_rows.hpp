// Eight elements of a row at a time through the context's 16-byte accesses:
// one load16 of 8 16-bit elements, or two of 4 floats. Rows start at multiples of
// head_dim (a multiple of 8) elements, so these addresses are 16-byte aligned
// whenever the row's base pointer is.
#pragma once

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
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

/// Reads 8 elements from p (16-byte aligned) widened to float.
/// @tparam Element float, kvcache::half or kvcache::bfloat16
/// @tparam Context an execution context
template <class Element, class Context>
KVCACHE_HOST_DEVICE inline void load8(Context& ctx, const Element* p, float (&out)[8]) {
    if constexpr (sizeof(Element) == 2) {
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

/// Writes 8 floats to p (16-byte aligned), narrowed to Element.
/// @tparam Element float, kvcache::half or kvcache::bfloat16
/// @tparam Context an execution context
template <class Element, class Context>
KVCACHE_HOST_DEVICE inline void store8(Context& ctx, Element* p, const float (&in)[8]) {
    if constexpr (sizeof(Element) == 2) {
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
