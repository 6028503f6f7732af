// Float vectors for the CPU attention kernels: the widest registers the build
// targets (AVX-512, else AVX2+FMA), else a plain 8-float array whose loops the
// compiler maps to whatever it has (SSE2 in a plain x86-64 build). Binary16
// rows widen on load: with F16C in hardware, else by the exact software
// conversion of row_math.hpp; bfloat16 rows widen by a 16-bit shift, fp8
// rows through binary16 (AVX2) or the software widening, int8 rows by sign
// extension and conversion, without their scale (the kernels apply it once
// per row); int4 rows are dequantised a whole row at a time (dequantise_row),
// since their scales change every 32 values. The kernels are written once
// against this.
// Everything here lives in the ISA-keyed inline namespace of isa.hpp, since
// its layout and code change with -march.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/row_math.hpp"
#include "kvcache/core/bfloat16.hpp"
#include "kvcache/core/float8.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/core/stored_row.hpp"

#if KVCACHE_CPU_AVX2_FMA
#include <immintrin.h>
#endif

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// 8 float lanes.
struct float8 {
    static constexpr int lanes = 8;
#if KVCACHE_CPU_AVX2_FMA
    __m256 v;
    static float8 zero() noexcept { return {_mm256_setzero_ps()}; }
    static float8 broadcast(float x) noexcept { return {_mm256_set1_ps(x)}; }
    static float8 load(const float* p) noexcept { return {_mm256_loadu_ps(p)}; }
    static float8 load(const half* p) noexcept {
#if KVCACHE_CPU_F16C
        return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
#else
        float widened[8];
        widen(p, widened, 8);
        return load(widened);
#endif
    }
    static float8 load(const bfloat16* p) noexcept {
        const __m256i widened = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return {_mm256_castsi256_ps(_mm256_slli_epi32(widened, 16))};
    }
    // fp8 widens through binary16 and F16C (which the AVX2 path implies):
    // e5m2 is a half's top byte; e4m3 shifted into a half reads 2^-8 of its
    // value, exactly (e4m3_as_half), and its lone NaN (S.1111.111), which
    // that reads as +-480 (past e4m3's largest finite, 448), becomes the
    // canonical quiet NaN of its sign, as core's widening gives.
    static float8 load(const float8_e5m2* p) noexcept {
        const __m128i bytes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
        return {_mm256_cvtph_ps(_mm_slli_epi16(bytes, 8))};
    }
    static float8 load(const float8_e4m3* p) noexcept {
        const __m128i as_half = e4m3_as_half(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
        const __m256i value = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtph_ps(as_half), _mm256_set1_ps(256.0f)));
        const __m256i is_nan = _mm256_cmpeq_epi32(_mm256_and_si256(value, _mm256_set1_epi32(0x7fffffff)),
                                                  _mm256_set1_epi32(e4m3_nan_as_float_bits));
        // The NaN lanes' 0x43f00000 becomes 0x7fc00000 (the canonical quiet NaN core widens to): xor
        // with the difference, the sign untouched.
        const __m256i to_nan = _mm256_set1_epi32(0x43f00000 ^ 0x7fc00000);
        return {_mm256_castsi256_ps(_mm256_xor_si256(value, _mm256_and_si256(is_nan, to_nan)))};
    }
    /// Bits of +480.0f, what e4m3's NaN magnitude (0x7f) reads as once widened through e4m3_as_half.
    static constexpr int e4m3_nan_as_float_bits = 0x43f00000;
    /// e4m3 codes sign-extended to 16 bits, as binary16 of 2^-8 their value: shifted left 7, the sign
    /// lands on bits 15 and 14 and the magnitude on 13..7; clearing bit 14 leaves the half.
    /// @tparam Vector __m128i (8 codes) or __m256i (16 codes)
    template <class Vector>
    static Vector e4m3_as_half(Vector sign_extended) noexcept {
        if constexpr (sizeof(Vector) == 16)
            return _mm_and_si128(_mm_slli_epi16(sign_extended, 7), _mm_set1_epi16(static_cast<short>(0xbfff)));
        else
            return _mm256_and_si256(_mm256_slli_epi16(sign_extended, 7), _mm256_set1_epi16(static_cast<short>(0xbfff)));
    }
    // int8 rows widen unscaled (sign-extended to 32 bits, then converted): the
    // kernels apply the row's scale once per row, not per lane.
    static float8 load(const qint8* p) noexcept {
        return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))))};
    }
    void store(float* p) const noexcept { _mm256_storeu_ps(p, v); }
    friend float8 fma(float8 a, float8 b, float8 c) noexcept { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
    friend float8 operator*(float8 a, float8 b) noexcept { return {_mm256_mul_ps(a.v, b.v)}; }
    friend float sum(float8 a) noexcept {
        __m128 x = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        x = _mm_add_ss(x, _mm_movehdup_ps(x));
        return _mm_cvtss_f32(x);
    }
#else
    float v[8];
    static float8 zero() noexcept { return broadcast(0.0f); }
    static float8 broadcast(float x) noexcept {
        float8 r;
        for (int i = 0; i < 8; ++i) r.v[i] = x;
        return r;
    }
    static float8 load(const float* p) noexcept {
        float8 r;
        for (int i = 0; i < 8; ++i) r.v[i] = p[i];
        return r;
    }
    /// half, bfloat16, fp8 and (unscaled) int8 rows: row_math.hpp's exact software widening.
    /// @tparam Element a narrow storage type widen() takes
    template <class Element>
    static float8 load(const Element* p) noexcept {
        float8 r;
        widen(p, r.v, 8);
        return r;
    }
    void store(float* p) const noexcept {
        for (int i = 0; i < 8; ++i) p[i] = v[i];
    }
    friend float8 fma(float8 a, float8 b, float8 c) noexcept {
        for (int i = 0; i < 8; ++i) c.v[i] += a.v[i] * b.v[i];
        return c;
    }
    friend float8 operator*(float8 a, float8 b) noexcept {
        for (int i = 0; i < 8; ++i) a.v[i] *= b.v[i];
        return a;
    }
    friend float sum(float8 a) noexcept {
        return ((a.v[0] + a.v[4]) + (a.v[1] + a.v[5])) + ((a.v[2] + a.v[6]) + (a.v[3] + a.v[7]));
    }
#endif
};

