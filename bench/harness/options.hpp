// Command-line options shared by every benchmark of the kvcache bench.
#pragma once

#include <set>
#include <string>

namespace kvcache::bench {

/// What the user asked the bench to run.
struct options {
    bool quick = false;             ///< tiny sizes, few repeats: the CI smoke run
    std::string json_path;          ///< where to write the JSON results ("" = nowhere)
    std::set<std::string> only;     ///< benchmark names to run (empty = all)
    int threads = 0;                ///< worker threads of the CPU backend (0 = all hardware threads)

    /// True when the named benchmark was selected.
    bool wants(const std::string& name) const { return only.empty() || only.count(name) != 0; }
    /// Measured repetitions (after warm-up).
    int repeats() const { return quick ? 3 : 9; }
    /// Least measured time of a short configuration, in seconds (see measure_for).
    double min_seconds() const { return quick ? 0.02 : 0.3; }
    /// Unmeasured runs first (page faults, caches, thread wake-up).
    int warmup() const { return quick ? 1 : 2; }
};

}  // namespace kvcache::bench
