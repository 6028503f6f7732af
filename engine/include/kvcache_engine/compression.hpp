// Key-token selection in the engine's cached path: which scores a policy
// needs from each attention step, when a sequence is compacted (after the
// prefill, every N decode steps), and how many rows each layer keeps. The
// rows themselves are chosen by the library's policy layer (select_rows);
// eviction_driver.hpp asks the kernels for the scores and calls the
// owner's compact() with the choice.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/policy/eviction_budget.hpp"
#include "kvcache/policy/eviction_policy.hpp"
#include "kvcache/policy/score_accumulator.hpp"
#include "kvcache/policy/select_rows.hpp"

namespace kvcache::examples {

/// How the cached path evicts: the policy, its budget per layer and when it runs.
struct compression_options {
    eviction_policy policy = eviction_policy::none;
    /// Rows a layer keeps: tokens, or a ratio of the sequence's length (its
    /// position count, what a full cache would hold), never below sinks + recent.
    eviction_budget budget = eviction_budget::of_ratio(1.0);
    bool pyramid = false;       ///< PyramidKV budgets (pyramid_budgets) instead of the same for every layer
    int compress_every = 1;     ///< decode steps between compactions; 0: only after a prefill
    /// Also compact after any pass that leaves fewer than this many pages free
    /// or evictable in the pool (the pool running short); 0: never.
    int compress_when_free_below = 0;
    int sinks = 4;              ///< first rows always kept
    int recent = 8;             ///< last rows always kept
    int observation_window = 16;  ///< snapkv: the prompt's last queries whose attention ranks the rows
    int pool = 7;               ///< snapkv: rows max-pooled around each row
    std::uint64_t seed = 0;     ///< random: the base seed

    bool active() const noexcept { return policy != eviction_policy::none; }

    /// The library's selection options of one compaction (random: a seed of
    /// the base seed, the layer and the compaction's number, so the choices differ).
    selection_options selection(int layer, int compaction) const {
        selection_options s;
        s.policy = policy;
        s.sinks = sinks;
        s.recent = recent;
        s.pool = pool;
        s.seed = seed ^ (std::uint64_t(compaction) << 20) ^ std::uint64_t(layer);
        return s;
    }

    /// Checks everything a run can refuse before it starts, with the library's
    /// messages: a token budget below sinks + recent, a ratio outside (0, 1],
    /// a bad pool or window.
    void validate() const {
        require(compress_every >= 0, error_code::invalid_argument, "compress_every = ", compress_every,
                " is negative (0: only after a prefill)");
        require(compress_when_free_below >= 0, error_code::invalid_argument, "compress_when_free_below = ",
                compress_when_free_below, " is negative (0: never)");
        require(observation_window > 0, error_code::invalid_argument, "snapkv observation window ", observation_window,
                " must be positive");
        if (budget.tokens == 0) eviction_budget::of_ratio(budget.ratio);  // throws outside (0, 1]
        // select_rows checks sinks, recent, pool and the budget against sinks + recent; a
        // streaming selection over no rows needs no scores, so only those checks run.
        selection_options checked = selection(0, 0);
        checked.policy = eviction_policy::streaming;
        select_rows(checked, budget.tokens != 0 ? budget.tokens : sinks + recent, 0);
    }

    /// The rows each of `layers` layers keeps once the sequence is `length`
    /// positions long: the budget (a ratio resolved against the length,
    /// raised to sinks + recent), the same for every layer or PyramidKV's
    /// decreasing ones of the same total, the last layer keeping half the
    /// average but never fewer than sinks + recent.
    std::vector<int> layer_budgets(int layers, int length) const {
        const int floor_rows = std::max(1, sinks + recent);
        const int average = std::max(budget.resolve(std::max(length, 1)), floor_rows);
        if (!pyramid) return uniform_budgets(layers, average);
        return pyramid_budgets(layers, average, std::max(floor_rows, std::min(average, average / 2)));
    }

