// Inner loops of the CPU backend, written so g++ -O3 vectorises them without
// -ffast-math: dot products keep 8 independent partial sums (a float
// reduction is otherwise never reordered), and half rows are widened in
// blocks with a branch-free conversion instead of per element in the loop.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvcache/core/half.hpp"

namespace kvcache {
namespace cpu {
namespace detail {

/// Dot product of two float rows; n is a multiple of 8.
inline float dot(const float* a, const float* b, int n) noexcept {
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int d = 0; d < n; d += 8)
        for (int j = 0; j < 8; ++j) lanes[j] += a[d + j] * b[d + j];
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

/// y += a * x over n floats.
inline void axpy(float a, const float* x, float* y, int n) noexcept {
    for (int d = 0; d < n; ++d) y[d] += a * x[d];
}

/// y *= a over n floats.
inline void scale(float a, float* y, int n) noexcept {
    for (int d = 0; d < n; ++d) y[d] *= a;
}

/// Exact binary16 -> float for n values, branch-free so it vectorises: the
/// exponent/mantissa bits shifted into a float and multiplied by 2^112 rebias
/// normals and subnormals alike; infinities and NaN are patched in by a mask
/// (a select or branch here stops g++ from vectorising the loop).
inline void widen(const half* __restrict source, float* __restrict destination, int n) noexcept {
    for (int i = 0; i < n; ++i) {
        const std::uint32_t h = source[i].bits;
        const std::uint32_t sign = (h & 0x8000u) << 16;
        const std::uint32_t magnitude = h & 0x7fffu;
        const std::uint32_t shifted_bits = magnitude << 13;
        float shifted;
        std::memcpy(&shifted, &shifted_bits, 4);
        const float rebiased = shifted * 0x1p112f;
        std::uint32_t bits;
        std::memcpy(&bits, &rebiased, 4);
        const std::uint32_t special = 0u - std::uint32_t(magnitude >= 0x7c00u);  // all ones for inf / NaN
        bits = ((shifted_bits | 0x7f800000u) & special) | (bits & ~special);
        bits |= sign;
        std::memcpy(destination + i, &bits, 4);
    }
}

/// Copies n floats (the float "widening", so callers are generic).
inline void widen(const float* source, float* destination, int n) noexcept {
    std::memcpy(destination, source, sizeof(float) * static_cast<std::size_t>(n));
}

}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
