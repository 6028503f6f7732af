// Definitions of the CUDA backend (declared in kvcache/backend/cuda.hpp): the
// kernel bodies launched through kvcache::launch on a stream. Include this in
// the nvcc translation units that instantiate configurations, e.g.
//   template struct kvcache::cuda::detail::instantiation<kvcache::paged_view<kvcache::half, kvcache::head_config<32, 8, 128>>>;
#pragma once

#include <cstddef>

#include "kvcache/backend/cuda.hpp"
#include "kvcache/backend/detail/launch_sequence.hpp"
#include "kvcache/core/cuda_error.hpp"
#include "kvcache/execution/device_launch.cuh"

#if defined(__CUDACC__)

namespace kvcache {
namespace cuda {
namespace detail {

/// Stream-ordered scratch memory: allocated and freed on the stream, so a
/// split decode needs no device-wide synchronisation.
/// @tparam T element type
template <class T>
class stream_workspace {
public:
    stream_workspace(std::size_t count, cudaStream_t stream) : stream_(stream) {
        KVCACHE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), count * sizeof(T), stream));
    }
    stream_workspace(stream_workspace&& other) noexcept : data_(other.data_), stream_(other.stream_) { other.data_ = nullptr; }
    stream_workspace(const stream_workspace&) = delete;
    stream_workspace& operator=(const stream_workspace&) = delete;
    stream_workspace& operator=(stream_workspace&&) = delete;
    ~stream_workspace() {
        if (data_) (void)cudaFreeAsync(data_, stream_);
    }
    T* data() const noexcept { return data_; }

private:
    T* data_ = nullptr;
    cudaStream_t stream_;
};

/// Multiprocessors of the current device (asked once per device).
inline int current_multiprocessors() {
    int device = 0;
    KVCACHE_CUDA_CHECK(cudaGetDevice(&device));
    static thread_local int cached_device = -1;
    static thread_local int cached_count = 0;
    if (device != cached_device) {
        KVCACHE_CUDA_CHECK(cudaDeviceGetAttribute(&cached_count, cudaDevAttrMultiProcessorCount, device));
        cached_device = device;
    }
    return cached_count;
}

/// The Launcher policy of launch_sequence.hpp over kvcache::launch on a stream.
struct stream_launcher {
    cudaStream_t stream;
    int multiprocessors() const { return current_multiprocessors(); }
    template <class Body, class Params>
    void launch(index3 grid, std::size_t shared_bytes, const Params& params) {
        kvcache::launch<Body>(grid, shared_bytes, stream, params);
    }
    template <class T>
    stream_workspace<T> workspace(std::size_t count) {
        return stream_workspace<T>(count, stream);
    }
};

template <class Layout>
void instantiation<Layout>::append(const Layout& view, const element* keys, const element* values,
                                   const int* new_token_offsets, cudaStream_t stream) {
    stream_launcher launcher{stream};
    kvcache::detail::run_append(launcher, view, keys, values, new_token_offsets);
}

template <class Layout>
void instantiation<Layout>::decode(const Layout& view, const element* queries, element* outputs, float* lse,
                                   const attention_options& options, cudaStream_t stream) {
    stream_launcher launcher{stream};
    kvcache::detail::run_decode(launcher, view, queries, outputs, lse, options);
}

template <class Layout>
void instantiation<Layout>::prefill(const Layout& view, const element* queries, const int* query_offsets,
                                    element* outputs, float* lse, const attention_options& options,
                                    cudaStream_t stream) {
    stream_launcher launcher{stream};
    kvcache::detail::run_prefill(launcher, view, queries, query_offsets, outputs, lse, options);
}

template <class State, class Output>
void merge_instantiation<State, Output>::merge(int states, int rows, int head_dim, const State* outputs,
                                               const float* lse, Output* merged, float* merged_lse,
                                               cudaStream_t stream) {
    stream_launcher launcher{stream};
    kvcache::detail::run_merge(launcher, kvcache::detail::state_major_merge(states, rows, head_dim, outputs, lse,
                                                                            merged, merged_lse));
}

}  // namespace detail
}  // namespace cuda
}  // namespace kvcache

#endif  // __CUDACC__