#if KVCACHE_CPU_AVX512
/// 16 float lanes (AVX-512 builds only).
struct float16 {
    static constexpr int lanes = 16;
    __m512 v;
    static float16 zero() noexcept { return {_mm512_setzero_ps()}; }
    static float16 broadcast(float x) noexcept { return {_mm512_set1_ps(x)}; }
    static float16 load(const float* p) noexcept { return {_mm512_loadu_ps(p)}; }
    static float16 load(const half* p) noexcept {
        // The maskz forms: g++ 12 warns (-Werror) that the unmasked ones' undefined source may be used.
        return {_mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
    }
    static float16 load(const bfloat16* p) noexcept {
        // maskz forms again: -march=native builds failed on the unmasked ones (-Werror=maybe-uninitialized).
        const __m512i widened =
            _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        return {_mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, widened, 16))};
    }
    // e4m3 as float8's, 16 lanes at once (AVX-512F only: the 16-bit steps on
    // 256-bit registers, the NaN test on 32-bit lanes); e5m2 as two of float8's.
    static float16 load(const float8_e4m3* p) noexcept {
        const __m256i as_half =
            float8::e4m3_as_half(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
        const __m512i value = _mm512_castps_si512(
            _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xffff, as_half), _mm512_set1_ps(256.0f)));
        const __mmask16 is_nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(value, _mm512_set1_epi32(0x7fffffff)),
                                                         _mm512_set1_epi32(float8::e4m3_nan_as_float_bits));
        return {_mm512_castsi512_ps(
            _mm512_mask_xor_epi32(value, is_nan, value, _mm512_set1_epi32(0x43f00000 ^ 0x7fc00000)))};
    }
    static float16 load(const float8_e5m2* p) noexcept { return joined(float8::load(p), float8::load(p + 8)); }
    static float16 load(const qint8* p) noexcept {
        // maskz forms, as above; unscaled like float8's.
        const __m512i widened = _mm512_maskz_cvtepi8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return {_mm512_maskz_cvtepi32_ps(0xffff, widened)};
    }
    static float16 joined(float8 low, float8 high) noexcept {
        // The maskz forms, as above (the unmasked ones' undefined source trips -Werror).
        __m512d both = _mm512_maskz_insertf64x4(0xff, _mm512_setzero_pd(), _mm256_castps_pd(low.v), 0);
        both = _mm512_maskz_insertf64x4(0xff, both, _mm256_castps_pd(high.v), 1);
        return {_mm512_castpd_ps(both)};
    }
    void store(float* p) const noexcept { _mm512_storeu_ps(p, v); }
    friend float16 fma(float16 a, float16 b, float16 c) noexcept { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
    friend float16 operator*(float16 a, float16 b) noexcept { return {_mm512_mul_ps(a.v, b.v)}; }
    friend float sum(float16 a) noexcept {
        __m512 x = _mm512_add_ps(a.v, _mm512_maskz_shuffle_f32x4(0xffff, a.v, a.v, 0x4e));  // + other 256-bit half
        x = _mm512_add_ps(x, _mm512_maskz_shuffle_f32x4(0xffff, x, x, 0xb1));              // + neighbouring 128
        __m128 y = _mm512_maskz_extractf32x4_ps(0xf, x, 0);
        y = _mm_add_ps(y, _mm_movehl_ps(y, y));
        y = _mm_add_ss(y, _mm_movehdup_ps(y));
        return _mm_cvtss_f32(y);
    }
};
/// out[j] = sum(a[j]) * (factors ? factors[j] : 1) for j in 0..3: the four
/// lane sums taken together (three shuffle-and-add levels for all four, then
/// two within 128-bit lanes) in the association sum() uses, so each is the
/// same float sum() gives, for about a third of the instructions.
inline void store_sums4(const float16 (&a)[4], const float* factors, float* out) noexcept {
    // 256-bit halves: [a0.lo + a0.hi | a1.lo + a1.hi], and the same of a2, a3.
    const __m512 c01 = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xffff, a[0].v, a[1].v, 0x44),
                                     _mm512_maskz_shuffle_f32x4(0xffff, a[0].v, a[1].v, 0xee));
    const __m512 c23 = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xffff, a[2].v, a[3].v, 0x44),
                                     _mm512_maskz_shuffle_f32x4(0xffff, a[2].v, a[3].v, 0xee));
    // 128-bit blocks: block j holds a_j's four partial sums.
    const __m512 d = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xffff, c01, c23, 0x88),
                                   _mm512_maskz_shuffle_f32x4(0xffff, c01, c23, 0xdd));
    // Within each block: lanes 0 + 2 and 1 + 3, then those two (sum()'s movehl and movehdup).
    __m512 e = _mm512_add_ps(d, _mm512_maskz_permute_ps(0xffff, d, 0x4e));
    e = _mm512_add_ps(e, _mm512_maskz_permute_ps(0xffff, e, 0xb1));
    __m128 sums = _mm512_maskz_extractf32x4_ps(0xf, _mm512_maskz_compress_ps(0x1111, e), 0);
    if (factors) sums = _mm_mul_ps(sums, _mm_loadu_ps(factors));
    _mm_storeu_ps(out, sums);
}
inline constexpr int widest_lanes = 16;
/// Vector registers the build has (what bounds the kernel's accumulators).
inline constexpr int vector_registers = 32;
#else
inline constexpr int widest_lanes = 8;
inline constexpr int vector_registers = 16;
#endif

