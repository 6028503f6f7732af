// Turns CUDA runtime failures into kvcache::error with the call site.
#pragma once

#include "kvcache/core/config.hpp"
#include "kvcache/core/error.hpp"

#if KVCACHE_HAS_CUDA_RUNTIME
#include <cuda_runtime_api.h>

namespace kvcache {
namespace detail {

/// Throws error_code::cuda_error (out_of_memory for cudaErrorMemoryAllocation)
/// naming the failed expression, the CUDA error and where it was called.
inline void check_cuda(cudaError_t status, const char* expression, const char* file, int line) {
    if (status == cudaSuccess) return;
    const error_code code = status == cudaErrorMemoryAllocation ? error_code::out_of_memory : error_code::cuda_error;
    throw_error(code, expression, " failed with ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
                ") at ", file, ":", line);
}

}  // namespace detail
}  // namespace kvcache

/// Checks a CUDA runtime call and throws kvcache::error naming it on failure.
#define KVCACHE_CUDA_CHECK(call) ::kvcache::detail::check_cuda((call), #call, __FILE__, __LINE__)

#endif  // KVCACHE_HAS_CUDA_RUNTIME
