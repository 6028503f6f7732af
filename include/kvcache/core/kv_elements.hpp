// Keys and values stored in different types (llama.cpp's -ctk / -ctv): a
// pair type that stands where a cache, view or kernel takes its Element, and
// the traits that give each side's type. A plain element type is its own pair,
// so code written against key_element_t / value_element_t serves both.
#pragma once

#include <string>
#include <type_traits>

#include "kvcache/core/element.hpp"

namespace kvcache {

/// The Element of a cache whose keys are stored as Key and values as Value,
/// e.g. kv_elements<qint8, qint4>: int8 keys (keys are the more sensitive
/// side) and int4 values. Each side is any stored element type; they differ
/// (a cache of one type takes that type itself).
/// @tparam Key the stored type of keys
/// @tparam Value the stored type of values
template <class Key, class Value>
struct kv_elements {
    static_assert(is_stored_element_v<Key> && is_stored_element_v<Value>,
                  "kvcache::kv_elements: each side is a stored element type (float, half, bfloat16, fp8, qint8, qint4)");
    static_assert(!std::is_same_v<Key, Value>, "kvcache::kv_elements<T, T>: a cache of one type takes T itself");
    using key_type = Key;      ///< what keys are stored as
    using value_type = Value;  ///< what values are stored as
};

namespace detail {
template <class Element>
struct kv_sides {
    using key = Element;
    using value = Element;
    static constexpr bool pair = false;
};
template <class Key, class Value>
struct kv_sides<kv_elements<Key, Value>> {
    using key = Key;
    using value = Value;
    static constexpr bool pair = true;
};
template <class Key, class Value>
struct kv_sides<const kv_elements<Key, Value>> {
    using key = const Key;
    using value = const Value;
    static constexpr bool pair = true;
};
}  // namespace detail

/// The stored type of keys: Key for kv_elements<Key, Value>, Element itself
/// otherwise (const kept: a read-only view's keys are const).
/// @tparam Element a stored element type or a kv_elements pair (possibly const)
template <class Element>
using key_element_t = typename detail::kv_sides<Element>::key;

/// The stored type of values: Value for kv_elements<Key, Value>, Element itself otherwise.
/// @tparam Element a stored element type or a kv_elements pair (possibly const)
template <class Element>
using value_element_t = typename detail::kv_sides<Element>::value;

/// A pair's activation type where one must be chosen (the CUDA
/// instantiations): its keys' (half for int8 or int4 keys, float for float ones).
/// @tparam Key the stored type of keys  @tparam Value the stored type of values
template <class Key, class Value>
struct default_activation<kv_elements<Key, Value>> {
    using type = default_activation_t<Key>;
};

/// True for a kv_elements pair (keys and values of different types).
/// @tparam Element candidate element type (possibly const)
template <class Element>
inline constexpr bool is_kv_pair_v = detail::kv_sides<Element>::pair;

/// True for what a cache can store: a stored element type, or a pair of two.
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_cache_element_v = is_kv_pair_v<Element> || is_stored_element_v<Element>;

/// True when either side's rows are quantised whole (qint8, qint4).
/// @tparam Element a stored element type or a kv_elements pair
template <class Element>
inline constexpr bool has_row_quantised_side_v =
    is_row_quantised_v<key_element_t<Element>> || is_row_quantised_v<value_element_t<Element>>;

/// True when either side is fp8, whose values are read through a layer's kv_scales.
/// @tparam Element a stored element type or a kv_elements pair
template <class Element>
inline constexpr bool has_scaled_side_v = is_scaled_element_v<std::remove_cv_t<key_element_t<Element>>> ||
                                          is_scaled_element_v<std::remove_cv_t<value_element_t<Element>>>;

/// The element kinds of a cache's keys and values at run time: equal for a
/// cache of one type. Converts from one element_kind (both sides alike).
struct kv_kinds {
    element_kind key = element_kind::fp32;    ///< what keys are stored as
    element_kind value = element_kind::fp32;  ///< what values are stored as

