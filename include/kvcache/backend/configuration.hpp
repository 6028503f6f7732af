// Compile-time configurations (layout x element type x head configuration)
// as types, and lists of them, so one generic mechanism both chooses what is
// instantiated and maps runtime values onto it.
#pragma once

#include <string>
#include <type_traits>

#include "kvcache/core/element.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/core/heads.hpp"
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
using paged_layout = layout_family<paged_view>;                    ///< the paged family
using sliding_window_layout = layout_family<sliding_window_view>;  ///< the sliding-window family

/// One compiled configuration.
/// @tparam Layout a layout_family
/// @tparam Element float or kvcache::half
/// @tparam Heads a head_config
template <class Layout, class Element, class Heads>
struct configuration {
    using layout = Layout;
    using element = Element;
    using heads = Heads;
    using view = typename Layout::template view<Element, Heads>;  ///< the layout view type
};

/// A configuration as runtime values, as a caller knows it from a model file.
struct runtime_configuration {
    layout_kind layout = layout_kind::paged;
    element_kind element = element_kind::fp16;
    head_shape heads{};

    /// "paged/fp16/32q/8kv/d128"
    std::string to_string() const {
        return std::string(kvcache::to_string(layout)) + "/" + kvcache::to_string(element) + "/" + heads.to_string();
    }
    friend bool operator==(const runtime_configuration& a, const runtime_configuration& b) noexcept {
        return a.layout == b.layout && a.element == b.element && a.heads == b.heads;
    }
};

/// The runtime description of a compile-time configuration.
/// @tparam Configuration a configuration
template <class Configuration>
runtime_configuration runtime_of() {
    using view = typename Configuration::view;
    return {view::kind, element_traits<typename Configuration::element>::kind, shape_of<typename Configuration::heads>()};
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

/// Both element types.
using all_elements = type_list<float, half>;

}  // namespace kvcache
