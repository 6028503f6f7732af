// Wall-clock timing of the examples' figures, on steady_clock (not moved by clock changes).
#pragma once

#include <chrono>

namespace kvcache::examples {

/// Seconds on steady_clock since start.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvcache::examples
