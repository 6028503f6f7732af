// The CPU backend object: the operations of operation_params.hpp for layout
// views in host memory, threaded across (sequence, KV head[, split | query
// block]) on a thread pool: the process-wide one, or the caller's.
#pragma once

#include "kvcache/backend/cpu/append.hpp"
#include "kvcache/backend/cpu/attention.hpp"
#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/merge_states.hpp"
#include "kvcache/backend/cpu/thread_pool.hpp"
#include "kvcache/backend/detail/call_checks.hpp"
#include "kvcache/backend/operation_params.hpp"

namespace kvcache {
// In the ISA-keyed namespace of cpu/isa.hpp, like the kernels it calls: two
// units built for different instruction sets each get their own backend.
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// The CPU backend: same members and params as reference_backend,
/// emulated_backend and cuda_backend. Every call checks its params first
/// (nothing is written when one is wrong) and returns when the work is done.
///
/// Threads: append, decode and prefill run on the backend's thread_pool
/// (merge runs on the calling thread). A pool runs one loop at a time, so two
/// threads calling backends on the same pool at once are correct but one of
/// them runs single-threaded (the pool's busy_inline_loops() counts it);
/// callers that run steps concurrently give each backend its own pool. A
/// backend is a pointer to its pool: cheap to copy, and its calls are const.
class cpu_backend {
public:
    /// Runs on the process-wide pool (cpu::set_thread_count sets its size).
    cpu_backend() : pool_(&cpu::thread_pool::process_wide()) {}

    /// Runs on pool, which it does not own: the pool must outlive the backend
    /// and every copy of it.
    explicit cpu_backend(cpu::thread_pool& pool) noexcept : pool_(&pool) {}

    /// Writes new tokens' K/V rows (see append_params).
    /// @tparam Layout a layout view over host memory
    /// @tparam Input float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Input>
    void append(const append_params<Layout, Input>& p) const {
        detail::check_call_append(p, true);
        cpu::detail::append(*pool_, p.view, p.keys.data(), p.values.data(), p.new_token_offsets.data(),
                            p.positions.empty() ? nullptr : p.positions.data());
    }

    /// Decode attention (see decode_params); kv_splits 0 splits the keys when
    /// the batch has fewer (sequence, KV head) items than threads.
    /// @tparam Layout a layout view over host memory
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Query>
    void decode(const decode_params<Layout, Query>& p) const {
        detail::check_call_decode(p);
        cpu::detail::decode(*pool_, detail::masked(p.view, p.options), p.queries.data(), p.outputs.data(),
                            p.lse.empty() ? nullptr : p.lse.data(), p.options,
                            p.scores.empty() ? nullptr : p.scores.data(), p.score_stride);
    }

    /// Prefill attention (see prefill_params).
    /// @tparam Layout a layout view over host memory
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Query>
    void prefill(const prefill_params<Layout, Query>& p) const {
        detail::check_call_prefill(p, true);
        if (p.view.sequence_count() == 0) return;
        cpu::detail::prefill(*pool_, detail::masked(p.view, p.options), p.queries.data(), p.query_offsets.data(),
                             p.query_positions.empty() ? nullptr : p.query_positions.data(), p.outputs.data(),
                             p.lse.empty() ? nullptr : p.lse.data(), p.options,
                             p.scores.empty() ? nullptr : p.scores.data(), p.score_stride, p.score_queries);
    }

    /// Merges partial attention states (see merge_params).
    /// @tparam State float, kvcache::half or kvcache::bfloat16
    /// @tparam Output float, kvcache::half or kvcache::bfloat16
    template <class State, class Output>
    void merge(const merge_params<State, Output>& p) const {
        detail::check_call_merge(p);
        cpu::detail::merge_rows(p.states, p.rows, p.head_dim, p.outputs.data(), p.lse.data(), p.merged.data(),
                           p.merged_lse.empty() ? nullptr : p.merged_lse.data());
    }

    /// Waits for the calls made so far: nothing to wait for, each call's
    /// work is done when it returns (cuda_backend's is not).
    void synchronize() const noexcept {}

    /// Threads of the backend's pool, the caller included.
    int threads() const noexcept { return pool_->threads(); }

    /// The pool the backend runs on.
    cpu::thread_pool& pool() const noexcept { return *pool_; }

private:
    cpu::thread_pool* pool_;
};

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace kvcache
