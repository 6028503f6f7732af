// A step plan: what one step of a batch needs from the cache, built once and
// owned by the plan. cache.plan(batch, new_tokens) reserves the new positions
// of every sequence (all layers), builds the views' index table (lengths,
// slots or page tables) and the CSR offsets of the new tokens, and for a
// device cache uploads them into device buffers the plan owns, ordered on the
// caller's stream. Every layer's view of the step points into the plan, so
// plans of different batches coexist (cascade attention over a shared-prefix
// batch and a suffix batch), and rebuilding a plan into itself (cache.replan)
// reuses its buffers: no allocation once they are large enough.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"

namespace kvcache {
namespace detail {
template <class Derived, class Element, class Heads>
class owner_base;
}  // namespace detail

/// The metadata of one step of a batch over a cache. A plan stays valid
/// while its sequences are changed only through it: appending to, truncating
/// or removing one of them elsewhere (or another plan reserving positions for
/// it) makes its tables stale. Moving a plan keeps its views valid.
/// @tparam Cache a cache owner (contiguous_cache, paged_cache, sliding_window_cache)
template <class Cache>
class step_plan {
public:
    using view_type = typename Cache::view_type;
    using memory = typename Cache::memory;

    /// An empty plan (no batch); cache.replan() fills it.
    step_plan() = default;

    /// Batch entry i's sequence id.
    const std::vector<sequence_id>& batch() const noexcept { return batch_; }
    /// Batch entries.
    int size() const noexcept { return static_cast<int>(batch_.size()); }
    /// New tokens reserved for batch entry b this step.
    int new_tokens(int b) const { return host_offsets()[b + 1] - host_offsets()[b]; }
    /// New tokens of the whole batch: rows of the step's K/V and queries.
    int total_new_tokens() const noexcept { return batch_.empty() ? 0 : host_[offsets_at_ + batch_.size()]; }
    /// Batch entry b's first new position (its length before the step).
    int first_new_position(int b) const { return host_[b] - new_tokens(b); }

    /// The view of one layer over the plan's tables (valid while the plan is).
    view_type view(int layer) const {
        require(cache_ != nullptr, error_code::invalid_argument, "step_plan::view on an empty plan");
        view_type v = cache_->view_over(layer, table_data(), size(), host_.data());
        v.sequence_ids = batch_.empty() ? nullptr : batch_.data();
        return v;
    }

    /// The new tokens' CSR offsets (size() + 1 entries) in the cache's memory
    /// space: what append_params and prefill_params take for this step.
    span<const int> new_token_offsets() const noexcept {
        return batch_.empty() ? span<const int>() : span<const int>(table_data() + offsets_at_, batch_.size() + 1);
    }
    /// The same offsets in host memory.
    span<const int> host_offsets() const noexcept {
        return batch_.empty() ? span<const int>() : span<const int>(host_.data() + offsets_at_, batch_.size() + 1);
    }

private:
    template <class, class, class>
    friend class detail::owner_base;

    const int* table_data() const noexcept {
        if constexpr (memory::space == memory_space::host)
            return host_.data();
        else
            return device_.data();
    }

    /// Keeps table (the view table, then the offsets at offsets_at) and
    /// uploads it for a device cache, growing the device buffer only when short.
    void assign(Cache* cache, std::vector<sequence_id> batch, std::vector<int> table, std::size_t offsets_at,
                typename memory::stream_type stream) {
        if constexpr (memory::space != memory_space::host) {
            if (device_.size() < table.size()) {
                typename memory::template buffer<int> grown(table.size());
                device_ = std::move(grown);
            }
            memory::copy_from_host_async(device_.data(), table.data(), table.size() * sizeof(int), stream);
        } else {
            (void)stream;
        }
        cache_ = cache;
        batch_ = std::move(batch);
        host_ = std::move(table);
        offsets_at_ = offsets_at;
    }

    Cache* cache_ = nullptr;
    std::vector<sequence_id> batch_;
    std::vector<int> host_;       // the view table, then the new tokens' offsets
    std::size_t offsets_at_ = 0;  // where the offsets start in host_
    typename memory::template buffer<int> device_;  // device caches: host_ uploaded
};

}  // namespace kvcache
