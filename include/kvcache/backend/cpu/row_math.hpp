// Inner loops of the CPU backend, written so g++ -O3 vectorises them without
// -ffast-math: dot products keep 8 independent partial sums (a float
// reduction is otherwise never reordered), and half rows are widened in
// blocks with a branch-free conversion instead of per element in the loop.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvcache/core/bfloat16.hpp"
#include "kvcache/core/float8.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/core/stored_row.hpp"

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
/// The bits of (magnitude << shift), read as a float, times factor: the
/// rebiasing step every narrow float format's widening shares.
inline std::uint32_t shifted_and_rebiased(std::uint32_t magnitude, int shift, float factor) noexcept {
    const std::uint32_t shifted_bits = magnitude << shift;
    float shifted;
    std::memcpy(&shifted, &shifted_bits, 4);
    const float rebiased = shifted * factor;
    std::uint32_t bits;
    std::memcpy(&bits, &rebiased, 4);
    return bits;
}

inline void widen(const half* __restrict source, float* __restrict destination, int n) noexcept {
    for (int i = 0; i < n; ++i) {
        const std::uint32_t h = source[i].bits;
        const std::uint32_t sign = (h & 0x8000u) << 16;
        const std::uint32_t magnitude = h & 0x7fffu;
        std::uint32_t bits = shifted_and_rebiased(magnitude, 13, 0x1p112f);
        const std::uint32_t special = 0u - std::uint32_t(magnitude >= 0x7c00u);  // all ones for inf / NaN
        bits = (((magnitude << 13) | 0x7f800000u) & special) | (bits & ~special);
        bits |= sign;
        std::memcpy(destination + i, &bits, 4);
    }
}

/// Exact bfloat16 -> float for n values: the bits shifted into a float's top half.
inline void widen(const bfloat16* __restrict source, float* __restrict destination, int n) noexcept {
    for (int i = 0; i < n; ++i) {
        const std::uint32_t bits = std::uint32_t(source[i].bits) << 16;
        std::memcpy(destination + i, &bits, 4);
    }
}

/// Exact fp8 e4m3 -> float for n values, as half is widened above: the
/// magnitude bits shifted into a float and multiplied by 2^120 rebias normals
/// and subnormals alike; the lone NaN (S.1111.111) is patched in by a mask.
inline void widen(const float8_e4m3* __restrict source, float* __restrict destination, int n) noexcept {
    for (int i = 0; i < n; ++i) {
        const std::uint32_t b = source[i].bits;
        const std::uint32_t magnitude = b & 0x7fu;
        std::uint32_t bits = shifted_and_rebiased(magnitude, 20, 0x1p120f);
        const std::uint32_t special = 0u - std::uint32_t(magnitude == 0x7fu);  // all ones for NaN
        bits = (0x7fc00000u & special) | (bits & ~special);
        bits |= (b & 0x80u) << 24;
        std::memcpy(destination + i, &bits, 4);
    }
}

/// Exact fp8 e5m2 -> float for n values: the same with 2^112 (e5m2 has half's
/// exponent), infinities and NaN patched in by a mask (NaN quiet, as F16C gives it).
inline void widen(const float8_e5m2* __restrict source, float* __restrict destination, int n) noexcept {
    for (int i = 0; i < n; ++i) {
        const std::uint32_t b = source[i].bits;
        const std::uint32_t magnitude = b & 0x7fu;
        std::uint32_t bits = shifted_and_rebiased(magnitude, 21, 0x1p112f);
        const std::uint32_t special = 0u - std::uint32_t(magnitude >= 0x7cu);  // all ones for inf / NaN
        const std::uint32_t quiet = std::uint32_t((magnitude & 0x3u) != 0) << 22;  // NaN comes out quiet, payload kept
        bits = (((magnitude << 21) | 0x7f800000u | quiet) & special) | (bits & ~special);
        bits |= (b & 0x80u) << 24;
        std::memcpy(destination + i, &bits, 4);
    }
}

/// int8 -> float for n values of a qint8 row, unscaled: the caller applies
/// the row's scale once (to a dot product or a softmax weight), not per value.
inline void widen(const qint8* __restrict source, float* __restrict destination, int n) noexcept {
    for (int i = 0; i < n; ++i) destination[i] = float(source[i].bits);
}

