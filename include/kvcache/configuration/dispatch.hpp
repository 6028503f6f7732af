// The runtime dispatcher: walks a compile-time list of configurations,
// compares each with the runtime (layout, element, heads) and calls a generic
// function with the matching one; an unknown configuration is an error that
// lists every supported one. A configuration whose head counts are compiled
// wins; one with dynamic counts (and the same layout, element type and head
// dimension) serves every other shape.
#pragma once

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kvcache/configuration/configuration.hpp"
#include "kvcache/core/error.hpp"

namespace kvcache {

/// "contiguous/fp32/8q/2kv/d64, paged/fp16/dynamic/d128, ..." for every configuration of the list.
/// @tparam Configurations type_list of configuration
template <class... Configurations>
std::string describe(type_list<Configurations...>) {
    std::string text;
    ((text += (text.empty() ? "" : ", ") + name_of<Configurations>()), ...);
    return text.empty() ? "none" : text;
}

/// True when a configuration of the list runs the runtime configuration
/// (compiled for its head counts, or with dynamic ones).
/// @tparam Configurations type_list of configuration
template <class... Configurations>
bool supports(type_list<Configurations...>, const runtime_configuration& wanted) {
    return (runs<Configurations>(wanted) || ...);
}

/// True when the list holds a configuration compiled for exactly these head
/// counts: what runs at full speed (otherwise a dynamic one may run it).
/// @tparam Configurations type_list of configuration
template <class... Configurations>
bool compiled_for(type_list<Configurations...>, const runtime_configuration& wanted) {
    return ((Configurations::heads::static_counts && runs<Configurations>(wanted)) || ...);
}

namespace detail {

template <class T>
struct type_identity_tag {
    using type = T;
};

template <class List>
[[noreturn]] void unsupported(List list, const runtime_configuration& wanted) {
    throw_error(error_code::unsupported_configuration, "no compiled configuration for ", wanted.to_string(),
                "; supported: ", describe(list));
}

/// Calls function with the first configuration of the pack that runs `wanted`
/// and whose counts are compiled (Static) or dynamic (!Static); false when none.
template <bool Static, class Result, class Function, class... Configurations>
bool call_first(const runtime_configuration& wanted, Function& function, Result* result) {
    bool done = false;
    const auto try_one = [&](auto tag) {
        using candidate = typename decltype(tag)::type;
        if (done || candidate::heads::static_counts != Static || !runs<candidate>(wanted)) return;
        candidate config{};
        if constexpr (!Static) config.counts = typename candidate::heads(wanted.heads);
        if constexpr (std::is_void_v<Result>) {
            function(config);
        } else {
            *result = function(config);
        }
        done = true;
    };
    (try_one(type_identity_tag<Configurations>{}), ...);
    return done;
}

}  // namespace detail

/// Calls function(Configuration{...}) for the configuration of the list that
/// runs `wanted` — one compiled for its head counts if the list has it, else
/// the first one with dynamic counts, whose object then carries the counts
/// (config.head_counts()) — and returns its result (every configuration's call
/// must return the same type, default-constructible when not void). Throws
/// error_code::unsupported_configuration naming `wanted` and listing the
/// supported configurations when none runs it, and invalid_argument when its
/// head shape breaks a rule (head_shape::validate).
/// @tparam Configurations type_list of configuration
/// @tparam Function a generic callable taking a configuration by value
template <class... Configurations, class Function>
decltype(auto) dispatch(type_list<Configurations...> list, const runtime_configuration& wanted, Function&& function) {
    static_assert(sizeof...(Configurations) > 0, "kvcache::dispatch needs at least one configuration");
    using first = std::tuple_element_t<0, std::tuple<Configurations...>>;
    using result = std::invoke_result_t<Function&, first>;
    static_assert((std::is_same_v<result, std::invoke_result_t<Function&, Configurations>> && ...),
                  "kvcache::dispatch: the function must return the same type for every configuration");
    wanted.heads.validate();
    if constexpr (std::is_void_v<result>) {
        if (detail::call_first<true, void, Function, Configurations...>(wanted, function, nullptr)) return;
        if (detail::call_first<false, void, Function, Configurations...>(wanted, function, nullptr)) return;
        detail::unsupported(list, wanted);
    } else {
        static_assert(std::is_default_constructible_v<result>,
                      "kvcache::dispatch: a non-void result must be default-constructible");
        result value{};
        if (detail::call_first<true, result, Function, Configurations...>(wanted, function, &value)) return value;
        if (detail::call_first<false, result, Function, Configurations...>(wanted, function, &value)) return value;
        detail::unsupported(list, wanted);
    }
}

}  // namespace kvcache
