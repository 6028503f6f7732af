// The execution context: the only door from a kernel body to the SIMT machine.
//
// A kernel is written once as a body type and runs either as a real CUDA
// kernel (device_context, kvcache/execution/device_launch.cuh) or on the host
// under the SIMT emulator (emulated_context, kvcache/execution/emulator.hpp):
//
//   struct my_kernel {
//       static constexpr const char* name = "my_kernel";  // named in emulator faults
//       static constexpr int block_threads = 128;          // launch block size: multiple of 32, <= 1024
//       template <class Context>
//       KVCACHE_HOST_DEVICE void operator()(Context& ctx, const my_params& p) const;
//   };
//
// Blocks are 1-D, grids up to 3-D, params a trivially copyable struct passed
// by value. Inside a body call nothing from CUDA directly; use these members
// of Context (every context provides all of them):
//
//   static constexpr int warp_size = 32;
//   static constexpr bool is_emulated;          true under the emulator (for asserts, never for logic)
//   index3 block_index() const;                 blockIdx
//   index3 grid_size() const;                   gridDim
//   int thread_index() const;                   threadIdx.x, 0 .. block_threads-1
//   int block_size() const;                     blockDim.x == Body::block_threads
//   int lane() const;                           thread_index() % 32
//   int warp() const;                           thread_index() / 32
//   int warp_count() const;                     block_size() / 32
//   void sync_block();                          __syncthreads: every thread of the block must call it
//   bool sync_block_or(bool);                   __syncthreads_or: a barrier that also tells every thread
//                                               whether any thread's predicate was true
//   T shuffle_xor(T v, int lane_mask);          __shfl_xor_sync over the full warp (T of 4 or 8 bytes)
//   T shuffle_down(T v, int delta);             __shfl_down_sync; lanes past 31 keep their own v
//   T shuffle_index(T v, int source_lane);      __shfl_sync: v of lane source_lane % 32
//   bool warp_any(bool) / warp_all(bool);       __any_sync / __all_sync, full warp
//   unsigned warp_ballot(bool);                 __ballot_sync, bit i = lane i's predicate
//   float warp_sum(float) / warp_max(float);    warp reduction, result in every lane
//   float block_sum(float) / block_max(float);  block reduction, result in every thread;
//                                               contains its own barriers, every thread must call
//   shared_array<T>(byte_offset, count);        view of count T's of dynamic shared memory at
//                                               byte_offset; operator[] gives T& (bounds-checked
//                                               under the emulator); data(), size(). In a body
//                                               templated on Context write ctx.template shared_array<T>(...)
//   std::size_t shared_bytes() const;           the dynamic shared memory size given at launch
//   vector16 load16(const void* address);       16-byte load; address 16-byte aligned
//   void store16(void* address, const vector16&); 16-byte store; address 16-byte aligned
//   vector8 load8(const void* address);         8-byte load (8 fp8 elements); address 8-byte aligned
//   void store8(void* address, const vector8&); 8-byte store; address 8-byte aligned
//
// Every warp-level member is a full-warp collective: all 32 lanes must reach
// it together (the emulator reports a lane that does not).
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/execution/index3.hpp"
#include "kvcache/execution/vector16.hpp"

namespace kvcache {

/// Threads of a warp, on every target kvcache supports.
inline constexpr int warp_threads = 32;

/// The largest block CUDA launches.
inline constexpr int max_block_threads = 1024;

/// Dynamic shared memory a block may use by default: the opt-in maximum of
/// H100 / H200 (227 KiB); the emulator rejects launches above its limit.
inline constexpr std::size_t default_shared_memory_limit = 227u * 1024u;

/// A view of `count` T's of dynamic shared memory (the device context's
/// shared_array; the emulator returns a bounds-checked equivalent).
/// @tparam T a trivially copyable element type
template <class T>
struct shared_view {
    T* pointer = nullptr;   ///< first element in shared memory
    std::size_t count = 0;  ///< number of elements

    KVCACHE_HOST_DEVICE T& operator[](std::size_t i) const noexcept { return pointer[i]; }
    KVCACHE_HOST_DEVICE T* data() const noexcept { return pointer; }
    KVCACHE_HOST_DEVICE std::size_t size() const noexcept { return count; }
};

/// True when a block size is launchable by both targets: a positive multiple
/// of 32 no larger than 1024.
constexpr bool valid_block_threads(int threads) noexcept {
    return threads > 0 && threads <= max_block_threads && threads % warp_threads == 0;
}

namespace detail {

/// Compile-time checks shared by launch and emulate (the block size is checked
/// at run time by the emulator, so a bad one is reported like other faults).
/// @tparam Body a kernel body type (see the comment at the top of this header)
template <class Body>
constexpr void check_kernel_body() {
    static_assert(std::is_default_constructible_v<Body>, "a kernel body must be default constructible");
    static_assert(std::is_same_v<decltype(Body::block_threads), const int>, "Body::block_threads must be a constexpr int");
}

/// Reinterprets the bytes of one trivially copyable value as another of the same size.
template <class To, class From>
KVCACHE_HOST_DEVICE inline To bit_copy(const From& from) noexcept {
    static_assert(sizeof(To) == sizeof(From), "bit_copy needs equal sizes");
    To to;
    std::memcpy(&to, &from, sizeof to);
    return to;
}

}  // namespace detail
}  // namespace kvcache
