// Repeated timing with warm-up, summarised as median, min and max: the
// machines are noisy, so single runs and means are not reported.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace kvcache::bench {

/// Seconds per run: median with the spread around it.
struct timing {
    double median = 0;  ///< seconds
    double min = 0;     ///< seconds
    double max = 0;     ///< seconds
    int runs = 0;       ///< measured runs (after warm-up)
};

/// Summarises a list of per-run seconds.
inline timing summarise(std::vector<double> seconds) {
    timing t;
    if (seconds.empty()) return t;
    std::sort(seconds.begin(), seconds.end());
    const std::size_t n = seconds.size();
    t.median = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
    t.min = seconds.front();
    t.max = seconds.back();
    t.runs = static_cast<int>(n);
    return t;
}

/// Wall-clock seconds of one call.
template <class Function>
double seconds_of(Function&& function) {
    const auto start = std::chrono::steady_clock::now();
    function();
    const auto stop = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(stop - start).count();
}

/// Runs `function` warmup times unmeasured, then `repeats` times measured.
/// @tparam Function a callable taking no arguments
template <class Function>
timing measure(Function&& function, int warmup, int repeats) {
    for (int i = 0; i < warmup; ++i) function();
    std::vector<double> seconds;
    seconds.reserve(static_cast<std::size_t>(repeats));
    for (int i = 0; i < repeats; ++i) seconds.push_back(seconds_of(function));
    return summarise(std::move(seconds));
}

/// Like measure(), but keeps repeating past `repeats` until `min_seconds` of
/// measured time have passed (at most max_repeats runs): short calls get
/// enough samples that a scheduler hiccup moves the median little.
/// @tparam Function a callable taking no arguments
template <class Function>
timing measure_for(Function&& function, int warmup, int repeats, double min_seconds, int max_repeats = 1000) {
    for (int i = 0; i < warmup; ++i) function();
    std::vector<double> seconds;
    double total = 0;
    while (static_cast<int>(seconds.size()) < repeats ||
           (total < min_seconds && static_cast<int>(seconds.size()) < max_repeats)) {
        seconds.push_back(seconds_of(function));
        total += seconds.back();
    }
    return summarise(std::move(seconds));
}

}  // namespace kvcache::bench