/// out[j] = sum(a[j]) * (factors ? factors[j] : 1) for j in 0..3, one at a time.
inline void store_sums4(const float8 (&a)[4], const float* factors, float* out) noexcept {
    for (int j = 0; j < 4; ++j) out[j] = factors ? sum(a[j]) * factors[j] : sum(a[j]);
}

/// The widest vector whose lane count divides Dim.
template <int Dim>
struct vector_for {
#if KVCACHE_CPU_AVX512
    using type = std::conditional_t<Dim % 16 == 0, float16, float8>;
#else
    using type = float8;
#endif
};

/// The Vec::lanes dequantised values of an int4 row of Dim values from d on
/// (d a multiple of the lanes, so the vector lies in one group of 32): the
/// codes' word broadcast to every lane, shifted right by 4 x lane and masked
/// (little-endian: lane i gets nibble i, the value at d + i), converted, then
/// one FMA with the group's scale and minimum (widened by F16C). Lets decode
/// read int4 rows in place, as it reads int8 rows.
/// @tparam Vec float8 or float16
/// @tparam Dim head dimension
template <class Vec, int Dim>
inline Vec load_int4(const qint4* row, int d) noexcept {
#if KVCACHE_CPU_AVX2_FMA
    std::uint32_t record;  // half scale, half minimum
    std::memcpy(&record, static_cast<const void*>(row + qint4_code_bytes(Dim) + d / qint4_group_size * qint4_group_bytes),
                sizeof record);
    const __m128 group = _mm_cvtph_ps(_mm_cvtsi32_si128(int(record)));  // lane 0 scale, lane 1 minimum
    if constexpr (Vec::lanes == 8) {
        std::uint32_t codes;
        std::memcpy(&codes, static_cast<const void*>(row + d / 2), sizeof codes);
        const __m256i shifted = _mm256_srlv_epi32(_mm256_set1_epi32(int(codes)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        const __m256 value = _mm256_cvtepi32_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(0xf)));
        return {_mm256_fmadd_ps(value, _mm256_broadcastss_ps(group), _mm256_broadcastss_ps(_mm_movehdup_ps(group)))};
    } else {
#if KVCACHE_CPU_AVX512
        std::uint64_t codes;
        std::memcpy(&codes, static_cast<const void*>(row + d / 2), sizeof codes);
        // Lanes 0..7 take the low word, 8..15 the high one.
        const __m512i words = _mm512_maskz_permutexvar_epi32(
            0xffff, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_zextsi128_si512(_mm_cvtsi64_si128(static_cast<long long>(codes))));
        const __m512i shifted = _mm512_maskz_srlv_epi32(
            0xffff, words, _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28));
        const __m512 value = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_and_epi32(0xffff, shifted, _mm512_set1_epi32(0xf)));
        // maskz broadcasts: the unmasked ones trip -Werror=maybe-uninitialized in g++ 12.
        return {_mm512_fmadd_ps(value, _mm512_maskz_broadcastss_ps(0xffff, group),
                                _mm512_maskz_broadcastss_ps(0xffff, _mm_movehdup_ps(group)))};
