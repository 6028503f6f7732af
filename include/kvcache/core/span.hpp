// A minimal non-owning view of a contiguous array, usable on host and device
// (std::span is C++20 and not device-callable).
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"

namespace kvcache {

/// Pointer plus length; no bounds checks on the device path.
/// @tparam T element type (may be const)
template <class T>
struct span {
    T* pointer = nullptr;    ///< first element
    std::size_t count = 0;   ///< number of elements

    KVCACHE_HOST_DEVICE constexpr T* data() const noexcept { return pointer; }
    KVCACHE_HOST_DEVICE constexpr std::size_t size() const noexcept { return count; }
    KVCACHE_HOST_DEVICE constexpr bool empty() const noexcept { return count == 0; }
    KVCACHE_HOST_DEVICE constexpr T& operator[](std::size_t i) const noexcept { return pointer[i]; }
    KVCACHE_HOST_DEVICE constexpr T* begin() const noexcept { return pointer; }
    KVCACHE_HOST_DEVICE constexpr T* end() const noexcept { return pointer + count; }
};

}  // namespace kvcache
