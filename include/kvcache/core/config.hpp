// Compiler and platform switches shared by every kvcache header.
#pragma once

/// Marks functions callable from host and device code; expands to nothing
/// when the translation unit is not compiled by a CUDA compiler.
#if defined(__CUDACC__)
#define KVCACHE_HOST_DEVICE __host__ __device__
#define KVCACHE_DEVICE __device__
#define KVCACHE_FORCE_INLINE __forceinline__
#else
#define KVCACHE_HOST_DEVICE
#define KVCACHE_DEVICE
#define KVCACHE_FORCE_INLINE inline __attribute__((always_inline))
#endif

/// True while compiling device code (the device pass of nvcc).
#if defined(__CUDA_ARCH__)
#define KVCACHE_DEVICE_PASS 1
#else
#define KVCACHE_DEVICE_PASS 0
#endif

/// The CUDA runtime API is usable when compiling with nvcc, or when the CUDA
/// include directory is on the path (a host target that links CUDA::cudart).
/// Define KVCACHE_NO_CUDA_RUNTIME to opt out.
#if !defined(KVCACHE_NO_CUDA_RUNTIME) && (defined(__CUDACC__) || __has_include(<cuda_runtime_api.h>))
#define KVCACHE_HAS_CUDA_RUNTIME 1
#else
#define KVCACHE_HAS_CUDA_RUNTIME 0
#endif

namespace kvcache {

/// The library version; kept equal to the CMake project version.
struct version {
    static constexpr int major = 0;
    static constexpr int minor = 1;
    static constexpr int patch = 0;
};

}  // namespace kvcache
