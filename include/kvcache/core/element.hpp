// Element types the cache can store, and their properties as traits.
#pragma once

#include <cstring>
#include <type_traits>

#include "kvcache/core/bfloat16.hpp"
#include "kvcache/core/config.hpp"
#include "kvcache/core/float8.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/core/stored_row.hpp"

namespace kvcache {

/// Runtime tag of a storage element type (for dispatch, files and messages).
/// The values are the ones save files record, so they never change.
enum class element_kind : int { fp32 = 0, fp16 = 1, bf16 = 2, fp8_e4m3 = 3, fp8_e5m2 = 4, int8 = 5, int4 = 6 };

/// The name of an element kind: "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8" or "int4"
/// ("unknown" for a value outside the enum).
inline const char* to_string(element_kind kind) noexcept {
    switch (kind) {
    case element_kind::fp32: return "fp32";
    case element_kind::fp16: return "fp16";
    case element_kind::bf16: return "bf16";
    case element_kind::fp8_e4m3: return "fp8_e4m3";
    case element_kind::fp8_e5m2: return "fp8_e5m2";
    case element_kind::int8: return "int8";
    case element_kind::int4: return "int4";
    }
    return "unknown";
}

/// True for a value of element_kind that names a type (a file may hold any integer).
inline constexpr bool is_element_kind(int value) noexcept {
    return value >= int(element_kind::fp32) && value <= int(element_kind::int4);
}

/// Properties of a storage element type.
/// @tparam Element float, kvcache::half, kvcache::bfloat16, kvcache::float8_e4m3, kvcache::float8_e5m2 or kvcache::qint8
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

/// Both fp8 encodings: the kind and name follow the encoding (e5m2 is the one with infinities).
/// @tparam Encoding detail::e4m3_encoding or detail::e5m2_encoding
template <class Encoding>
struct element_traits<detail::fp8<Encoding>> {
    static constexpr element_kind kind = Encoding::has_infinity ? element_kind::fp8_e5m2 : element_kind::fp8_e4m3;
    static constexpr const char* name = Encoding::has_infinity ? "fp8_e5m2" : "fp8_e4m3";
    KVCACHE_HOST_DEVICE static float to_float(detail::fp8<Encoding> value) noexcept { return static_cast<float>(value); }
    KVCACHE_HOST_DEVICE static detail::fp8<Encoding> from_float(float value) noexcept { return detail::fp8<Encoding>(value); }
};

/// int8 with a per-row scale: to_float gives the value's own integer (unscaled,
/// like fp8); from_float rounds to nearest even and clamps to [-127, 127]
/// (quantise_row chooses the scale that makes a row fit).
template <>
struct element_traits<qint8> {
    static constexpr element_kind kind = element_kind::int8;
    static constexpr const char* name = "int8";
    KVCACHE_HOST_DEVICE static float to_float(qint8 value) noexcept { return static_cast<float>(value.bits); }
    KVCACHE_HOST_DEVICE static qint8 from_float(float value) noexcept {
        float q = ::rintf(value);
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        return qint8{static_cast<std::int8_t>(q == q ? q : 0.0f)};
    }
};

/// int4 in groups of 32 with a half scale and minimum each: a kind and a name
/// only. There is no to_float or from_float, because one byte holds two values
/// and a value needs its group's record: code reads rows through qint4_value
/// (core/int4.hpp), and a generic loop that indexes a qint4 row by d does not compile.
template <>
struct element_traits<qint4> {
    static constexpr element_kind kind = element_kind::int4;
    static constexpr const char* name = "int4";
};

/// True for the types queries, outputs and new K/V rows come in (float, half,
/// bfloat16): what attention reads and writes besides the cache.
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_activation_element_v =
    std::is_same_v<Element, float> || std::is_same_v<Element, half> || std::is_same_v<Element, bfloat16>;

/// True for the one-byte float types (fp8 e4m3 and e5m2). They are stored with
/// a scale (kv_scales): a stored value v means float(v) * scale.
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_scaled_element_v = std::is_same_v<Element, float8_e4m3> || std::is_same_v<Element, float8_e5m2>;

/// The activation type (queries, outputs, new rows) that goes with a stored
/// element type where one must be chosen (the CUDA instantiations): the type
/// itself for float, half and bfloat16; half for fp8 and int8, whose caches
/// sit under 16-bit activations.
/// @tparam Element a stored element type
template <class Element>
struct default_activation {
    using type = Element;
};
/// @tparam Encoding detail::e4m3_encoding or detail::e5m2_encoding
template <class Encoding>
struct default_activation<detail::fp8<Encoding>> {
    using type = half;
};
/// int8 caches sit under 16-bit activations, as fp8 ones do.
template <>
struct default_activation<qint8> {
    using type = half;
};
/// int4 caches sit under 16-bit activations, as int8 ones do.
template <>
struct default_activation<qint4> {
    using type = half;
};
/// default_activation's type.
/// @tparam Element a stored element type
template <class Element>
using default_activation_t = typename default_activation<Element>::type;

/// True for the element types kvcache stores: the activation types and fp8.
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_element_v = is_activation_element_v<Element> || is_scaled_element_v<Element>;

/// True for every element type a cache stores: is_element_v's and the
/// row-quantised qint8 and qint4 (is_row_quantised_v).
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_stored_element_v = is_element_v<Element> || is_row_quantised_v<Element>;

/// True for the 16-bit element types (half, bfloat16): stored as raw bits and widened on load.
/// @tparam Element candidate element type
template <class Element>
inline constexpr bool is_16bit_element_v = std::is_same_v<Element, half> || std::is_same_v<Element, bfloat16>;

/// Widens a stored element to float (unscaled: an fp8 value's own number).
/// @tparam Element a type is_element_v accepts
template <class Element>
KVCACHE_HOST_DEVICE inline float to_float(Element value) noexcept {
    return element_traits<Element>::to_float(value);
}

/// Narrows a float to a stored element: round to nearest even for half, bfloat16
/// and fp8; fp8 saturates at its largest finite value (unscaled).
/// @tparam Element a type is_element_v accepts
template <class Element>
KVCACHE_HOST_DEVICE inline Element from_float(float value) noexcept {
    return element_traits<Element>::from_float(value);
}

/// Narrows a float to a stored element with its scale: value / scale for fp8
/// (then rounded and saturated as from_float), plain from_float otherwise.
/// @tparam Element a type is_element_v accepts
template <class Element>
KVCACHE_HOST_DEVICE inline Element from_float_scaled(float value, float scale) noexcept {
    if constexpr (is_scaled_element_v<Element>) return from_float<Element>(value / scale);
    else return from_float<Element>(value);
}

/// Widens a stored element with its scale: float(value) * scale for fp8, plain to_float otherwise.
/// @tparam Element a type is_element_v accepts
template <class Element>
KVCACHE_HOST_DEVICE inline float to_float_scaled(Element value, float scale) noexcept {
    if constexpr (is_scaled_element_v<Element>) return to_float(value) * scale;
    else return to_float(value);
}

/// Writes one row of head_dim values (value(d) gives value d as a float) as
/// Element stores it: quantise_row for qint8 and qint4 (the row's own
/// scales), else each value narrowed with from_float_scaled (fp8 divided by
/// layer_scale). What every host append writes, so all of them write the same bytes.
/// @tparam Element a stored element type (is_stored_element_v)
/// @tparam Value a callable int -> float
template <class Element, class Value>
inline void store_row(Value&& value, int head_dim, float layer_scale, Element* out) noexcept {
    if constexpr (is_row_quantised_v<Element>) {
        (void)layer_scale;
        quantise_row(value, head_dim, out);
    } else {
        for (int d = 0; d < head_dim; ++d) out[d] = from_float_scaled<Element>(value(d), layer_scale);
    }
}

/// Widens one stored row of head_dim values to float, as attention reads it:
/// an fp8 row's values times the layer scale, an int8 row's times its own
/// scale, an int4 row's group minimum + code * scale, the 16- and 32-bit types'
/// values as they are (layer_scale is 1 for every type but fp8).
/// @tparam Element a stored element type (is_stored_element_v)
template <class Element>
KVCACHE_HOST_DEVICE inline void widen_row(const Element* row, int head_dim, float layer_scale, float* out) noexcept {
    if constexpr (std::is_same_v<std::remove_cv_t<Element>, qint4>) {
        (void)layer_scale;
        for (int d = 0; d < head_dim; ++d) out[d] = qint4_value(row, head_dim, d);
    } else if constexpr (std::is_same_v<std::remove_cv_t<Element>, qint8>) {
        (void)layer_scale;
        const float scale = row_scale_of(row, head_dim);
        for (int d = 0; d < head_dim; ++d) out[d] = float(row[d].bits) * scale;
    } else {
        for (int d = 0; d < head_dim; ++d) out[d] = to_float_scaled(row[d], layer_scale);
    }
}

/// Bytes of one stored element of the given kind (an int4 element is a byte
/// holding two values: stored_row_bytes gives what a row really takes).
inline constexpr int element_size(element_kind kind) noexcept {
    return kind == element_kind::fp32 ? 4
           : (kind == element_kind::fp8_e4m3 || kind == element_kind::fp8_e5m2 || kind == element_kind::int8 ||
              kind == element_kind::int4)
               ? 1
               : 2;
}

/// Bytes one stored K or V row of head_dim values takes for the given kind:
/// head_dim elements, plus an int8 row's own float scale (core/int8.hpp); for
/// int4 the packed codes and a 4-byte record per group of 32 (core/int4.hpp).
inline constexpr int stored_row_bytes(element_kind kind, int head_dim) noexcept {
    if (kind == element_kind::int4) return qint4_row_bytes(head_dim);
    return element_size(kind) * head_dim + (kind == element_kind::int8 ? qint8_scale_bytes : 0);
}

/// True for the kinds stored with a scale (fp8).
inline constexpr bool is_scaled_kind(element_kind kind) noexcept {
    return kind == element_kind::fp8_e4m3 || kind == element_kind::fp8_e5m2;
}

/// The element kind a name gives ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2",
/// "int8", "int4"; also "float", "half", "bfloat16", "e4m3", "e5m2", and "fp8" for e4m3,
/// the engines' usual fp8 cache); false when the name is none of them.
inline bool parse_element_kind(const char* name, element_kind& kind) noexcept {
    const auto is = [name](const char* candidate) { return std::strcmp(name, candidate) == 0; };
    if (is("fp32") || is("float")) {
        kind = element_kind::fp32;
    } else if (is("fp16") || is("half")) {
        kind = element_kind::fp16;
    } else if (is("bf16") || is("bfloat16")) {
        kind = element_kind::bf16;
    } else if (is("fp8_e4m3") || is("e4m3") || is("fp8")) {
        kind = element_kind::fp8_e4m3;
    } else if (is("fp8_e5m2") || is("e5m2")) {
        kind = element_kind::fp8_e5m2;
    } else if (is("int8")) {
        kind = element_kind::int8;
    } else if (is("int4")) {
        kind = element_kind::int4;
    } else {
        return false;
    }
    return true;
}

/// The scales of one layer's K and V in a cache of fp8 elements: a stored key k
/// means float(k) * key, a stored value v float(v) * value. One pair per layer
/// (per tensor), as fp8 checkpoints ship k_scale and v_scale. Types stored
/// without a scale keep 1 and 1.
struct kv_scales {
    float key = 1.0f;    ///< multiplies every stored key of the layer
    float value = 1.0f;  ///< multiplies every stored value of the layer
};

}  // namespace kvcache
