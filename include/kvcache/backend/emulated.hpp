// The emulated CUDA backend (tests only): the very kernel bodies the CUDA
// backend launches, run on the host by the SIMT emulator, every thread of
// every block, with its fault checks. Views and pointers are host memory.
#pragma once

#include "kvcache/backend/detail/launch_sequence.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/execution/emulator.hpp"

namespace kvcache {
namespace emulated {

/// Multiprocessors the emulated backend plans for: small, so the split and
/// multi-block paths are taken on test-sized inputs without many idle blocks.
inline constexpr int emulated_multiprocessors = 2;

namespace detail {

/// The Launcher policy of launch_sequence.hpp over kvcache::emulate.
struct emulated_launcher {
    emulator_options options;
    int multiprocessors() const noexcept { return emulated_multiprocessors; }
    template <class Body, class Params>
    void launch(index3 grid, std::size_t shared_bytes, const Params& params) {
        emulate<Body>(grid, shared_bytes, params, options);
    }
    template <class T>
    host_buffer<T> workspace(std::size_t count) {
        return host_buffer<T>(count);
    }
};

}  // namespace detail

/// Appends new tokens' K/V (see cpu::append) with the append kernel.
/// @tparam Layout a layout view over host memory  @tparam Input float or kvcache::half
template <class Layout, class Input>
void append(const Layout& view, const Input* keys, const Input* values, const int* new_token_offsets,
            const emulator_options& emulator = {}) {
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_append(launcher, view, keys, values, new_token_offsets);
}

/// Decode attention (see cpu::decode_attention) with the decode and merge kernels.
/// @tparam Layout a layout view over host memory  @tparam Query float or kvcache::half
template <class Layout, class Query>
void decode_attention(const Layout& view, const Query* queries, Query* outputs, const attention_options& options = {},
                      const emulator_options& emulator = {}) {
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_decode(launcher, view, queries, outputs, static_cast<float*>(nullptr), options);
}

/// Decode attention that also writes each (sequence, query head)'s log-sum-exp.
/// @tparam Layout a layout view over host memory  @tparam Query float or kvcache::half
template <class Layout, class Query>
void decode_attention_with_lse(const Layout& view, const Query* queries, Query* outputs, float* lse,
                               const attention_options& options = {}, const emulator_options& emulator = {}) {
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_decode(launcher, view, queries, outputs, lse, options);
}

/// Prefill attention (see cpu::prefill_attention) with the prefill kernel.
/// @tparam Layout a layout view over host memory  @tparam Query float or kvcache::half
template <class Layout, class Query>
void prefill_attention(const Layout& view, const Query* queries, const int* query_offsets, Query* outputs,
                       const attention_options& options = {}, const emulator_options& emulator = {}) {
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_prefill(launcher, view, queries, query_offsets, outputs, static_cast<float*>(nullptr), options);
}

/// Prefill attention that also writes each (token, query head)'s log-sum-exp.
/// @tparam Layout a layout view over host memory  @tparam Query float or kvcache::half
template <class Layout, class Query>
void prefill_attention_with_lse(const Layout& view, const Query* queries, const int* query_offsets, Query* outputs,
                                float* lse, const attention_options& options = {}, const emulator_options& emulator = {}) {
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_prefill(launcher, view, queries, query_offsets, outputs, lse, options);
}

/// Merges partial states (see cpu::merge_states) with the merge kernel; head_dim a multiple of 8.
/// @tparam State float or kvcache::half  @tparam Output float or kvcache::half
template <class State, class Output>
void merge_states(int states, int rows, int head_dim, const State* outputs, const float* lse, Output* merged,
                  float* merged_lse, const emulator_options& emulator = {}) {
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_merge(launcher,
                               kvcache::detail::state_major_merge(states, rows, head_dim, outputs, lse, merged, merged_lse));
}

}  // namespace emulated
}  // namespace kvcache
