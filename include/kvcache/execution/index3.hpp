// Grid and block coordinates shared by the device and the emulated contexts.
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"

namespace kvcache {

/// A 3-D index or extent (CUDA's dim3 with signed members, so kernel
/// arithmetic on it does not mix signedness).
struct index3 {
    int x = 1;  ///< fastest-varying coordinate
    int y = 1;  ///< middle coordinate
    int z = 1;  ///< slowest-varying coordinate
};

/// The number of cells of an extent (x * y * z).
KVCACHE_HOST_DEVICE constexpr std::size_t volume(index3 extent) noexcept {
    return static_cast<std::size_t>(extent.x) * static_cast<std::size_t>(extent.y) *
           static_cast<std::size_t>(extent.z);
}

/// The row-major linear number of `at` inside `extent` (x fastest), as CUDA numbers blocks.
KVCACHE_HOST_DEVICE constexpr std::size_t linear_index(index3 at, index3 extent) noexcept {
    return (static_cast<std::size_t>(at.z) * static_cast<std::size_t>(extent.y) + static_cast<std::size_t>(at.y)) *
               static_cast<std::size_t>(extent.x) +
           static_cast<std::size_t>(at.x);
}

}  // namespace kvcache
