// Element types the cache can store, and their properties as traits.
#pragma once

#include <cstring>
#include <type_traits>

#include "kvcache/core/bfloat16.hpp"
#include "kvcache/core/config.hpp"
#include "kvcache/core/half.hpp"

namespace kvcache {

/// Runtime tag of a storage element type (for dispatch, files and messages).
/// The values are the ones save files record, so they never change.
enum class element_kind : int { fp32 = 0, fp16 = 1, bf16 = 2 };

/// The name of an element kind: "fp32", "fp16" or "bf16" ("unknown" for a value outside the enum).
inline const char* to_string(element_kind kind) noexcept {
    switch (kind) {
    case element_kind::fp32: return "fp32";
    case element_kind::fp16: return "fp16";
    case element_kind::bf16: return "bf16";
    }
    return "unknown";
}

/// True for a value of element_kind that names a type (a file may hold any integer).
inline constexpr bool is_element_kind(int value) noexcept { return value >= 0 && value <= 2; }

/// Properties of a storage element type.
/// @tparam Element float, kvcache::half or kvcache::bfloat16
template <class Element>
struct element_traits;

template <>
struct element_traits<float> {
    static constexpr element_kind kind = element_kind::fp32;
    static constexpr const char* name = "fp32";
    KVCACHE_HOST_DEVICE static float to_float(float value) noexcept { return value; }
    KVCACHE_HOST_DEVICE static float from_float(float value) noexcept { return value; }
};

template <>
struct element_traits<half> {
    static constexpr element_kind kind = element_kind::fp16;
    static constexpr const char* name = "fp16";
    KVCACHE_HOST_DEVICE static float to_float(half value) noexcept { return static_cast<float>(value); }
    KVCACHE_HOST_DEVICE static half from_float(float value) noexcept { return half(value); }
};

template <>
struct element_traits<bfloat16> {
    static constexpr element_kind kind = element_kind::bf16;
    static constexpr const char* name = "bf16";
    KVCACHE_HOST_DEVICE static float to_float(bfloat16 value) noexcept { return static_cast<float>(value); }
    KVCACHE_HOST_DEVICE static bfloat16 from_float(float value) noexcept { return bfloat16(value); }
};

/// True for the element types kvcache stores.
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_element_v =
    std::is_same_v<Element, float> || std::is_same_v<Element, half> || std::is_same_v<Element, bfloat16>;

/// True for the 16-bit element types (half, bfloat16): stored as raw bits and widened on load.
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_16bit_element_v = std::is_same_v<Element, half> || std::is_same_v<Element, bfloat16>;

/// Widens a stored element to float.
/// @tparam Element float, kvcache::half or kvcache::bfloat16
template <class Element>
KVCACHE_HOST_DEVICE inline float to_float(Element value) noexcept {
    return element_traits<Element>::to_float(value);
}

/// Narrows a float to a stored element (round to nearest even for half and bfloat16).
/// @tparam Element float, kvcache::half or kvcache::bfloat16
template <class Element>
KVCACHE_HOST_DEVICE inline Element from_float(float value) noexcept {
    return element_traits<Element>::from_float(value);
}

/// Bytes of one element of the given kind.
inline constexpr int element_size(element_kind kind) noexcept { return kind == element_kind::fp32 ? 4 : 2; }

/// The element kind a name gives ("fp32", "fp16", "bf16"; also "float", "half",
/// "bfloat16"); false when the name is none of them.
inline bool parse_element_kind(const char* name, element_kind& kind) noexcept {
    const auto is = [name](const char* candidate) { return std::strcmp(name, candidate) == 0; };
    if (is("fp32") || is("float")) {
        kind = element_kind::fp32;
    } else if (is("fp16") || is("half")) {
        kind = element_kind::fp16;
    } else if (is("bf16") || is("bfloat16")) {
        kind = element_kind::bf16;
    } else {
        return false;
    }
    return true;
}

}  // namespace kvcache
