// exp(x) for x <= 0 in vector registers, for the softmax of both CPU
// kernels: g++ leaves row_math.hpp's exp_non_positive loop scalar, and then
// the softmax of a decode tile costs as much as its products (measured in
// docs/performance.md). Same polynomial and the same answers as
// exp_non_positive, NaN included (a NaN logit gives a NaN weight, as in the
// reference). Lives in the ISA-keyed namespace of isa.hpp.
#pragma once

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/row_math.hpp"

#include <cstdint>

#if KVCACHE_CPU_AVX2_FMA
#include <immintrin.h>
#endif

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

#if KVCACHE_CPU_AVX2_FMA
#if KVCACHE_CPU_AVX512
using exp_register = __m512;
#define KVCACHE_EXP_OP(name) _mm512_##name
#define KVCACHE_EXP_BITS(x) _mm512_castps_si512(x)
#define KVCACHE_EXP_FLOATS(x) _mm512_castsi512_ps(x)
// max(low, x) and min(high, .) return their second operand, x, when it is
// NaN: the clamp lets NaN through. The maskz forms: g++ 12 warns (-Werror)
// that the unmasked ones' undefined source may be used.
#define KVCACHE_EXP_CLAMP(x, low, high) _mm512_maskz_min_ps(0xffff, high, _mm512_maskz_max_ps(0xffff, low, x))
#define KVCACHE_EXP_SHIFT(x) _mm512_maskz_slli_epi32(0xffff, x, 23)
#else
using exp_register = __m256;
#define KVCACHE_EXP_OP(name) _mm256_##name
#define KVCACHE_EXP_BITS(x) _mm256_castps_si256(x)
#define KVCACHE_EXP_FLOATS(x) _mm256_castsi256_ps(x)
#define KVCACHE_EXP_CLAMP(x, low, high) _mm256_min_ps(high, _mm256_max_ps(low, x))  // NaN passes, as above
#define KVCACHE_EXP_SHIFT(x) _mm256_slli_epi32(x, 23)
#endif

/// Floats in an exp_register.
inline constexpr int exp_lanes = int(sizeof(exp_register) / sizeof(float));

/// exp(x) lane-wise for x <= 0: exp_non_positive's polynomial (0 below -87
/// and for -inf, NaN for NaN).
inline exp_register exp_vector(exp_register input) noexcept {
    constexpr float magic = 12582912.0f;          // 1.5 * 2^23: adding it rounds to an integer
    constexpr int exponent_shift = 0x4b400000 - 127;  // magic's bits less the exponent bias
    const exp_register lowest = KVCACHE_EXP_OP(set1_ps)(-87.0f), zero = KVCACHE_EXP_OP(setzero_ps)();
    const exp_register magic_v = KVCACHE_EXP_OP(set1_ps)(magic), one = KVCACHE_EXP_OP(set1_ps)(1.0f);
    const exp_register clamped = KVCACHE_EXP_CLAMP(input, lowest, zero);
    const exp_register rounded =
        KVCACHE_EXP_OP(fmadd_ps)(clamped, KVCACHE_EXP_OP(set1_ps)(1.44269504088896341f), magic_v);
    const exp_register k = KVCACHE_EXP_OP(sub_ps)(rounded, magic_v);
    exp_register r = KVCACHE_EXP_OP(fnmadd_ps)(k, KVCACHE_EXP_OP(set1_ps)(0.693359375f), clamped);
    r = KVCACHE_EXP_OP(fnmadd_ps)(k, KVCACHE_EXP_OP(set1_ps)(-2.12194440e-4f), r);
    exp_register p = KVCACHE_EXP_OP(set1_ps)(1.9875691500e-4f);
    p = KVCACHE_EXP_OP(fmadd_ps)(p, r, KVCACHE_EXP_OP(set1_ps)(1.3981999507e-3f));
    p = KVCACHE_EXP_OP(fmadd_ps)(p, r, KVCACHE_EXP_OP(set1_ps)(8.3334519073e-3f));
    p = KVCACHE_EXP_OP(fmadd_ps)(p, r, KVCACHE_EXP_OP(set1_ps)(4.1665795894e-2f));
    p = KVCACHE_EXP_OP(fmadd_ps)(p, r, KVCACHE_EXP_OP(set1_ps)(1.6666665459e-1f));
    p = KVCACHE_EXP_OP(fmadd_ps)(p, r, KVCACHE_EXP_OP(set1_ps)(5.0000001201e-1f));
    const exp_register y =
        KVCACHE_EXP_OP(add_ps)(KVCACHE_EXP_OP(fmadd_ps)(p, KVCACHE_EXP_OP(mul_ps)(r, r), r), one);
    // 2^k, k in [-126, 0]: k's bits sit at the bottom of rounded's mantissa.
    const auto scale_bits = KVCACHE_EXP_SHIFT(
        KVCACHE_EXP_OP(sub_epi32)(KVCACHE_EXP_BITS(rounded), KVCACHE_EXP_OP(set1_epi32)(exponent_shift)));
    const exp_register result = KVCACHE_EXP_OP(mul_ps)(y, KVCACHE_EXP_FLOATS(scale_bits));
    // Zero where input < -87 (-inf included); NaN, unordered, keeps its result.
#if KVCACHE_CPU_AVX512
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(input, lowest, _CMP_NLT_UQ), result);
#else
    return _mm256_and_ps(result, _mm256_cmp_ps(input, lowest, _CMP_NLT_UQ));
