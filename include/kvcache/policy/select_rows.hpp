// Turns per-row scores into the rows a sequence's layer keeps: the sinks and
// the recent window always, the rest ranked by the policy. Compaction keeps
// the same rows for every KV head of a layer, so per-head scores are first
// combined into one importance per row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/policy/eviction_policy.hpp"

namespace kvcache {

/// What select_rows needs besides the scores and the budget.
struct selection_options {
    eviction_policy policy = eviction_policy::none;
    int sinks = 4;            ///< the first rows, always kept
    int recent = 32;          ///< the last rows, always kept
    int pool = 7;             ///< snapkv: rows max-pooled around each row (odd, >= 1)
    std::uint64_t seed = 0;   ///< random: the choice is a function of the seed and the rows alone
};

/// Per-row scores of one sequence's layer: [kv_heads][stride], row i of head h at h x stride + i.
struct row_scores {
    span<const float> values;  ///< empty: no scores
    int kv_heads = 0;
    int stride = 0;  ///< entries per KV head, >= the rows selected over
};

namespace detail {

/// splitmix64: a generator whose sequence is fixed by its definition (the
/// standard distributions' are not), so a seed selects the same rows everywhere.
inline std::uint64_t split_mix(std::uint64_t& state) noexcept {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/// The importance of each row [0, rows) under the policy: higher is kept first.
inline std::vector<double> importance(const selection_options& options, int rows, const row_scores& scores) {
    std::vector<double> result(std::size_t(rows), 0.0);
    switch (options.policy) {
    case eviction_policy::streaming:  // the more recent, the more important
        for (int i = 0; i < rows; ++i) result[std::size_t(i)] = i;
        return result;
    case eviction_policy::random: {  // a seeded Fisher-Yates permutation's ranks
        std::vector<int> order(static_cast<std::size_t>(rows), 0);
        for (int i = 0; i < rows; ++i) order[std::size_t(i)] = i;
        std::uint64_t state = options.seed;
        for (int i = rows - 1; i > 0; --i) std::swap(order[std::size_t(i)], order[split_mix(state) % std::uint64_t(i + 1)]);
        for (int rank = 0; rank < rows; ++rank) result[std::size_t(order[std::size_t(rank)])] = rank;
        return result;
    }
    default: break;
    }
    const int half = options.pool / 2;
    for (int h = 0; h < scores.kv_heads; ++h) {
        const float* head = scores.values.data() + std::size_t(h) * scores.stride;
        for (int i = 0; i < rows; ++i) {
            require(std::isfinite(head[i]), error_code::invalid_argument, "score of row ", i, " of KV head ", h, " is ",
                    head[i], " (not finite)");
            double value = head[i];
            if (options.policy == eviction_policy::snapkv)  // the largest score of the rows around i
                for (int j = std::max(0, i - half); j <= std::min(rows - 1, i + half); ++j) value = std::max(value, double(head[j]));
            // knorm: a low key norm marks an important row.
            result[std::size_t(i)] += options.policy == eviction_policy::knorm ? -value : value;
        }
    }
    return result;
}

}  // namespace detail

/// The visible rows of a sequence's layer to keep, ascending: every row when
/// rows <= budget or the policy is none; else exactly `budget` rows: the
/// first `sinks`, the last `recent`, and the remaining budget filled with the
/// rows between them of highest importance:
///   h2o, snapkv, tova: the scores summed over KV heads (snapkv: each head's
///     scores max-pooled over the `pool` rows centred on the row first);
///   knorm: minus the scores (key norms) summed over KV heads;
///   streaming: the row's index (the most recent); random: a seeded permutation.
/// Ties go to the more recent row. Throws when the budget is below sinks +
/// recent, the policy needs scores and none are given, or their sizes are wrong.
inline std::vector<int> select_rows(const selection_options& options, int budget, int rows, const row_scores& scores = {}) {
    require(rows >= 0, error_code::invalid_argument, "rows = ", rows, " is negative");
    require(options.sinks >= 0, error_code::invalid_argument, "selection sinks = ", options.sinks, " is negative");
    require(options.recent >= 0, error_code::invalid_argument, "selection recent = ", options.recent, " is negative");
    require(options.pool >= 1 && options.pool % 2 == 1, error_code::invalid_argument, "selection pool = ", options.pool,
            " must be odd and >= 1");
    require(budget >= options.sinks + options.recent, error_code::invalid_argument, "eviction budget ", budget,
            " is below sinks ", options.sinks, " + recent ", options.recent, " = ", options.sinks + options.recent);
    if (needs_scores(options.policy)) {
        require(!scores.values.empty(), error_code::invalid_argument, "eviction policy ", to_string(options.policy),
                " needs ", scores_needed(options.policy), " but no scores were given");
        require(scores.kv_heads > 0, error_code::invalid_argument, "row_scores.kv_heads = ", scores.kv_heads,
                " must be positive");
        require(scores.stride >= rows, error_code::invalid_argument, "row_scores.stride = ", scores.stride,
                " is below the ", rows, " rows selected over");
        require(scores.values.size() == std::size_t(scores.kv_heads) * std::size_t(scores.stride),
                error_code::invalid_argument, "row_scores holds ", scores.values.size(), " values but kv_heads ",
                scores.kv_heads, " x stride ", scores.stride, " = ", std::size_t(scores.kv_heads) * scores.stride,
                " are needed");
    }
    std::vector<int> kept;
    if (options.policy == eviction_policy::none || rows <= budget) {
        for (int i = 0; i < rows; ++i) kept.push_back(i);
        return kept;
    }
    // rows > budget >= sinks + recent: the sinks and the recent window do not overlap.
    const std::vector<double> rank = detail::importance(options, rows, scores);
    std::vector<int> middle;
    for (int i = options.sinks; i < rows - options.recent; ++i) middle.push_back(i);
    const std::size_t wanted = std::size_t(budget - options.sinks - options.recent);
    std::partial_sort(middle.begin(), middle.begin() + std::ptrdiff_t(wanted), middle.end(), [&](int a, int b) {
        return rank[std::size_t(a)] != rank[std::size_t(b)] ? rank[std::size_t(a)] > rank[std::size_t(b)] : a > b;
    });
    for (int i = 0; i < options.sinks; ++i) kept.push_back(i);
    kept.insert(kept.end(), middle.begin(), middle.begin() + std::ptrdiff_t(wanted));
    for (int i = rows - options.recent; i < rows; ++i) kept.push_back(i);
    std::sort(kept.begin(), kept.end());
    return kept;
}

}  // namespace kvcache
