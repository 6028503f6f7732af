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

/// Scratch memory for a split decode: the backend's workspace when it is
/// large enough, else allocated and freed on the stream (stream-ordered, so no
/// device-wide synchronisation).
/// @tparam T element type
template <class T>
class stream_workspace {
public:
    stream_workspace(std::size_t count, span<T> given, cudaStream_t stream) : stream_(stream) {
        if (given.size() >= count) {
            data_ = given.data();
            return;
        }
        KVCACHE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), count * sizeof(T), stream));
        owned_ = true;
    }
    stream_workspace(stream_workspace&& other) noexcept
        : data_(other.data_), stream_(other.stream_), owned_(other.owned_) {
        other.owned_ = false;
    }
    stream_workspace(const stream_workspace&) = delete;
    stream_workspace& operator=(const stream_workspace&) = delete;
    stream_workspace& operator=(stream_workspace&&) = delete;
    ~stream_workspace() {
        if (owned_) (void)cudaFreeAsync(data_, stream_);
    }
    T* data() const noexcept { return data_; }

private:
    T* data_ = nullptr;
    cudaStream_t stream_;
    bool owned_ = false;
};

/// The Launcher policy of launch_sequence.hpp over kvcache::launch on a stream.
struct stream_launcher {
    cudaStream_t stream;
    span<float> given_workspace;
    int multiprocessors() const { return current_multiprocessors(); }
    template <class Body, class Params>
    void launch(index3 grid, std::size_t shared_bytes, const Params& params) {
        kvcache::launch<Body>(grid, shared_bytes, stream, params);
    }
    stream_workspace<float> workspace(std::size_t count) { return stream_workspace<float>(count, given_workspace, stream); }
};

template <class Layout, class Query>
void instantiation<Layout, Query>::append(const Layout& view, const Query* keys, const Query* values,
                                          const int* new_token_offsets, const int* positions, cudaStream_t stream) {
    stream_launcher launcher{stream, {}};
    kvcache::detail::run_append(launcher, view, keys, values, new_token_offsets, positions);
}

template <class Layout, class Query>
void instantiation<Layout, Query>::decode(const Layout& view, const Query* queries, Query* outputs, float* lse,
                                          const attention_options& options, const score_request& scores,
                                          span<float> workspace, cudaStream_t stream) {
    stream_launcher launcher{stream, workspace};
    kvcache::detail::run_decode(launcher, view, queries, outputs, lse, options, scores);
}

template <class Layout, class Query>
void instantiation<Layout, Query>::prefill(const Layout& view, const Query* queries, const int* query_offsets,
                                           const int* query_positions, Query* outputs, float* lse,
                                           const attention_options& options, const score_request& scores,
                                           std::size_t query_rows, span<float> workspace, cudaStream_t stream) {
    stream_launcher launcher{stream, workspace};
    kvcache::detail::run_prefill(launcher, view, queries, query_offsets, query_positions, outputs, lse, options, scores,
                                 query_rows);
}

template <class State, class Output>
void merge_instantiation<State, Output>::merge(int states, int rows, int head_dim, const State* outputs,
                                               const float* lse, Output* merged, float* merged_lse,
                                               cudaStream_t stream) {
    stream_launcher launcher{stream, {}};
    kvcache::detail::run_merge(launcher, kvcache::detail::state_major_merge(states, rows, head_dim, outputs, lse,
                                                                            merged, merged_lse));
}

}  // namespace detail
}  // namespace cuda
}  // namespace kvcache

#endif  // __CUDACC__