#endif
}
#else
/// Floats exp_rows handles at a time in the portable build.
inline constexpr int exp_lanes = 8;
#if defined(__GNUC__)
// The portable build: GCC's (and Clang's) generic vectors of 16 bytes, which
// every vector target has (SSE2 on any x86-64, NEON on AArch64; g++ 12 splits
// compares of wider ones on SSE2 into scalar code). g++ leaves
// exp_non_positive's loop scalar because under -ftrapping-math it may not
// turn the clamps' compares into selects; on vectors the compares are masks
// and nothing branches. Same operations in the same order: the same floats.
typedef float portable_floats __attribute__((vector_size(16)));
typedef std::int32_t portable_ints __attribute__((vector_size(16)));
/// The same vector read from or written to floats at any alignment (a copy
/// through memcpy can cost g++ more than the exp).
typedef float unaligned_floats __attribute__((vector_size(16), aligned(4), may_alias));

/// x[0..4) = exp(x[0..4)) for x <= 0: exp_non_positive's operations in its
/// order (0 below -87 and for -inf, NaN for NaN).
inline void exp_four(float* x) noexcept {
    const portable_floats input = *reinterpret_cast<const unaligned_floats*>(x);
    constexpr std::int32_t exponent_shift = 0x4b400000 - 127;  // exp_round_magic's bits less the exponent bias
    const portable_floats lowest = portable_floats{} - 87.0f, zero = portable_floats{};
    // Selects by mask bits; a NaN compares false both ways, so it passes the clamp.
    const portable_ints below = input < lowest, above = input > zero;
    const portable_ints kept = (portable_ints)input & ~(below | above);
    const portable_floats clamped = (portable_floats)(kept | ((portable_ints)lowest & below));
    portable_floats rounded;
    const portable_floats y = exp_reduced(clamped, rounded);
    const portable_ints scale_bits = ((portable_ints)rounded - exponent_shift) << 23;  // 2^k, k in [-126, 0]
    *reinterpret_cast<unaligned_floats*>(x) = (portable_floats)((portable_ints)(y * (portable_floats)scale_bits) & ~below);
}
#endif
#endif

/// x[i] = exp(x[i]) for x[i] <= 0 and n a multiple of exp_lanes.
inline void exp_rows(float* x, int n) noexcept {
#if KVCACHE_CPU_AVX2_FMA
    for (int i = 0; i < n; i += exp_lanes) KVCACHE_EXP_OP(storeu_ps)(x + i, exp_vector(KVCACHE_EXP_OP(loadu_ps)(x + i)));
#elif defined(__GNUC__)
    int i = 0;
    for (; i + 4 <= n; i += 4) exp_four(x + i);
    exp_non_positive(x + i, n - i);
#else
    exp_non_positive(x, n);
#endif
}

#if KVCACHE_CPU_AVX2_FMA
#undef KVCACHE_EXP_OP
#undef KVCACHE_EXP_BITS
#undef KVCACHE_EXP_FLOATS
#undef KVCACHE_EXP_CLAMP
#undef KVCACHE_EXP_SHIFT
#endif

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
