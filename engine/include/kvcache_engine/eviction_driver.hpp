// The policy half of the engine's cached path, shared by the host
// (kvcache_attention.hpp) and device (device_attention.hpp) attention
// classes: what each step asks the kernels for, the scores gathered per
// layer, and the compaction at the end of a pass that the schedule says is
// due, through the owner's compact(). Any owner with compact() runs a
// policy (paged, contiguous, sliding window); only a paged owner has a pool
// whose shortage can trigger a compaction and whose pages are reported.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/policy/key_norms.hpp"
#include "kvcache_engine/compression.hpp"

namespace kvcache::examples {

// Not examples::detail: headers included after this one name kvcache::detail as detail::.
namespace eviction_detail {
template <class Cache, class = void>
struct compacts : std::false_type {};
template <class Cache>
struct compacts<Cache, std::void_t<decltype(std::declval<Cache&>().compact(sequence_id{},
                                                                          std::vector<std::vector<int>>{})),
                                   decltype(std::declval<const Cache&>().visible_count(sequence_id{}, 0))>>
    : std::true_type {};

template <class Cache, class = void>
struct has_page_pool : std::false_type {};
template <class Cache>
struct has_page_pool<Cache, std::void_t<decltype(std::declval<const Cache&>().statistics())>> : std::true_type {};

template <class Cache, class = void>
struct has_bytes_used : std::false_type {};
template <class Cache>
struct has_bytes_used<Cache, std::void_t<decltype(std::declval<const Cache&>().bytes_used())>> : std::true_type {};

// Owners whose rows leave by position between compactions (the ring of a sliding window): the
// scores gathered for a row must follow it to its new visible index.
template <class Cache>
struct evicts_by_position : std::false_type {};
template <class Element, class Heads, class Memory>
struct evicts_by_position<sliding_window_cache<Element, Heads, Memory>> : std::true_type {};
}  // namespace eviction_detail

/// True when the owner can keep chosen rows of a sequence (compact() and
/// visible_count(): paged, contiguous and sliding-window owners), so the
/// engine's policy path can drive it.
/// @tparam Cache a kvcache owner
template <class Cache>
inline constexpr bool compacts_v = eviction_detail::compacts<Cache>::value;

/// True when the owner has a page pool (statistics(): paged_cache), whose
/// shortage can trigger a compaction (compress_when_free_below).
/// @tparam Cache a kvcache owner
template <class Cache>
inline constexpr bool has_page_pool_v = eviction_detail::has_page_pool<Cache>::value;

/// The cache memory an owner's sequences hold now: bytes_used() where the
/// owner counts it (pages in use, or rows stored), else all it reserved.
/// @tparam Cache a kvcache owner
template <class Cache>
std::size_t bytes_used_of(const Cache& cache) {
    if constexpr (eviction_detail::has_bytes_used<Cache>::value)
        return cache.bytes_used();
    else
        return cache.bytes_reserved();
}

/// One sequence's eviction policy over an owner: asks each step for the
/// scores the policy needs (wanted(), score_queries()), gathers them
/// (record()), and at the end of a pass that is due keeps, in every layer
/// over its budget, the rows select_rows chooses (after_pass()).
/// @tparam Cache a kvcache owner with compact() (compacts_v)
template <class Cache>
class eviction_driver {
public:
    /// Evicts with `options` from the next pass on. Throws the library's
    /// errors, before anything changes, for a bad budget, ratio or window,
    /// an owner without compact(), or a pool trigger on an owner without a pool.
    void configure(const Cache& cache, const compression_options& options) {
        if (!options.active()) return;
        require(compacts_v<Cache>, error_code::unsupported_configuration, "eviction policy ", to_string(options.policy),
                " needs a cache that compacts (paged, contiguous or sliding-window owner)");
        require(has_page_pool_v<Cache> || options.compress_when_free_below == 0, error_code::unsupported_configuration,
                "compress_when_free_below = ", options.compress_when_free_below,
                " watches a page pool, which only the paged layout has");
        // knorm reads the keys through a view on the host.
        require(Cache::memory::space == memory_space::host || options.policy != eviction_policy::knorm,
                error_code::unsupported_configuration, "eviction policy knorm reads keys on the host; this cache is in ",
                "device memory");
        options.validate();
        options_ = options;
        scores_ = policy_scores(options, cache.layers(), cache.kv_heads());
        schedule_ = compaction_schedule(options.compress_every);
        positions_.assign(std::size_t(cache.layers()), {});
    }

    bool active() const noexcept { return options_.active(); }
    /// Whether attention steps must emit scores.
    bool wanted() const noexcept { return scores_.wanted(); }
    /// prefill_params::score_queries for a prefill of `tokens` queries.
    int score_queries(int tokens) const noexcept { return scores_.prefill_queries(tokens); }

