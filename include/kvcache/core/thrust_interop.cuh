// Views over Thrust device vectors, for users who already hold their tensors
// in thrust::device_vector. CUDA compilers only.
#pragma once

#include <thrust/device_vector.h>

#include "kvcache/core/span.hpp"

namespace kvcache {

/// A kvcache::span over a thrust::device_vector's storage (no copy).
/// @tparam T element type
/// @tparam Allocator the vector's allocator
template <class T, class Allocator>
span<T> device_span(thrust::device_vector<T, Allocator>& vector) {
    return {thrust::raw_pointer_cast(vector.data()), vector.size()};
}

/// A read-only kvcache::span over a thrust::device_vector's storage.
/// @tparam T element type
/// @tparam Allocator the vector's allocator
template <class T, class Allocator>
span<const T> device_span(const thrust::device_vector<T, Allocator>& vector) {
    return {thrust::raw_pointer_cast(vector.data()), vector.size()};
}

}  // namespace kvcache
