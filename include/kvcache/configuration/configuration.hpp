// Compile-time configurations (layout x element type x head configuration)
// as types, and lists of them, so one generic mechanism both chooses what is
// instantiated and maps runtime values onto it.
#pragma once

#include <string>
#include <type_traits>

#include "kvcache/core/bfloat16.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/layout.hpp"

namespace kvcache {

/// A list of types.
/// @tparam Types the members
template <class... Types>
struct type_list {
    static constexpr int size = int(sizeof...(Types));
};

/// A layout family, as a type: view<Element, Heads> is its view type.
/// @tparam View a view template over (element, heads)
template <template <class, class> class View>
struct layout_family {
    /// @tparam Element element type  @tparam Heads head_config
    template <class Element, class Heads>
    using view = View<Element, Heads>;
};

using contiguous_layout = layout_family<contiguous_view>;          ///< the contiguous family
namespace detail {
template <class Element, class Heads>
using head_major_paged_view = paged_view<Element, Heads>;
}  // namespace detail
using paged_layout = layout_family<detail::head_major_paged_view>;  ///< the paged family (head-major pages)
using sliding_window_layout = layout_family<sliding_window_view>;  ///< the sliding-window family

/// One compiled configuration. An object of it carries the head counts:
/// empty for compiled counts, the runtime values the dispatcher matched for
/// a dynamic head configuration (read them with head_counts()).
/// @tparam Layout a layout_family
/// @tparam Element a stored element type (float, kvcache::half, kvcache::bfloat16, fp8, kvcache::qint8,
///         kvcache::qint4) or a kv_elements pair
/// @tparam Heads a head_config (counts compiled or kvcache::dynamic)
template <class Layout, class Element, class Heads>
struct configuration {
    using layout = Layout;
    using element = Element;
    using heads = Heads;
    using view = typename Layout::template view<Element, Heads>;  ///< the layout view type

    Heads counts{};  ///< the head counts this configuration runs with

    /// The head configuration object to build caches and views with.
    constexpr const Heads& head_counts() const noexcept { return counts; }
};

/// A configuration as runtime values, as a caller knows it from a model file.
struct runtime_configuration {
    layout_kind layout = layout_kind::paged;
    kv_kinds element = element_kind::fp16;  ///< what keys and values are stored as (one kind, or a kind each)
    head_shape heads{};

