// A 16-bit IEEE 754 binary16 type usable on host and device. On device it
// converts through CUDA's __half intrinsics; on a host compile without nvcc the
// conversions are done in software with round-to-nearest-even, subnormals,
// infinities and NaN handled exactly.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvcache/core/config.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace kvcache {

namespace detail {

/// float bits -> binary16 bits, round to nearest even; NaN stays NaN (quiet, payload's top bits kept).
KVCACHE_HOST_DEVICE constexpr std::uint16_t float_bits_to_half_bits(std::uint32_t x) noexcept {
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    std::uint32_t magnitude = x & 0x7fffffffu;
    if (magnitude > 0x7f800000u)  // NaN
        return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u)  // >= 65520 rounds to infinity (ties go to the even infinity)
        return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {  // normal half: rebias exponent 127 -> 15 and round 13 bits away
        const std::uint32_t odd = (magnitude >> 13) & 1u;
        magnitude += 0x0fffu + odd;
        return static_cast<std::uint16_t>(sign | ((magnitude - 0x38000000u) >> 13));
    }
    const std::uint32_t exponent = magnitude >> 23;
    if (exponent < 102u)  // below 2^-25: rounds to zero
        return static_cast<std::uint16_t>(sign);
    // Subnormal half: value / 2^-24 = significand * 2^(exponent - 126).
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24
    std::uint32_t result = significand >> shift;
    const std::uint32_t remainder = significand & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
}

/// binary16 bits -> float bits, exact.
KVCACHE_HOST_DEVICE constexpr std::uint32_t half_bits_to_float_bits(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) return sign | 0x7f800000u | (mantissa << 13);
    if (exponent != 0u) return sign | ((exponent + 112u) << 23) | (mantissa << 13);
    if (mantissa == 0u) return sign;
    std::uint32_t float_exponent = 113u;  // exponent field of 2^-14
    while ((mantissa & 0x400u) == 0u) {
        mantissa <<= 1;
        --float_exponent;
    }
    return sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13);
}

KVCACHE_HOST_DEVICE inline std::uint32_t float_to_bits(float f) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

KVCACHE_HOST_DEVICE inline float bits_to_float(std::uint32_t bits) noexcept {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

}  // namespace detail

/// IEEE binary16, layout-compatible with CUDA's __half, trivially copyable, so
/// the same cache memory is read by host code and by device kernels.
struct half {
    std::uint16_t bits;  ///< the raw binary16 encoding

    half() = default;

    /// Converts with round-to-nearest-even.
    KVCACHE_HOST_DEVICE explicit half(float value) noexcept : bits(from_float_bits(value)) {}

    /// Exact widening conversion.
    KVCACHE_HOST_DEVICE explicit operator float() const noexcept {
#if KVCACHE_DEVICE_PASS
        return __half2float(__ushort_as_half(bits));
#else
        return detail::bits_to_float(detail::half_bits_to_float_bits(bits));
#endif
    }

    /// Builds a half from its raw encoding.
    KVCACHE_HOST_DEVICE static constexpr half from_bits(std::uint16_t raw) noexcept {
        half h{};
        h.bits = raw;
        return h;
    }

#if defined(__CUDACC__)
    /// Interoperates with CUDA's half type in both directions.
    KVCACHE_HOST_DEVICE half(__half value) noexcept : bits(__half_as_ushort(value)) {}
    KVCACHE_HOST_DEVICE operator __half() const noexcept { return __ushort_as_half(bits); }
#endif

private:
    KVCACHE_HOST_DEVICE static std::uint16_t from_float_bits(float value) noexcept {
#if KVCACHE_DEVICE_PASS
        return __half_as_ushort(__float2half_rn(value));
#else
        return detail::float_bits_to_half_bits(detail::float_to_bits(value));
#endif
    }
};

static_assert(sizeof(half) == 2, "kvcache::half must be exactly 16 bits");
static_assert(alignof(half) == 2, "kvcache::half must be 2-byte aligned like __half");

/// Equality of encodings (so -0 != +0 and NaN == NaN with the same payload);
/// numeric comparison goes through float.
KVCACHE_HOST_DEVICE constexpr bool same_bits(half a, half b) noexcept { return a.bits == b.bits; }

}  // namespace kvcache
