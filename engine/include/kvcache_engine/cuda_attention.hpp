// The cached attention path on the GPU: device_attention (device_attention.hpp)
// with the owners in device_memory (K/V pools and the views' tables on the
// device) and a policy that copies with cudaMemcpyAsync and hands out a
// cuda_backend on its one stream (append, prefill, decode).
// Plain C++ over kvcache/backend/cuda.hpp; the kernels are linked from
// kvcache_engine_cuda_kernels (engine/CMakeLists.txt).
#pragma once

#include "kvcache/core/config.hpp"

#if KVCACHE_HAS_CUDA_RUNTIME
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "kvcache/backend/cuda.hpp"
#include "kvcache/core/cuda_error.hpp"
#include "kvcache/core/device_memory.hpp"
#include "kvcache_engine/device_attention.hpp"

namespace kvcache::examples {

/// The device policy of the CUDA backend: device memory and one stream per generation.
class cuda_stream_device {
public:
    static constexpr memory_space space = memory_space::device;
    /// @tparam T element type
    template <class T>
    using buffer = device_buffer<T>;

    // A blocking stream (not cudaStreamNonBlocking): the plans upload their tables on this
    // stream, but the owners still copy pages (copy on write) with cudaMemcpy on the legacy
    // default stream, and only a blocking stream's work is ordered after that.
    cuda_stream_device() { KVCACHE_CUDA_CHECK(cudaStreamCreate(&stream_)); }
    ~cuda_stream_device() {
        (void)cudaStreamSynchronize(stream_);
        (void)cudaStreamDestroy(stream_);
    }
    cuda_stream_device(const cuda_stream_device&) = delete;
    cuda_stream_device& operator=(const cuda_stream_device&) = delete;

    // Pageable host sources: cudaMemcpyAsync has read them when it returns, so they may be reused.
    template <class T>
    void upload(T* device_destination, const T* host_source, std::size_t count) {
        KVCACHE_CUDA_CHECK(cudaMemcpyAsync(device_destination, host_source, count * sizeof(T), cudaMemcpyHostToDevice,
                                           stream_));
    }
    // Lands in host memory only after finish().
    template <class T>
    void download(T* host_destination, const T* device_source, std::size_t count) {
        KVCACHE_CUDA_CHECK(cudaMemcpyAsync(host_destination, device_source, count * sizeof(T), cudaMemcpyDeviceToHost,
                                           stream_));
    }
    /// The stream the plans upload their tables on and every kernel runs on.
    cudaStream_t stream() const noexcept { return stream_; }
    /// The backend object on the stream. Without workspace a split decode allocates
    /// its partial states on the stream (cudaMallocAsync); fine outside graph capture.
    cuda_backend backend() const { return cuda_backend{stream_}; }
    /// Waits for the stream; a kernel fault surfaces here.
    void finish() { KVCACHE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
    void wait_quietly() noexcept { (void)cudaStreamSynchronize(stream_); }

private:
    cudaStream_t stream_ = nullptr;
};

/// device_attention on the GPU.
/// @tparam Cache a device-memory owner
template <class Cache>
using cuda_kvcache_attention = device_attention<Cache, cuda_stream_device>;

/// Greedy generation with the K/V in a kvcache owner in device memory, attention
/// by the CUDA backend, dispatched over the configurations compiled for it.
/// @tparam Configurations the type_list of configurations instantiated
///         (kvcache_add_cuda_instantiations) in a linked library: its generated list
template <class Configurations>
cached_generation generate_with_kvcache_cuda(llama_model& model, const std::vector<int>& prompt, int new_tokens,
                                             const cache_options& cache, const generation_options& options = {}) {
    return dispatch(Configurations{}, wanted_configuration(model, cache), [&](auto config) {
        return detail::generate_configured<decltype(config), device_memory, cuda_kvcache_attention>(
            config, model, prompt, new_tokens, cache, options);
    });
}

}  // namespace kvcache::examples

#endif  // KVCACHE_HAS_CUDA_RUNTIME
