// The emulated CUDA backend (tests only): the very kernel bodies the CUDA
// backend launches, run on the host by the SIMT emulator, every thread of
// every block, with its fault checks. Views and pointers are host memory.
#pragma once

#include "kvcache/backend/detail/launch_sequence.hpp"
#include "kvcache/backend/operation_params.hpp"
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
    host_buffer<float> workspace(std::size_t count) { return host_buffer<float>(count); }
};

}  // namespace detail

}  // namespace emulated

/// The emulated backend (tests): the CUDA backend's kernel bodies run on the
/// host by the SIMT emulator, every thread of every block, with its fault
/// checks. Same members and params as cpu_backend; views and buffers are
/// host memory.
class emulated_backend {
public:
    /// A backend whose launches use the given emulator options (schedule, checks).
    explicit emulated_backend(const emulator_options& options = {}) : options_(options) {}

    /// Writes new tokens' K/V rows with the append kernel (see append_params).
    /// @tparam Layout a layout view over host memory
    /// @tparam Input float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Input>
    void append(const append_params<Layout, Input>& p) const {
        detail::check_call_append(p, true);
        emulated::detail::emulated_launcher launcher{options_};
        detail::run_append(launcher, p.view, p.keys.data(), p.values.data(), p.new_token_offsets.data(),
                           p.positions.empty() ? nullptr : p.positions.data());
    }

    /// Decode attention with the decode and merge kernels (see decode_params).
    /// @tparam Layout a layout view over host memory
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Query>
    void decode(const decode_params<Layout, Query>& p) const {
        detail::check_call_decode(p);
        emulated::detail::emulated_launcher launcher{options_};
        detail::run_decode(launcher, detail::masked(p.view, p.options), p.queries.data(), p.outputs.data(), p.lse.empty() ? nullptr : p.lse.data(),
                           p.options, detail::score_request_of(p.scores, p.score_stride));
    }

    /// Prefill attention with the prefill kernel (see prefill_params).
    /// @tparam Layout a layout view over host memory
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Query>
    void prefill(const prefill_params<Layout, Query>& p) const {
        detail::check_call_prefill(p, true);
        emulated::detail::emulated_launcher launcher{options_};
        detail::run_prefill(launcher, detail::masked(p.view, p.options), p.queries.data(), p.query_offsets.data(),
                            p.query_positions.empty() ? nullptr : p.query_positions.data(), p.outputs.data(),
                            p.lse.empty() ? nullptr : p.lse.data(), p.options, detail::score_request_of(p.scores, p.score_stride, p.score_queries),
                            p.queries.size() / Layout::heads::head_dim);
    }

    /// Merges partial states with the merge kernel (see merge_params).
    /// @tparam State float, kvcache::half or kvcache::bfloat16
    /// @tparam Output float, kvcache::half or kvcache::bfloat16
    template <class State, class Output>
    void merge(const merge_params<State, Output>& p) const {
        detail::check_call_merge(p);
        emulated::detail::emulated_launcher launcher{options_};
        detail::run_merge(launcher, detail::state_major_merge(p.states, p.rows, p.head_dim, p.outputs.data(),
                                                              p.lse.data(), p.merged.data(),
                                                              p.merged_lse.empty() ? nullptr : p.merged_lse.data()));
    }

    /// Waits for the calls made so far: nothing to wait for, each call's
    /// work is done when it returns (cuda_backend's is not).
    void synchronize() const noexcept {}

    /// The emulator options every launch uses.
    const emulator_options& options() const noexcept { return options_; }

private:
    emulator_options options_;
};

}  // namespace kvcache