    /// "paged/fp16/32q/8kv/d128" ("paged/int8+int4/..." for int8 keys and int4 values)
    std::string to_string() const {
        return std::string(kvcache::to_string(layout)) + "/" + element.to_string() + "/" + heads.to_string();
    }
    friend bool operator==(const runtime_configuration& a, const runtime_configuration& b) noexcept {
        return a.layout == b.layout && a.element == b.element && a.heads == b.heads;
    }
};

/// The runtime description of a configuration with compiled counts.
/// @tparam Configuration a configuration whose heads have static counts
template <class Configuration>
runtime_configuration runtime_of() {
    using view = typename Configuration::view;
    return {view::kind, kinds_of<typename Configuration::element>(), shape_of<typename Configuration::heads>()};
}

/// True when the configuration can run `wanted`: its layout, element type and
/// head dimension agree, and each head count is either compiled equal or dynamic.
/// @tparam Configuration a configuration
template <class Configuration>
bool runs(const runtime_configuration& wanted) {
    using view = typename Configuration::view;
    using heads = typename Configuration::heads;
    if (view::kind != wanted.layout || kinds_of<typename Configuration::element>() != wanted.element ||
        heads::head_dim != wanted.heads.head_dim)
        return false;
    if constexpr (heads::static_counts) {
        return shape_of<heads>() == wanted.heads;
    } else {
        const heads unset{};  // a statically given count sits in the default object; a dynamic one reads 0
        return (unset.query_heads() == 0 || unset.query_heads() == wanted.heads.query_heads) &&
               (unset.kv_heads() == 0 || unset.kv_heads() == wanted.heads.kv_heads);
    }
}

/// "paged/fp16/32q/8kv/d128", or "paged/fp16/dynamic/d128" for runtime counts.
/// @tparam Configuration a configuration
template <class Configuration>
std::string name_of() {
    using heads = typename Configuration::heads;
    if constexpr (heads::static_counts) {
        return runtime_of<Configuration>().to_string();
    } else {
        using view = typename Configuration::view;
        const heads unset{};
        const auto count = [](int n, const char* unit) {
            return (n == 0 ? std::string("dynamic") : std::to_string(n)) + unit;
        };
        return std::string(kvcache::to_string(view::kind)) + "/" +
               kinds_of<typename Configuration::element>().to_string() + "/" +
               count(unset.query_heads(), "q/") + count(unset.kv_heads(), "kv/d") + std::to_string(heads::head_dim);
    }
}

namespace detail {

template <class... Lists>
struct concat_lists;
template <>
struct concat_lists<> {
    using type = type_list<>;
};
template <class... A>
struct concat_lists<type_list<A...>> {
    using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat_lists<type_list<A...>, type_list<B...>, Rest...> {
    using type = typename concat_lists<type_list<A..., B...>, Rest...>::type;
};

template <class Layout, class Element, class HeadsList>
struct heads_row;
template <class Layout, class Element, class... Heads>
struct heads_row<Layout, Element, type_list<Heads...>> {
    using type = type_list<configuration<Layout, Element, Heads>...>;
};

template <class Layout, class ElementList, class HeadsList>
struct element_rows;
template <class Layout, class... Elements, class HeadsList>
struct element_rows<Layout, type_list<Elements...>, HeadsList> {
    using type = typename concat_lists<typename heads_row<Layout, Elements, HeadsList>::type...>::type;
};

template <class LayoutList, class ElementList, class HeadsList>
struct product;
template <class... Layouts, class ElementList, class HeadsList>
struct product<type_list<Layouts...>, ElementList, HeadsList> {
    using type = typename concat_lists<typename element_rows<Layouts, ElementList, HeadsList>::type...>::type;
};

}  // namespace detail

/// Concatenation of type_lists.
/// @tparam Lists type_lists
template <class... Lists>
using concat_t = typename detail::concat_lists<Lists...>::type;

/// Every configuration of the cross product, layouts outermost.
/// @tparam Layouts type_list of layout families
/// @tparam Elements type_list of element types
/// @tparam Heads type_list of head_configs
template <class Layouts, class Elements, class Heads>
using configuration_product_t = typename detail::product<Layouts, Elements, Heads>::type;

/// All three layout families.
using all_layouts = type_list<contiguous_layout, paged_layout, sliding_window_layout>;

/// The 16- and 32-bit storage element types (those activations come in too).
using all_elements = type_list<float, half, bfloat16>;

/// The fp8 storage element types (stored with per-layer kv_scales).
using fp8_elements = type_list<float8_e4m3, float8_e5m2>;

/// Every storage element type: all_elements, fp8_elements, int8 (qint8, a
/// float scale per row) and int4 (qint4, a half scale and minimum per group of 32).
using cache_elements = type_list<float, half, bfloat16, float8_e4m3, float8_e5m2, qint8, qint4>;

/// The K/V pairs compiled where every storage type is (the engine's lists,
/// dynamic_configurations): 16-bit keys over int8 or int4 values, and int8
/// keys over int4 values, llama.cpp's usual -ctk/-ctv choices (keys are the
/// more sensitive side). Any other pair is a kv_elements type of the caller's.
using kv_element_pairs =
    type_list<kv_elements<half, qint8>, kv_elements<half, qint4>, kv_elements<qint8, qint4>>;

/// cache_elements and kv_element_pairs: everything the dispatcher's default lists store.
using cache_element_choices = type_list<float, half, bfloat16, float8_e4m3, float8_e5m2, qint8, qint4,
                                        kv_elements<half, qint8>, kv_elements<half, qint4>, kv_elements<qint8, qint4>>;

/// Dynamic head counts for the head dimensions public checkpoints use
/// (64: GPT-2, TinyLlama; 80: Phi-2; 96: Phi-3; 128: Llama, Mistral, Qwen;
/// 256: Gemma): with these, any head count of those dimensions runs.
using dynamic_head_dims = type_list<dynamic_heads<64>, dynamic_heads<80>, dynamic_heads<96>, dynamic_heads<128>,
                                    dynamic_heads<256>>;

}  // namespace kvcache
