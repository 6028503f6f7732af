// 8-bit floats for K/V storage, in the two encodings of the OCP FP8 format
// that GPUs since Hopper and Ada convert in hardware and that engines store
// caches in:
//   e4m3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, NaN only
//         at S.1111.111; largest finite 448. More precision, less range.
//   e5m2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE specials
//         (infinity S.11111.00, NaN S.11111.xx); largest finite 57344.
// Narrowing rounds to nearest even and saturates: a float past the largest
// finite value (infinity included) becomes the largest finite value of its
// sign, as CUDA's __NV_SATFINITE conversions and the engines' fp8 caches do,
// so one outlier clips instead of turning a row into infinities or NaN.
// NaN stays NaN. Widening is exact. A cache stores raw fp8 and keeps its
// scale (if any) apart; these types know nothing of scales.
#pragma once

#include <cstdint>

#include "kvcache/core/config.hpp"
#include "kvcache/core/half.hpp"  // detail::float_to_bits / bits_to_float

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace kvcache {

namespace detail {

/// The shape of an 8-bit float encoding.
/// @tparam ExponentBits width of the exponent field
/// @tparam MantissaBits width of the mantissa field (ExponentBits + MantissaBits == 7)
/// @tparam HasInfinity true for IEEE-style specials (all-ones exponent is inf/NaN),
///         false for the "finite" encoding whose only NaN is all ones
template <int ExponentBits, int MantissaBits, bool HasInfinity>
struct float8_encoding {
    static_assert(ExponentBits + MantissaBits == 7, "kvcache: an 8-bit float has 1 sign, E exponent and M mantissa bits");
    static constexpr int exponent_bits = ExponentBits;
    static constexpr int mantissa_bits = MantissaBits;
    static constexpr bool has_infinity = HasInfinity;
    static constexpr int bias = (1 << (ExponentBits - 1)) - 1;
    static constexpr std::uint32_t exponent_mask = (1u << ExponentBits) - 1;
    static constexpr std::uint32_t mantissa_mask = (1u << MantissaBits) - 1;
    /// Magnitude bits of the largest finite value: one below infinity, or one below the lone NaN.
    static constexpr std::uint8_t max_finite = HasInfinity ? static_cast<std::uint8_t>((exponent_mask << MantissaBits) - 1)
                                                           : static_cast<std::uint8_t>(0x7e);
    /// Magnitude bits of the NaN this library writes (a quiet NaN for the IEEE-style encoding).
    static constexpr std::uint8_t quiet_nan = HasInfinity ? static_cast<std::uint8_t>((exponent_mask << MantissaBits) | (1u << (MantissaBits - 1)))
                                                          : static_cast<std::uint8_t>(0x7f);
};

using e4m3_encoding = float8_encoding<4, 3, false>;
using e5m2_encoding = float8_encoding<5, 2, true>;

/// fp8 bits -> float bits, exact.
/// @tparam Encoding a float8_encoding
template <class Encoding>
KVCACHE_HOST_DEVICE constexpr std::uint32_t float8_bits_to_float_bits(std::uint8_t b) noexcept {
    constexpr int m_bits = Encoding::mantissa_bits;
    const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
    const std::uint32_t exponent = (b >> m_bits) & Encoding::exponent_mask;
    std::uint32_t mantissa = b & Encoding::mantissa_mask;
    // e4m3's lone NaN widens to float's canonical quiet NaN; e5m2's infinity
    // to infinity, its NaNs made quiet keeping their payload (as F16C widens a half).
    if (!Encoding::has_infinity && (b & 0x7fu) == 0x7fu) return sign | 0x7fc00000u;
    if (Encoding::has_infinity && exponent == Encoding::exponent_mask)
        return mantissa == 0 ? sign | 0x7f800000u : sign | 0x7fc00000u | (mantissa << (23 - m_bits));
    if (exponent == 0) {
        if (mantissa == 0) return sign;
        // Subnormal: shift the leading one into the implicit bit; every fp8
        // subnormal is a normal float.
        int e = 1 - Encoding::bias + 127;
        while ((mantissa & (1u << m_bits)) == 0) {
            mantissa <<= 1;
            --e;
        }
        return sign | (static_cast<std::uint32_t>(e) << 23) | ((mantissa & Encoding::mantissa_mask) << (23 - m_bits));
    }
    return sign | ((exponent - Encoding::bias + 127) << 23) | (mantissa << (23 - m_bits));
}

/// float bits -> fp8 bits: round to nearest even, saturate to the largest
/// finite value (infinities included), NaN to a NaN of the same sign.
/// @tparam Encoding a float8_encoding
template <class Encoding>
KVCACHE_HOST_DEVICE constexpr std::uint8_t float_bits_to_float8_bits(std::uint32_t x) noexcept {
    constexpr int m_bits = Encoding::mantissa_bits;
    const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
    const std::uint32_t magnitude = x & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return static_cast<std::uint8_t>(sign | Encoding::quiet_nan);
    const int exponent = static_cast<int>(magnitude >> 23) - 127;  // unbiased; float subnormals read as -127
    std::uint32_t rounded;
    if (exponent >= 1 - Encoding::bias) {
        // Normal in fp8: drop 23 - M mantissa bits; adding half an ulp less
        // one, plus the lowest kept bit, rounds ties to even, and a carry out
        // of the mantissa moves the exponent up (into saturation from the top).
        constexpr int shift = 23 - m_bits;
        const std::uint32_t odd = (magnitude >> shift) & 1u;
        rounded = ((magnitude + (1u << (shift - 1)) - 1u + odd) >> shift) -
                  (static_cast<std::uint32_t>(127 - Encoding::bias) << m_bits);
        if (rounded > Encoding::max_finite) rounded = Encoding::max_finite;
    } else {
        // Subnormal in fp8 (or zero): the value in units of the smallest
        // subnormal, 2^(1 - bias - M), is the implicit-bit mantissa shifted
        // right; round that shift to nearest even. A carry to 2^M is exactly
        // the smallest normal's encoding.
        if (magnitude < 0x00800000u) return sign;  // float zero and subnormals: far below fp8's half-smallest
        const std::uint32_t significand = (magnitude & 0x007fffffu) | 0x00800000u;
        const int shift = 23 - m_bits + (1 - Encoding::bias) - exponent;  // > 23 - M here
        if (shift > 25) return sign;  // below half the smallest subnormal
        const std::uint32_t kept = significand >> shift;
        const std::uint32_t rest = significand & ((1u << shift) - 1u), half_unit = 1u << (shift - 1);
        rounded = kept + ((rest > half_unit || (rest == half_unit && (kept & 1u))) ? 1u : 0u);
    }
    return static_cast<std::uint8_t>(sign | rounded);
}

/// An 8-bit float of the given encoding, one byte, trivially copyable, so the
/// same cache memory is read by host code and by device kernels.
/// @tparam Encoding a float8_encoding
template <class Encoding>
struct fp8 {
    using encoding = Encoding;
    std::uint8_t bits;  ///< the raw encoding

    fp8() = default;

    /// Converts with round-to-nearest-even, saturating to the largest finite value.
    KVCACHE_HOST_DEVICE explicit fp8(float value) noexcept : bits(from_float_bits(value)) {}

    /// Exact widening conversion.
    KVCACHE_HOST_DEVICE explicit operator float() const noexcept {
#if KVCACHE_DEVICE_PASS
        // Through binary16, which holds every fp8 value: one cvt instruction on
        // sm_89 and later, CUDA's integer sequence before (sm_80 has no fp8 cvt).
        const __half_raw wide = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(bits),
                                                        Encoding::has_infinity ? __NV_E5M2 : __NV_E4M3);
        return __half2float(__half(wide));
#else
        return bits_to_float(float8_bits_to_float_bits<Encoding>(bits));
#endif
    }

    /// Builds a value from its raw encoding.
    KVCACHE_HOST_DEVICE static constexpr fp8 from_bits(std::uint8_t raw) noexcept {
        fp8 f{};
        f.bits = raw;
        return f;
    }

    /// The largest finite value (448 for e4m3, 57344 for e5m2).
    KVCACHE_HOST_DEVICE static constexpr fp8 max() noexcept { return from_bits(Encoding::max_finite); }

private:
    KVCACHE_HOST_DEVICE static std::uint8_t from_float_bits(float value) noexcept {
#if KVCACHE_DEVICE_PASS
        // One cvt instruction on sm_89 and later; CUDA's software rounding before.
        return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, Encoding::has_infinity ? __NV_E5M2 : __NV_E4M3);
#else
        return float_bits_to_float8_bits<Encoding>(float_to_bits(value));
#endif
    }
};

}  // namespace detail

/// fp8 e4m3 (OCP "E4M3FN"): range +-448, 3 mantissa bits; layout-compatible with CUDA's __nv_fp8_e4m3.
using float8_e4m3 = detail::fp8<detail::e4m3_encoding>;
/// fp8 e5m2: range +-57344, 2 mantissa bits, IEEE specials; layout-compatible with CUDA's __nv_fp8_e5m2.
using float8_e5m2 = detail::fp8<detail::e5m2_encoding>;

static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1, "kvcache: fp8 values must be exactly one byte");

/// Equality of encodings (so -0 != +0 and NaN == NaN with the same bits);
/// numeric comparison goes through float.
/// @tparam Encoding a float8_encoding
template <class Encoding>
KVCACHE_HOST_DEVICE constexpr bool same_bits(detail::fp8<Encoding> a, detail::fp8<Encoding> b) noexcept {
    return a.bits == b.bits;
}

}  // namespace kvcache
