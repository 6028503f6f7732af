// bfloat16: the top 16 bits of an IEEE binary32 (8 exponent bits, 7
// mantissa bits), usable on host and device. It has float's range, so
// narrowing never overflows a finite float that rounds below the largest
// bfloat16, and widening is a shift. On device it converts through CUDA's
// __nv_bfloat16 intrinsics; elsewhere in software, round to nearest even.
#pragma once

#include <cstdint>

#include "kvcache/core/config.hpp"
#include "kvcache/core/half.hpp"  // detail::float_to_bits / bits_to_float

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

namespace kvcache {

namespace detail {

/// float bits -> bfloat16 bits, round to nearest even. Finite values past the
/// largest bfloat16 (by at least half an ulp) round to infinity, as IEEE
/// rounding does; NaN stays NaN, quiet, with its sign and top payload bits.
KVCACHE_HOST_DEVICE constexpr std::uint16_t float_bits_to_bfloat16_bits(std::uint32_t x) noexcept {
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
    // Adding 0x7fff plus the lowest kept bit rounds ties to even; a carry out
    // of the mantissa moves the exponent up, into infinity from the largest finite.
    const std::uint32_t odd = (x >> 16) & 1u;
    return static_cast<std::uint16_t>((x + 0x7fffu + odd) >> 16);
}

/// bfloat16 bits -> float bits, exact.
KVCACHE_HOST_DEVICE constexpr std::uint32_t bfloat16_bits_to_float_bits(std::uint16_t b) noexcept {
    return static_cast<std::uint32_t>(b) << 16;
}

}  // namespace detail

/// bfloat16, layout-compatible with CUDA's __nv_bfloat16, trivially copyable,
/// so the same cache memory is read by host code and by device kernels.
struct bfloat16 {
    std::uint16_t bits;  ///< the raw encoding (the top half of a float's)

    bfloat16() = default;

    /// Converts with round-to-nearest-even.
    KVCACHE_HOST_DEVICE explicit bfloat16(float value) noexcept : bits(from_float_bits(value)) {}

    /// Exact widening conversion.
    KVCACHE_HOST_DEVICE explicit operator float() const noexcept {
        return detail::bits_to_float(detail::bfloat16_bits_to_float_bits(bits));
    }

    /// Builds a bfloat16 from its raw encoding.
    KVCACHE_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t raw) noexcept {
        bfloat16 b{};
        b.bits = raw;
        return b;
    }

#if defined(__CUDACC__)
    /// Interoperates with CUDA's bfloat16 type in both directions.
    KVCACHE_HOST_DEVICE bfloat16(__nv_bfloat16 value) noexcept : bits(__bfloat16_as_ushort(value)) {}
    KVCACHE_HOST_DEVICE operator __nv_bfloat16() const noexcept { return __ushort_as_bfloat16(bits); }
#endif

private:
    KVCACHE_HOST_DEVICE static std::uint16_t from_float_bits(float value) noexcept {
#if KVCACHE_DEVICE_PASS
        return __bfloat16_as_ushort(__float2bfloat16_rn(value));
#else
        return detail::float_bits_to_bfloat16_bits(detail::float_to_bits(value));
#endif
    }
};

static_assert(sizeof(bfloat16) == 2, "kvcache::bfloat16 must be exactly 16 bits");
static_assert(alignof(bfloat16) == 2, "kvcache::bfloat16 must be 2-byte aligned like __nv_bfloat16");

/// Equality of encodings (so -0 != +0 and NaN == NaN with the same payload);
/// numeric comparison goes through float.
KVCACHE_HOST_DEVICE constexpr bool same_bits(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }

}  // namespace kvcache
