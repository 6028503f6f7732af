// Element types the cache can store, and their properties as traits.
#pragma once

#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/core/half.hpp"

namespace kvcache {

/// Runtime tag of a storage element type (for dispatch, files and messages).
enum class element_kind : int { fp32 = 0, fp16 = 1 };

/// The name of an element kind: "fp32" or "fp16".
inline const char* to_string(element_kind kind) noexcept { return kind == element_kind::fp32 ? "fp32" : "fp16"; }

/// Properties of a storage element type.
/// @tparam Element float or kvcache::half
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

/// True for the element types kvcache stores.
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_element_v = std::is_same_v<Element, float> || std::is_same_v<Element, half>;

/// Widens a stored element to float.
/// @tparam Element float or kvcache::half
template <class Element>
KVCACHE_HOST_DEVICE inline float to_float(Element value) noexcept {
    return element_traits<Element>::to_float(value);
}

/// Narrows a float to a stored element (round to nearest even for half).
/// @tparam Element float or kvcache::half
template <class Element>
KVCACHE_HOST_DEVICE inline Element from_float(float value) noexcept {
    return element_traits<Element>::from_float(value);
}

/// Bytes of one element of the given kind.
inline constexpr int element_size(element_kind kind) noexcept { return kind == element_kind::fp32 ? 4 : 2; }

}  // namespace kvcache
