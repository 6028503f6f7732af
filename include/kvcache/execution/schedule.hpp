// How the emulator orders threads between synchronisation points, and the
// other options of an emulated launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/execution/context.hpp"

namespace kvcache {

/// The order in which the emulator resumes the threads of a block between
/// barriers (and the order of blocks). Deterministic for a given seed.
struct emulator_schedule {
    /// The three orders.
    enum class kind {
        in_order,  ///< thread 0, 1, 2, ... (blocks in launch order)
        reverse,   ///< last thread first (blocks in reverse launch order)
        shuffled,  ///< a fresh seeded permutation at every round (blocks permuted too)
    };

    kind order = kind::in_order;  ///< which order
    std::uint64_t seed = 0;       ///< the permutation seed (shuffled only)

    /// Threads in index order.
    static constexpr emulator_schedule in_order() noexcept { return {kind::in_order, 0}; }
    /// Threads in reverse index order.
    static constexpr emulator_schedule reverse() noexcept { return {kind::reverse, 0}; }
    /// Threads in a seeded pseudo-random order, redrawn at every round.
    static constexpr emulator_schedule shuffled(std::uint64_t seed) noexcept { return {kind::shuffled, seed}; }
};

/// "in_order", "reverse" or "shuffled(seed)", for test messages.
inline std::string to_string(const emulator_schedule& schedule) {
    switch (schedule.order) {
    case emulator_schedule::kind::in_order: return "in_order";
    case emulator_schedule::kind::reverse: return "reverse";
    case emulator_schedule::kind::shuffled: return "shuffled(" + std::to_string(schedule.seed) + ")";
    }
    return "unknown";
}

/// Options of one emulated launch.
struct emulator_options {
    emulator_schedule schedule{};                                   ///< thread order between barriers
    std::size_t shared_memory_limit = default_shared_memory_limit;  ///< largest dynamic shared memory accepted
    std::size_t stack_bytes = 64u * 1024u;  ///< stack of each emulated thread; a body needing more crashes
    int worker_threads = 1;                 ///< OS threads running blocks in parallel (1: the caller only)
};

/// The schedules every kernel test should pass: in order, reverse and two seeded shuffles.
inline std::vector<emulator_schedule> standard_schedules(std::uint64_t seed = 0x6b76636163686531ull) {
    return {emulator_schedule::in_order(), emulator_schedule::reverse(), emulator_schedule::shuffled(seed),
            emulator_schedule::shuffled(seed + 1)};
}

/// Calls run(options) once per schedule, with `base` changed only in its
/// schedule; a test wraps its emulate-and-compare in `run`.
/// @tparam Function callable as run(const emulator_options&)
template <class Function>
void for_each_schedule(Function&& run, const std::vector<emulator_schedule>& schedules = standard_schedules(),
                       const emulator_options& base = {}) {
    for (const emulator_schedule& schedule : schedules) {
        emulator_options options = base;
        options.schedule = schedule;
        run(static_cast<const emulator_options&>(options));
    }
}

}  // namespace kvcache