    /// A short description for output: "h2o, 32 tokens per layer (uniform), sinks 4, recent 8, every 1 step".
    std::string describe() const {
        std::string s = to_string(policy);
        if (!active()) return s;
        s += budget.tokens ? ", " + std::to_string(budget.tokens) + " tokens" : ", ratio " + ratio_text();
        s += pyramid ? " (pyramid over layers)" : " per layer (uniform)";
        s += ", sinks " + std::to_string(sinks) + ", recent " + std::to_string(recent);
        s += compress_every ? ", every " + std::to_string(compress_every) + " decode step" + (compress_every > 1 ? "s" : "")
                            : ", after prefill only";
        if (policy == eviction_policy::snapkv) s += ", observation window " + std::to_string(observation_window);
        return s;
    }

private:
    std::string ratio_text() const {
        std::string r = std::to_string(budget.ratio);
        while (r.size() > 1 && r.back() == '0') r.pop_back();
        if (!r.empty() && r.back() == '.') r.pop_back();
        return r;
    }
};

/// The scores one sequence's policy has gathered, per layer, and what to ask
/// the next step for:
///   h2o: every step's attention summed (prefill: all its queries), kept
///     rows' sums carried through compactions;
///   snapkv: after a prefill, its last observation_window queries'; in
///     decode, the steps since the last compaction (they are its window);
///   tova: the latest step's (a prefill's last query);
///   knorm, streaming, random: no attention scores.
class policy_scores {
public:
    policy_scores(const compression_options& options, int layers, int kv_heads)
        : options_(options), sums_(layers, kv_heads) {}

    /// Whether attention steps must emit scores.
    bool wanted() const noexcept {
        return options_.policy == eviction_policy::h2o || options_.policy == eviction_policy::snapkv ||
               options_.policy == eviction_policy::tova;
    }

    /// prefill_params::score_queries for a prefill of `tokens` queries.
    int prefill_queries(int tokens) const noexcept {
        if (options_.policy == eviction_policy::snapkv) return std::min(tokens, options_.observation_window);
        if (options_.policy == eviction_policy::tova) return 1;
        return 0;
    }

    /// One step's scores of a layer, [kv_heads][stride] over its first `rows` visible rows.
    void record(int layer, span<const float> scores, int stride, int rows, bool prefill) {
        const bool replace = options_.policy == eviction_policy::tova ||
                             (options_.policy == eviction_policy::snapkv && prefill);
        if (replace) sums_.keep(layer, span<const int>());
        sums_.add(layer, scores, stride, rows);
    }

    /// The layer's scores for select_rows (empty when none were recorded).
    row_scores of(int layer) const {
        if (sums_.rows(layer) == 0) return {};
        return {sums_.scores(layer), sums_.kv_heads(), sums_.rows(layer)};
    }

    /// The layer's rows left without a compaction (a sliding window's ring
    /// moved on): every policy's scores of the rows at `staying` stay theirs.
    void follow(int layer, const std::vector<int>& staying) {
        sums_.keep(layer, span<const int>(staying.data(), staying.size()));
    }

    /// The cache kept `kept` of the layer's rows.
    void kept(int layer, const std::vector<int>& kept) {
        if (options_.policy == eviction_policy::h2o && sums_.rows(layer) > 0)
            sums_.keep(layer, span<const int>(kept.data(), kept.size()));
        else
            sums_.keep(layer, span<const int>());  // snapkv's window and tova's step start again
    }

private:
    compression_options options_;
    score_accumulator sums_;
};

/// When a sequence is compacted: at the end of a pass in which some layer
/// holds more rows than its budget, if the pass was a prefill, or at least
/// compress_every decode passes ran since the last compaction (so, once over
/// budget, a layer never holds more than budget + compress_every - 1 rows).
class compaction_schedule {
public:
    explicit compaction_schedule(int compress_every) : every_(compress_every) {}

    /// Counts a finished pass; true when a compaction is due if some layer is over budget.
    bool due_after(bool prefill) {
        if (!prefill) ++decode_passes_;
        return prefill || (every_ > 0 && decode_passes_ >= every_);
    }
    /// A compaction ran.
    void compacted() noexcept {
        decode_passes_ = 0;
        ++count_;
    }
    /// Compactions so far.
    int count() const noexcept { return count_; }

private:
    int every_;
    int decode_passes_ = 0;
    int count_ = 0;
};

}  // namespace kvcache::examples
