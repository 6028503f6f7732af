// How many rows a sequence's layer keeps: a budget in tokens or as a ratio
// of its rows, and its spread over layers (uniform, or PyramidKV's linearly
// decreasing one with the same total).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvcache/core/error.hpp"

namespace kvcache {

/// Rows a layer keeps: a number of tokens, or a ratio in (0, 1] of its rows.
struct eviction_budget {
    int tokens = 0;      ///< > 0: keep this many rows (all when fewer)
    double ratio = 0.0;  ///< used when tokens is 0: keep ceil(ratio x rows)

    /// A budget of n tokens (n > 0).
    static eviction_budget of_tokens(int n) {
        require(n > 0, error_code::invalid_argument, "eviction budget of ", n, " tokens must be positive");
        return {n, 0.0};
    }
    /// A budget of ratio x rows, ratio in (0, 1].
    static eviction_budget of_ratio(double r) {
        require(r > 0.0 && r <= 1.0, error_code::invalid_argument, "eviction budget ratio ", r, " is outside (0, 1]");
        return {0, r};
    }

    /// The rows kept of `rows`: min(tokens, rows), or ceil(ratio x rows).
    int resolve(int rows) const {
        require(rows >= 0, error_code::invalid_argument, "rows = ", rows, " is negative");
        if (tokens != 0) {
            require(tokens > 0, error_code::invalid_argument, "eviction budget of ", tokens, " tokens must be positive");
            return tokens < rows ? tokens : rows;
        }
        require(ratio > 0.0 && ratio <= 1.0, error_code::invalid_argument, "eviction budget ratio ", ratio,
                " is outside (0, 1] (and tokens is 0)");
        const int kept = int(std::ceil(ratio * double(rows) - 1e-9));  // 0.5 x 10 is 5, not 6 from rounding
        return kept < rows ? kept : rows;
    }
};

/// Every layer the same budget.
inline std::vector<int> uniform_budgets(int layers, int budget) {
    require(layers > 0, error_code::invalid_argument, "layers = ", layers, " must be positive");
    require(budget > 0, error_code::invalid_argument, "budget = ", budget, " must be positive");
    return std::vector<int>(std::size_t(layers), budget);
}

/// PyramidKV budgets: layer l of L gets
///   smallest + floor(2 (average - smallest) (L - 1 - l) / (L - 1)),
/// decreasing linearly from about 2 average - smallest at layer 0 to
/// `smallest` at the last; the rest of L x average, fewer than L rows, goes
/// one row each to the first layers. So the budgets never increase with the
/// layer and sum to exactly L x average (one layer: average).
inline std::vector<int> pyramid_budgets(int layers, int average, int smallest) {
    require(layers > 0, error_code::invalid_argument, "layers = ", layers, " must be positive");
    require(smallest > 0, error_code::invalid_argument, "pyramid smallest budget ", smallest, " must be positive");
    require(smallest <= average, error_code::invalid_argument, "pyramid smallest budget ", smallest,
            " exceeds the average budget ", average);
    std::vector<int> budgets(std::size_t(layers), average);
    if (layers == 1) return budgets;
    const std::int64_t spread = 2 * std::int64_t(average - smallest);
    std::int64_t total = 0;
    for (int l = 0; l < layers; ++l) {
        budgets[std::size_t(l)] = smallest + int(spread * (layers - 1 - l) / (layers - 1));
        total += budgets[std::size_t(l)];
    }
    const std::int64_t rest = std::int64_t(layers) * average - total;  // in [0, layers): the floors' remainders
    for (std::int64_t l = 0; l < rest; ++l) ++budgets[std::size_t(l)];
    return budgets;
}

}  // namespace kvcache
