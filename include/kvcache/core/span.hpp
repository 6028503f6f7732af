// A minimal non-owning view of a contiguous array, usable on host and device
// (std::span is C++20 and not device-callable). The library's calls take
// spans, not bare pointers, so that every buffer arrives with its size and a
// short one is an error instead of an overflow.
#pragma once

#include <cstddef>
#include <iterator>
#include <type_traits>
#include <utility>

#include "kvcache/core/config.hpp"

namespace kvcache {

/// Pointer plus length; no bounds checks in operator[] (the library checks
/// sizes once per call, not per element).
/// @tparam T element type (may be const)
template <class T>
struct span {
    T* pointer = nullptr;    ///< first element
    std::size_t count = 0;   ///< number of elements

    constexpr span() noexcept = default;
    /// count elements from pointer.
    KVCACHE_HOST_DEVICE constexpr span(T* first, std::size_t size) noexcept : pointer(first), count(size) {}
    /// A span of const T from a span of T.
    template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
    KVCACHE_HOST_DEVICE constexpr span(span<U> other) noexcept : pointer(other.pointer), count(other.count) {}
    /// The elements of a contiguous container (std::vector, std::array, host_buffer, ...).
    template <class Container,
              class = std::enable_if_t<!std::is_same_v<std::remove_cv_t<std::remove_reference_t<Container>>, span> &&
                                       std::is_convertible_v<std::remove_pointer_t<decltype(std::declval<Container&>().data())> (*)[],
                                                             T (*)[]>>,
              class = decltype(std::declval<Container&>().size())>
    constexpr span(Container& container) noexcept : pointer(container.data()), count(container.size()) {}
    /// The elements of an array.
    template <std::size_t N>
    constexpr span(T (&array)[N]) noexcept : pointer(array), count(N) {}

    KVCACHE_HOST_DEVICE constexpr T* data() const noexcept { return pointer; }
    KVCACHE_HOST_DEVICE constexpr std::size_t size() const noexcept { return count; }
    KVCACHE_HOST_DEVICE constexpr bool empty() const noexcept { return count == 0; }
    KVCACHE_HOST_DEVICE constexpr T& operator[](std::size_t i) const noexcept { return pointer[i]; }
    KVCACHE_HOST_DEVICE constexpr T* begin() const noexcept { return pointer; }
    KVCACHE_HOST_DEVICE constexpr T* end() const noexcept { return pointer + count; }
    /// The count elements from offset (unchecked, like operator[]).
    KVCACHE_HOST_DEVICE constexpr span subspan(std::size_t offset, std::size_t size) const noexcept {
        return span(pointer + offset, size);
    }
};

template <class Container>
span(Container&) -> span<std::remove_pointer_t<decltype(std::declval<Container&>().data())>>;

namespace detail {

template <class Range, class = void>
struct is_sized_range : std::false_type {};
template <class Range>
struct is_sized_range<Range, std::void_t<decltype(std::data(std::declval<Range&>())), decltype(std::size(std::declval<Range&>()))>>
    : std::is_pointer<decltype(std::data(std::declval<Range&>()))> {};

/// The element type of a buffer argument (a span or a contiguous container).
/// @tparam Range the argument's type
template <class Range>
using range_element_t = std::remove_const_t<std::remove_pointer_t<decltype(std::data(std::declval<Range&>()))>>;

}  // namespace detail

/// True for what the library's calls accept as a buffer: a span, a
/// contiguous container with data() and size(), or an array. A bare pointer is not one.
/// @tparam Range the argument's type
template <class Range>
inline constexpr bool is_sized_range_v = detail::is_sized_range<std::remove_reference_t<Range>>::value;

/// The span of a sized range (a span stays itself).
/// @tparam Range a span, a contiguous container or an array
template <class Range>
constexpr auto make_span(Range&& range) noexcept {
    static_assert(is_sized_range_v<Range>,
                  "kvcache: pass a buffer with its size (kvcache::span{pointer, count}, std::vector, host_buffer, "
                  "device_buffer); a bare pointer has no size to check");
    return span<std::remove_pointer_t<decltype(std::data(range))>>(std::data(range), std::size(range));
}

}  // namespace kvcache