#endif
    }
#else
    Vec result;
    dequantise_group(row, Dim, d / qint4_group_size, d, d + Vec::lanes, result.v);
    return result;
#endif
}

/// True where the decode kernel reads int4 rows of head dimension Dim in
/// "nibble order" (AVX2 and AVX-512 builds, Dim a multiple of 32): a block
/// of code bytes zero-extended to 32-bit lanes gives its low nibbles by a
/// mask and its high ones by a shift, so a vector of values costs about 3
/// instructions where gathering them in d order (load_int4) costs 10. The
/// query rows and accumulators are put in the same order for the walk
/// (int4_nibble_index).
/// @tparam Element the stored element type
/// @tparam Dim head dimension
template <class Element, int Dim>
inline constexpr bool int4_nibble_order_v =
    std::is_same_v<Element, qint4> && Dim % qint4_group_size == 0 && KVCACHE_CPU_AVX2_FMA;

/// Lanes of one nibble-order vector: the widest vector's (8 on AVX2, 16 on AVX-512).
inline constexpr int int4_nibble_lanes = widest_lanes;

/// The d of position p in nibble order: each group of 32 is read as vectors
/// of L = int4_nibble_lanes values, in pairs: the low nibbles of L code bytes
/// (d = 0, 2, .., 2L - 2 from the block's start), then their high nibbles
/// (d = 1, 3, .., 2L - 1); AVX2 reads two such blocks of 8 bytes a group,
/// AVX-512 one of 16.
inline constexpr int int4_nibble_index(int p) noexcept {
    constexpr int lanes = int4_nibble_lanes;
    const int group = p / qint4_group_size, within = p % qint4_group_size;
    const int vector = within / lanes, lane = within % lanes;
    return group * qint4_group_size + (vector / 2) * 2 * lanes + 2 * lane + vector % 2;
}

/// Nibble-order vectors 2h and 2h + 1 of group g of an int4 row (the low and
/// high nibbles of the same code bytes), loaded and scaled once.
/// @tparam Dim head dimension
/// @tparam Vec the widest vector (float8 on AVX2, float16 on AVX-512)
template <int Dim, class Vec>
inline void load_int4_nibble_pair(const qint4* row, int g, int h, Vec& low, Vec& high) noexcept {
    static_assert(Vec::lanes == int4_nibble_lanes, "nibble order reads the widest vectors");
#if KVCACHE_CPU_AVX2_FMA
    std::uint32_t record;  // half scale, half minimum
    std::memcpy(&record, static_cast<const void*>(row + qint4_code_bytes(Dim) + g * qint4_group_bytes), sizeof record);
    const __m128 scale_minimum = _mm_cvtph_ps(_mm_cvtsi32_si128(int(record)));
    const qint4* const codes = row + g * (qint4_group_size / 2) + h * Vec::lanes;
#if KVCACHE_CPU_AVX512
    // maskz forms: g++ 12 warns (-Werror) that the unmasked ones' undefined source may be used.
    const __m512 scale = _mm512_maskz_broadcastss_ps(0xffff, scale_minimum);
    const __m512 minimum = _mm512_maskz_broadcastss_ps(0xffff, _mm_movehdup_ps(scale_minimum));
    const __m512i bytes = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
    const __m512i low_codes = _mm512_maskz_and_epi32(0xffff, bytes, _mm512_set1_epi32(0xf));
    const __m512i high_codes = _mm512_maskz_srli_epi32(0xffff, bytes, 4);
    low = {_mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, low_codes), scale, minimum)};
    high = {_mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, high_codes), scale, minimum)};
