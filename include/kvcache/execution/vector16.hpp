// The 16-byte unit of vectorised loads and stores, and its float / 16-bit
// lanes; the 8-byte unit that moves 8 one-byte (fp8) elements.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvcache/core/bfloat16.hpp"
#include "kvcache/core/config.hpp"
#include "kvcache/core/half.hpp"

namespace kvcache {

/// Sixteen bytes moved by one load16 / store16 (a uint4 on the GPU). Read it
/// as 4 floats or 8 halves with the helpers below; lane order is memory order.
struct alignas(16) vector16 {
    std::uint32_t words[4];  ///< the raw bytes as four little-endian words
};

/// Eight bytes moved by one load8 / store8 (a uint2 on the GPU): 8 one-byte
/// elements, lane order memory order.
struct alignas(8) vector8 {
    std::uint32_t words[2];  ///< the raw bytes as two little-endian words
};

/// Byte lane i (0..7) of v.
KVCACHE_HOST_DEVICE inline std::uint8_t vector8_byte(const vector8& v, int i) noexcept {
    return static_cast<std::uint8_t>(v.words[i >> 2] >> (8 * (i & 3)));
}

/// Sets byte lane i (0..7) of v.
KVCACHE_HOST_DEVICE inline void set_byte(vector8& v, int i, std::uint8_t bits) noexcept {
    const unsigned shift = 8u * static_cast<unsigned>(i & 3);
    std::uint32_t& word = v.words[i >> 2];
    word = (word & ~(0xffu << shift)) | (static_cast<std::uint32_t>(bits) << shift);
}

/// Float lane i (0..3) of v.
KVCACHE_HOST_DEVICE inline float vector16_float(const vector16& v, int i) noexcept {
    float f;
    std::memcpy(&f, &v.words[i], sizeof f);
    return f;
}

/// Sets float lane i (0..3) of v.
KVCACHE_HOST_DEVICE inline void set_float(vector16& v, int i, float value) noexcept {
    std::memcpy(&v.words[i], &value, sizeof value);
}

/// The raw 16 bits of lane i (0..7) of v; lane 2k is the low half of word k
/// (memory order on little-endian).
KVCACHE_HOST_DEVICE inline std::uint16_t vector16_bits(const vector16& v, int i) noexcept {
    const std::uint32_t word = v.words[i >> 1];
    return static_cast<std::uint16_t>((i & 1) ? (word >> 16) : (word & 0xffffu));
}

/// Sets the raw 16 bits of lane i (0..7) of v.
KVCACHE_HOST_DEVICE inline void set_bits(vector16& v, int i, std::uint16_t bits) noexcept {
    const unsigned shift = (i & 1) ? 16u : 0u;
    std::uint32_t& word = v.words[i >> 1];
    word = (word & ~(0xffffu << shift)) | (static_cast<std::uint32_t>(bits) << shift);
}

/// Half lane i (0..7) of v.
KVCACHE_HOST_DEVICE inline half vector16_half(const vector16& v, int i) noexcept {
    return half::from_bits(vector16_bits(v, i));
}

/// Sets half lane i (0..7) of v.
KVCACHE_HOST_DEVICE inline void set_half(vector16& v, int i, half value) noexcept { set_bits(v, i, value.bits); }

/// Element lane i of v read as Element (float: 4 lanes, the 16-bit types: 8 lanes).
/// @tparam Element float, kvcache::half or kvcache::bfloat16
template <class Element>
KVCACHE_HOST_DEVICE inline Element vector16_get(const vector16& v, int i) noexcept {
    if constexpr (sizeof(Element) == 4) {
        return vector16_float(v, i);
    } else {
        return Element::from_bits(vector16_bits(v, i));
    }
}

/// Sets element lane i of v.
/// @tparam Element float, kvcache::half or kvcache::bfloat16
template <class Element>
KVCACHE_HOST_DEVICE inline void vector16_set(vector16& v, int i, Element value) noexcept {
    if constexpr (sizeof(Element) == 4) {
        set_float(v, i, value);
    } else {
        set_bits(v, i, value.bits);
    }
}

}  // namespace kvcache
