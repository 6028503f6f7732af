// launch<Body>: runs a kernel body as a real CUDA kernel through one generic
// __global__ trampoline.
#pragma once

#include <cstddef>

#include "kvcache/core/config.hpp"
#include "kvcache/core/cuda_error.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/execution/context.hpp"
#include "kvcache/execution/device_context.cuh"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

namespace kvcache {
namespace detail {

/// The one __global__ function of kvcache: builds the device context and calls Body{}.
/// @tparam Body a kernel body (see kvcache/execution/context.hpp)
/// @tparam Params its trivially copyable params struct
template <class Body, class Params>
__global__ void __launch_bounds__(Body::block_threads) kernel_trampoline(Params params, std::size_t shared_bytes) {
    device_context<Body::block_threads> context(shared_bytes);
    Body{}(context, params);
}

}  // namespace detail

/// Launches Body over `grid` blocks of Body::block_threads threads with
/// `shared_bytes` of dynamic shared memory on `stream`. Raises the kernel's
/// shared-memory limit when more than 48 KiB is asked for; throws kvcache::error
/// for an impossible grid or a failed launch (asynchronous faults surface at
/// the next synchronising CUDA call, as with any kernel).
/// @tparam Body a kernel body (see kvcache/execution/context.hpp)
/// @tparam Params its trivially copyable params struct
template <class Body, class Params>
void launch(index3 grid, std::size_t shared_bytes, cudaStream_t stream, const Params& params) {
    detail::check_kernel_body<Body>();
    static_assert(valid_block_threads(Body::block_threads),
                  "Body::block_threads must be a positive multiple of 32 no larger than 1024");
    if (grid.x < 1 || grid.y < 1 || grid.z < 1)
        throw_error(error_code::invalid_argument, "kernel ", Body::name, ": grid (", grid.x, ",", grid.y, ",", grid.z,
                    ") must be at least 1 in each dimension");
    const auto kernel = &detail::kernel_trampoline<Body, Params>;
    if (shared_bytes > 48u * 1024u)
        KVCACHE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(shared_bytes)));
    kernel<<<dim3(static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y), static_cast<unsigned>(grid.z)),
             dim3(static_cast<unsigned>(Body::block_threads)), shared_bytes, stream>>>(params, shared_bytes);
    KVCACHE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvcache
#endif  // __CUDACC__
