// The execution context of a thread in a real CUDA kernel: every member maps
// to a CUDA builtin, a __shfl_*_sync intrinsic or a CUB collective.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcache/core/config.hpp"
#include "kvcache/execution/context.hpp"

#if defined(__CUDACC__)
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/functional>

namespace kvcache {
namespace detail {

/// The dynamic shared memory of the running kernel (one declaration for all bodies).
__device__ inline unsigned char* dynamic_shared_memory() {
    extern __shared__ __align__(16) unsigned char kvcache_dynamic_shared[];
    return kvcache_dynamic_shared;
}

inline constexpr unsigned full_warp_mask = 0xffffffffu;

}  // namespace detail

/// The context a kernel body receives on the GPU; members are documented in
/// context.hpp. Reductions keep their CUB scratch in static shared memory.
/// @tparam BlockThreads the launch block size (Body::block_threads)
template <int BlockThreads>
class device_context {
public:
    static_assert(valid_block_threads(BlockThreads), "BlockThreads must be a positive multiple of 32 up to 1024");
    static constexpr int warp_size = warp_threads;
    static constexpr bool is_emulated = false;

    __device__ explicit device_context(std::size_t shared_bytes) : shared_bytes_(shared_bytes) {}

    __device__ index3 block_index() const {
        return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    }
    __device__ index3 grid_size() const {
        return {static_cast<int>(gridDim.x), static_cast<int>(gridDim.y), static_cast<int>(gridDim.z)};
    }
    __device__ int thread_index() const { return static_cast<int>(threadIdx.x); }
    __device__ int block_size() const { return BlockThreads; }
    __device__ int lane() const { return static_cast<int>(threadIdx.x) & (warp_size - 1); }
    __device__ int warp() const { return static_cast<int>(threadIdx.x) / warp_size; }
    __device__ int warp_count() const { return BlockThreads / warp_size; }

    __device__ void sync_block() { __syncthreads(); }
    __device__ bool sync_block_or(bool predicate) { return __syncthreads_or(predicate) != 0; }

    template <class T>
    __device__ T shuffle_xor(T value, int lane_mask) {
        return shuffle(value, [lane_mask](auto bits) { return __shfl_xor_sync(detail::full_warp_mask, bits, lane_mask); });
    }
    template <class T>
    __device__ T shuffle_down(T value, int delta) {
        return shuffle(value, [delta](auto bits) {
            return __shfl_down_sync(detail::full_warp_mask, bits, static_cast<unsigned>(delta));
        });
    }
    template <class T>
    __device__ T shuffle_index(T value, int source_lane) {
        return shuffle(value, [source_lane](auto bits) { return __shfl_sync(detail::full_warp_mask, bits, source_lane); });
    }

    __device__ bool warp_any(bool predicate) { return __any_sync(detail::full_warp_mask, predicate) != 0; }
    __device__ bool warp_all(bool predicate) { return __all_sync(detail::full_warp_mask, predicate) != 0; }
    __device__ unsigned warp_ballot(bool predicate) { return __ballot_sync(detail::full_warp_mask, predicate); }

    __device__ float warp_sum(float value) {
        __shared__ typename warp_reduce::TempStorage scratch[BlockThreads / warp_threads];
        const float lane0 = warp_reduce(scratch[warp()]).Sum(value);
        return __shfl_sync(detail::full_warp_mask, lane0, 0);  // CUB leaves the result in lane 0 only
    }
    __device__ float warp_max(float value) {
        __shared__ typename warp_reduce::TempStorage scratch[BlockThreads / warp_threads];
        const float lane0 = warp_reduce(scratch[warp()]).Reduce(value, ::cuda::maximum<>{});
        return __shfl_sync(detail::full_warp_mask, lane0, 0);
    }

    __device__ float block_sum(float value) {
        __shared__ typename block_reduce::TempStorage scratch;
        __shared__ float result;
        const float thread0 = block_reduce(scratch).Sum(value);
        return broadcast(thread0, result);
    }
    __device__ float block_max(float value) {
        __shared__ typename block_reduce::TempStorage scratch;
        __shared__ float result;
        const float thread0 = block_reduce(scratch).Reduce(value, ::cuda::maximum<>{});
        return broadcast(thread0, result);
    }

    template <class T>
    __device__ shared_view<T> shared_array(std::size_t byte_offset, std::size_t count) const {
        return {reinterpret_cast<T*>(detail::dynamic_shared_memory() + byte_offset), count};
    }
    __device__ std::size_t shared_bytes() const { return shared_bytes_; }

    __device__ vector16 load16(const void* address) const {
        const uint4 raw = *static_cast<const uint4*>(address);
        return vector16{{raw.x, raw.y, raw.z, raw.w}};
    }
    __device__ void store16(void* address, const vector16& v) const {
        *static_cast<uint4*>(address) = make_uint4(v.words[0], v.words[1], v.words[2], v.words[3]);
    }
    __device__ vector8 load8(const void* address) const {
        const uint2 raw = *static_cast<const uint2*>(address);
        return vector8{{raw.x, raw.y}};
    }
    __device__ void store8(void* address, const vector8& v) const {
        *static_cast<uint2*>(address) = make_uint2(v.words[0], v.words[1]);
    }

private:
    using warp_reduce = cub::WarpReduce<float>;
    using block_reduce = cub::BlockReduce<float, BlockThreads>;

    template <class T, class Shuffle>
    __device__ static T shuffle(T value, Shuffle&& exchange) {
        static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp shuffles move values of 4 or 8 bytes");
        if constexpr (sizeof(T) == 4) {
            return detail::bit_copy<T>(exchange(detail::bit_copy<unsigned>(value)));
        } else {
            return detail::bit_copy<T>(exchange(detail::bit_copy<unsigned long long>(value)));
        }
    }

    // Thread 0 holds CUB's result; the second barrier lets the scratch and the
    // slot be reused by the next call.
    __device__ static float broadcast(float thread0, float& slot) {
        if (threadIdx.x == 0) slot = thread0;
        __syncthreads();
        const float all = slot;
        __syncthreads();
        return all;
    }

    std::size_t shared_bytes_;
};

}  // namespace kvcache
#endif  // __CUDACC__