    /// One step's scores of a layer, [kv_heads][rows] over the `rows` rows
    /// the layer showed the step (host memory).
    void record(const Cache& cache, sequence_id id, int layer, span<const float> scores, int rows, bool prefill) {
        if constexpr (eviction_detail::evicts_by_position<Cache>::value) follow_ring(cache, id, layer);
        scores_.record(layer, scores, rows, rows, prefill);
        if constexpr (eviction_detail::evicts_by_position<Cache>::value)
            positions_[std::size_t(layer)] = cache.present_positions(id, layer);
    }

    /// Call after each layer's step: after the last layer of a pass that is
    /// due (or, paged, of any pass that leaves the pool short), every layer
    /// over its budget is compacted. Views are the plan's (knorm reads keys
    /// through them, so the owner must be in host memory for knorm).
    /// @tparam Plan the step_plan the pass ran
    template <class Plan>
    void after_layer(Cache& cache, sequence_id id, const Plan& plan, int layer, bool prefill) {
        if constexpr (compacts_v<Cache>) {
            if (!active() || layer + 1 != cache.layers()) return;
            // due_after counts the pass, so it runs first; a short pool compacts between scheduled runs too.
            if (schedule_.due_after(prefill) || pool_short(cache)) compact_over_budget(cache, id, plan);
        }
    }

    /// Rows each layer of the sequence holds now (a compacted layer fewer than its length).
    std::vector<int> rows_held(const Cache& cache, sequence_id id) const {
        std::vector<int> rows(std::size_t(cache.layers()), cache.length(id));
        if constexpr (compacts_v<Cache>)
            for (int l = 0; l < cache.layers(); ++l) rows[std::size_t(l)] = cache.visible_count(id, l);
        return rows;
    }
    /// Compactions run so far.
    int compactions() const noexcept { return schedule_.count(); }

private:
    // The ring dropped rows since the layer's last record: the sums of the rows still shown stay theirs.
    void follow_ring(const Cache& cache, sequence_id id, int layer) {
        const std::vector<int>& before = positions_[std::size_t(layer)];
        if (before.empty()) return;
        const std::vector<int> now = cache.present_positions(id, layer);
        std::vector<int> staying;
        std::size_t j = 0;
        for (std::size_t i = 0; i < before.size(); ++i) {
            while (j < now.size() && now[j] < before[i]) ++j;
            if (j < now.size() && now[j] == before[i]) staying.push_back(static_cast<int>(i));
        }
        if (staying.size() != before.size()) scores_.follow(layer, staying);
    }

    bool pool_short(const Cache& cache) const {
        if constexpr (has_page_pool_v<Cache>) {
            if (options_.compress_when_free_below == 0) return false;
            const auto st = cache.statistics();
            return st.pages_free + st.pages_evictable < options_.compress_when_free_below;
        } else {
            return false;
        }
    }

    // Every layer over its budget keeps select_rows' choice; all layers in one compact().
    template <class Plan>
    void compact_over_budget(Cache& cache, sequence_id id, const Plan& plan) {
        const std::vector<int> budgets = options_.layer_budgets(cache.layers(), cache.length(id));
        std::vector<std::vector<int>> kept(budgets.size());
        bool over = false;
        for (int l = 0; l < cache.layers(); ++l) {
            const int rows = cache.visible_count(id, l);
            const int budget = budgets[std::size_t(l)];
            const selection_options selection = options_.selection(l, schedule_.count());
            if (rows <= budget) {  // within budget: every row stays
                for (int i = 0; i < rows; ++i) kept[std::size_t(l)].push_back(i);
            } else if (options_.policy == eviction_policy::knorm) {
                norms_.assign(std::size_t(cache.kv_heads()) * std::size_t(rows), 0.0f);
                key_norms(plan.view(l), span<float>(norms_.data(), norms_.size()), rows);
                kept[std::size_t(l)] =
                    select_rows(selection, budget, rows,
                                row_scores{span<const float>(norms_.data(), norms_.size()), cache.kv_heads(), rows});
            } else {
                kept[std::size_t(l)] = select_rows(selection, budget, rows, scores_.of(l));
            }
            over = over || rows > budget;
        }
        if (!over) return;
        cache.compact(id, kept);
        for (int l = 0; l < cache.layers(); ++l) {
            scores_.kept(l, kept[std::size_t(l)]);
            if constexpr (eviction_detail::evicts_by_position<Cache>::value)
                positions_[std::size_t(l)] = cache.present_positions(id, l);
        }
        schedule_.compacted();
    }

    compression_options options_;
    policy_scores scores_{compression_options{}, 1, 1};
    compaction_schedule schedule_{0};
    std::vector<std::vector<int>> positions_;  // sliding window: per layer, the positions the last scores were for
    std::vector<float> norms_;
};

}  // namespace kvcache::examples
