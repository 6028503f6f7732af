// The runtime dispatcher: walks a compile-time list of configurations,
// compares each with the runtime (layout, element, heads) and calls a generic
// function with the matching one; an unknown configuration is an error that
// lists every supported one.
#pragma once

#include <tuple>
#include <string>
#include <type_traits>
#include <utility>

#include "kvcache/backend/configuration.hpp"
#include "kvcache/core/error.hpp"

namespace kvcache {

/// "contiguous/fp32/8q/2kv/d64, paged/fp16/..." for every configuration of the list.
/// @tparam Configurations type_list of configuration
template <class... Configurations>
std::string describe(type_list<Configurations...>) {
    std::string text;
    ((text += (text.empty() ? "" : ", ") + runtime_of<Configurations>().to_string()), ...);
    return text.empty() ? "none" : text;
}

/// True when the configuration list contains the runtime configuration.
/// @tparam Configurations type_list of configuration
template <class... Configurations>
bool supports(type_list<Configurations...>, const runtime_configuration& wanted) {
    return ((runtime_of<Configurations>() == wanted) || ...);
}

namespace detail {

template <class List>
[[noreturn]] void unsupported(List list, const runtime_configuration& wanted) {
    throw_error(error_code::unsupported_configuration, "no compiled configuration for ", wanted.to_string(),
                "; supported: ", describe(list));
}

template <class List, class First, class... Rest, class Function>
decltype(auto) dispatch_from(List list, const runtime_configuration& wanted, Function& function) {
    if (runtime_of<First>() == wanted) return function(First{});
    if constexpr (sizeof...(Rest) == 0) {
        unsupported(list, wanted);
    } else {
        return dispatch_from<List, Rest...>(list, wanted, function);
    }
}

}  // namespace detail

/// Calls function(Configuration{}) for the first Configuration of the list
/// whose runtime description equals `wanted`, and returns its result (every
/// configuration's call must return the same type). Throws
/// error_code::unsupported_configuration naming `wanted` and listing the
/// supported configurations when none matches.
/// @tparam Configurations type_list of configuration
/// @tparam Function a generic callable taking a configuration by value
template <class... Configurations, class Function>
decltype(auto) dispatch(type_list<Configurations...> list, const runtime_configuration& wanted, Function&& function) {
    static_assert(sizeof...(Configurations) > 0, "kvcache::dispatch needs at least one configuration");
    using first = std::tuple_element_t<0, std::tuple<Configurations...>>;
    using result = std::invoke_result_t<Function&, first>;
    static_assert((std::is_same_v<result, std::invoke_result_t<Function&, Configurations>> && ...),
                  "kvcache::dispatch: the function must return the same type for every configuration");
    return detail::dispatch_from<type_list<Configurations...>, Configurations...>(list, wanted, function);
}

}  // namespace kvcache