    constexpr kv_kinds() = default;
    /// Both sides of one kind.
    constexpr kv_kinds(element_kind both) noexcept : key(both), value(both) {}  // NOLINT: a kind is its own pair
    /// Keys of one kind, values of another.
    constexpr kv_kinds(element_kind key_kind, element_kind value_kind) noexcept : key(key_kind), value(value_kind) {}

    /// True when keys and values are stored in different types.
    constexpr bool mixed() const noexcept { return key != value; }
    /// "int8" for one kind, "int8+int4" (keys+values) for a pair.
    std::string to_string() const {
        return mixed() ? std::string(kvcache::to_string(key)) + "+" + kvcache::to_string(value)
                       : std::string(kvcache::to_string(key));
    }
    friend constexpr bool operator==(kv_kinds a, kv_kinds b) noexcept { return a.key == b.key && a.value == b.value; }
    friend constexpr bool operator!=(kv_kinds a, kv_kinds b) noexcept { return !(a == b); }
};

/// The kinds a name gives: one element kind's name (parse_element_kind's
/// names) for both sides, or "KEY+VALUE" (e.g. "int8+int4") for keys and
/// values of two kinds; false when either name is unknown. "fp16+fp16" reads as fp16.
inline bool parse_kv_kinds(const std::string& name, kv_kinds& kinds) noexcept {
    const std::size_t plus = name.find('+');
    element_kind key{}, value{};
    if (plus == std::string::npos) {
        if (!parse_element_kind(name.c_str(), key)) return false;
        kinds = kv_kinds(key);
        return true;
    }
    if (!parse_element_kind(name.substr(0, plus).c_str(), key) || !parse_element_kind(name.substr(plus + 1).c_str(), value))
        return false;
    kinds = kv_kinds(key, value);
    return true;
}

/// The kinds of a cache element type: element_traits' kind on both sides, or each side's.
/// @tparam Element a stored element type or a kv_elements pair (const ignored)
template <class Element>
constexpr kv_kinds kinds_of() noexcept {
    using key = std::remove_cv_t<key_element_t<Element>>;
    using value = std::remove_cv_t<value_element_t<Element>>;
    return kv_kinds(element_traits<key>::kind, element_traits<value>::kind);
}

/// "int8", or "int8+int4" for a pair: the name messages and dispatch give a cache element type.
/// @tparam Element a stored element type or a kv_elements pair
template <class Element>
std::string element_name() {
    return kinds_of<Element>().to_string();
}

/// Bytes one token's keys and values take in one layer, each row as stored
/// (int8's scale and int4's group records included).
inline constexpr long long stored_token_bytes(kv_kinds kinds, int kv_heads, int head_dim) noexcept {
    return (long long)kv_heads * (stored_row_bytes(kinds.key, head_dim) + stored_row_bytes(kinds.value, head_dim));
}

/// The u32 a file or an export records for the kinds: the key kind for a
/// cache of one type (the values every earlier file holds), else
/// key | (value + 1) << 8, which no build before pairs reads as a kind.
inline constexpr unsigned encode_kv_kinds(kv_kinds kinds) noexcept {
    return kinds.mixed() ? unsigned(kinds.key) | (unsigned(kinds.value) + 1u) << 8 : unsigned(kinds.key);
}

/// encode_kv_kinds read back; false for a value no build writes.
inline constexpr bool decode_kv_kinds(unsigned recorded, kv_kinds& kinds) noexcept {
    const unsigned key = recorded & 0xffu, value_plus_one = recorded >> 8;
    if (!is_element_kind(int(key)) || value_plus_one > 0xffu) return false;
    if (value_plus_one == 0) {
        kinds = kv_kinds(element_kind(key));
        return true;
    }
    if (!is_element_kind(int(value_plus_one - 1)) || value_plus_one - 1 == key) return false;
    kinds = kv_kinds(element_kind(key), element_kind(value_plus_one - 1));
    return true;
}

/// The name of a recorded kinds value: "int8", "int8+int4", or "unknown".
inline std::string recorded_kinds_name(unsigned recorded) {
    kv_kinds kinds;
    return decode_kv_kinds(recorded, kinds) ? kinds.to_string() : std::string("unknown");
}

}  // namespace kvcache