/// Dequantises values [begin, end) of an int4 row of head_dim values (within
/// one group g) into destination[0, end - begin): minimum + code * scale.
inline void dequantise_group(const qint4* __restrict row, int head_dim, int g, int begin, int end,
                             float* __restrict destination) noexcept {
    const qint4_group group = qint4_group_of(row, head_dim, g);
    for (int d = begin; d < end; ++d) destination[d - begin] = group.minimum + float(qint4_code(row, d)) * group.scale;
}

/// Dequantises a whole int4 row of head_dim values into floats, group by
/// group: the portable form of the vector unpacking in simd.hpp, which the
/// vector paths also use for a short last group.
inline void dequantise(const qint4* __restrict row, int head_dim, float* __restrict destination) noexcept {
    for (int g = 0; g < qint4_groups(head_dim); ++g) {
        const int begin = g * qint4_group_size;
        const int end = begin + qint4_group_size < head_dim ? begin + qint4_group_size : head_dim;
        dequantise_group(row, head_dim, g, begin, end, destination + begin);
    }
}

/// Largest of n floats (n a multiple of 8), in 8 lanes so it vectorises.
inline float lane_max(const float* x, int n) noexcept {
    float lanes[8];
    for (int j = 0; j < 8; ++j) lanes[j] = x[j];
    for (int i = 8; i < n; i += 8)
        for (int j = 0; j < 8; ++j) lanes[j] = lanes[j] < x[i + j] ? x[i + j] : lanes[j];
    float best = lanes[0];
    for (int j = 1; j < 8; ++j) best = best < lanes[j] ? lanes[j] : best;
    return best;
}

/// Sum of n floats (n a multiple of 8), in 8 lanes so it vectorises.
inline float lane_sum(const float* x, int n) noexcept {
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; i += 8)
        for (int j = 0; j < 8; ++j) lanes[j] += x[i + j];
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

/// x[i] = exp(x[i]) for x[i] <= 0 (0 for -inf and below -87, where expf
/// itself is a denormal that no softmax weight next to exp(0) = 1 notices).
/// 1.5 * 2^23: adding it to a float of magnitude under 2^22 rounds it to an integer.
inline constexpr float exp_round_magic = 12582912.0f;

/// exp(clamped) for clamped in [-87, 0], less its power of two: returns
/// exp(r) for r = clamped - k ln 2 and sets `rounded` to k + exp_round_magic,
/// whose low mantissa bits hold k. The operations, in their order, that the
/// scalar exp below and the portable build's vector one share.
/// @tparam Value float, or a GCC/Clang generic vector of floats
template <class Value>
inline Value exp_reduced(Value clamped, Value& rounded) noexcept {
    rounded = clamped * 1.44269504088896341f + exp_round_magic;
    const Value k = rounded - exp_round_magic;
    Value r = clamped - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    Value p = Value{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return (p * (r * r) + r) + 1.0f;
}

/// A Cephes-style polynomial, within 2 ulp of expf. g++ leaves this loop
/// scalar: the kernels take its vector forms, vector_exp.hpp, and this one
/// only for a short tail or where the compiler has no generic vectors.
inline void exp_non_positive(float* x, int n) noexcept {
    std::uint32_t magic_bits;
    std::memcpy(&magic_bits, &exp_round_magic, 4);
    for (int i = 0; i < n; ++i) {
        const float input = x[i];
        const float clamped = input < -87.0f ? -87.0f : (input > 0.0f ? 0.0f : input);
        float rounded;
        const float y = exp_reduced(clamped, rounded);
        std::uint32_t rounded_bits;
        std::memcpy(&rounded_bits, &rounded, 4);
        const std::uint32_t scale_bits = (rounded_bits - magic_bits + 127u) << 23;  // 2^k, k in [-126, 0]
        float scale;
        std::memcpy(&scale, &scale_bits, 4);
        x[i] = input < -87.0f ? 0.0f : y * scale;
    }
}

/// Copies n floats (the float "widening", so callers are generic).
inline void widen(const float* source, float* destination, int n) noexcept {
    std::memcpy(destination, source, sizeof(float) * static_cast<std::size_t>(n));
}

}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