#else
    const __m256 scale = _mm256_broadcastss_ps(scale_minimum), minimum = _mm256_broadcastss_ps(_mm_movehdup_ps(scale_minimum));
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
    low = {_mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(0xf))), scale, minimum)};
    high = {_mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4)), scale, minimum)};
#endif
#else
    (void)row;
    (void)g;
    (void)h;
    (void)low;
    (void)high;
    static_assert(Dim < 0, "nibble order is an AVX2 / AVX-512 path (int4_nibble_order_v)");
#endif
}

/// Vec::lanes values of a stored row from d on, widened: in place for every
/// type but int4, whose group scales and minima load_int4 applies (the
/// nibble-order walks read int4 through load_int4_nibble_pair instead).
/// @tparam Vec float8 or float16
/// @tparam Dim head dimension
template <class Vec, int Dim, class Element>
inline Vec load_row(const Element* row, int d) noexcept {
    if constexpr (std::is_same_v<Element, qint4>) return load_int4<Vec, Dim>(row, d);
    else return Vec::load(row + d);
}

/// Dequantises an int4 row of Dim values into floats (minimum + code * scale
/// per group of 32): on AVX2 and AVX-512 each whole group's 16 code bytes are
/// split into nibbles (and, shift), interleaved back into d order, widened to
/// 32-bit lanes and converted, then one FMA with the group's scale and
/// minimum; a short last group and the portable build take row_math.hpp's
/// scalar loop. Used per tile, never over the whole cache.
/// @tparam Dim head dimension
template <int Dim>
inline void dequantise_row(const qint4* row, float* out) noexcept {
#if KVCACHE_CPU_AVX2_FMA
    constexpr int whole_groups = Dim / qint4_group_size;
    for (int g = 0; g < whole_groups; ++g) {
        const qint4_group group = qint4_group_of(row, Dim, g);
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * qint4_group_size / 2));
        const __m128i nibble = _mm_set1_epi8(0x0f);
        const __m128i low = _mm_and_si128(bytes, nibble);                       // even d
        const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);   // odd d
        const __m128i codes[2] = {_mm_unpacklo_epi8(low, high), _mm_unpackhi_epi8(low, high)};  // d 0..15, 16..31
        float* const at = out + g * qint4_group_size;
#if KVCACHE_CPU_AVX512
        const __m512 scale = _mm512_set1_ps(group.scale), minimum = _mm512_set1_ps(group.minimum);
        for (int half_group = 0; half_group < 2; ++half_group) {
            // maskz forms: g++ 12 warns (-Werror) that the unmasked ones' undefined source may be used.
            const __m512 code = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepu8_epi32(0xffff, codes[half_group]));
            _mm512_storeu_ps(at + 16 * half_group, _mm512_fmadd_ps(code, scale, minimum));
        }
#else
        const __m256 scale = _mm256_set1_ps(group.scale), minimum = _mm256_set1_ps(group.minimum);
        for (int quarter = 0; quarter < 4; ++quarter) {
            const __m128i eight = quarter % 2 == 0 ? codes[quarter / 2] : _mm_srli_si128(codes[quarter / 2], 8);
            const __m256 code = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight));
            _mm256_storeu_ps(at + 8 * quarter, _mm256_fmadd_ps(code, scale, minimum));
        }
#endif
    }
    if constexpr (Dim % qint4_group_size != 0)
        dequantise_group(row, Dim, whole_groups, whole_groups * qint4_group_size, Dim,
                         out + whole_groups * qint4_group_size);
#else
    dequantise(row, Dim, out);
#endif
}

/// The cache a prefetch asks its line into (and the levels below it).
enum class prefetch_into { l1, l2 };

/// Hints the cache to fetch the line holding p (no effect where unsupported).
/// @tparam Into the cache the line is asked into
template <prefetch_into Into>
inline void prefetch(const void* p) noexcept {
#if defined(__GNUC__)
    if constexpr (Into == prefetch_into::l1) __builtin_prefetch(p, 0, 3);  // prefetcht0 on x86
    else __builtin_prefetch(p, 0, 2);                                     // prefetcht1
#else
    (void)p;
#endif
}

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
