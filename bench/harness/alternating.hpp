// Several configurations timed in alternation, round after round, so a noisy
// machine's drifts hit all alike, and each compared with the first by the
// ratio of its time to the first's in the same round.
#pragma once

#include <functional>
#include <vector>

#include "harness/timing.hpp"

namespace kvcache::bench {

/// Calls every step once per round: `warmup` rounds unmeasured, then at least
/// `rounds` measured ones, and more until `min_seconds` of measured time have
/// passed (at most max_rounds). Returns each step's seconds, round by round.
/// A step returns the seconds it measured itself (a setup it does is not timed).
inline std::vector<std::vector<double>> alternate(const std::vector<std::function<double()>>& steps, int warmup,
                                                  int rounds, double min_seconds, int max_rounds) {
    std::vector<std::vector<double>> seconds(steps.size());
    for (int i = 0; i < warmup; ++i)
        for (const auto& step : steps) step();
    double total = 0;
    while (!steps.empty() && (int(seconds[0].size()) < rounds ||
                              (total < min_seconds && int(seconds[0].size()) < max_rounds)))
        for (std::size_t s = 0; s < steps.size(); ++s) {
            seconds[s].push_back(steps[s]());
            total += seconds[s].back();
        }
    return seconds;
}

/// One configuration against the baseline (the first) of an alternate() run.
struct compared_timing {
    timing time;                    ///< its own seconds per round
    timing ratio;                   ///< baseline seconds / its seconds, per round
    double speed_vs_baseline = 0;   ///< baseline median / its median
};

/// Summarises `seconds` and its per-round speed against `baseline` (same rounds).
inline compared_timing compare_to(const std::vector<double>& baseline, const std::vector<double>& seconds) {
    std::vector<double> speedup;
    for (std::size_t r = 0; r < seconds.size() && r < baseline.size(); ++r) speedup.push_back(baseline[r] / seconds[r]);
    compared_timing out;
    out.time = summarise(seconds);
    out.ratio = summarise(std::move(speedup));
    out.speed_vs_baseline = summarise(baseline).median / out.time.median;
    return out;
}

/// alternate() over items that each hold a `step`, every item compared with the first.
/// @tparam Item a type with a member `std::function<double()> step`
template <class Item>
std::vector<compared_timing> compare_in_alternation(const std::vector<Item>& items, int warmup, int rounds,
                                                    double min_seconds, int max_rounds) {
    std::vector<std::function<double()>> steps;
    for (const auto& item : items) steps.push_back(item.step);
    const auto seconds = alternate(steps, warmup, rounds, min_seconds, max_rounds);
    std::vector<compared_timing> compared;
    for (const auto& own : seconds) compared.push_back(compare_to(seconds[0], own));
    return compared;
}

}  // namespace kvcache::bench
