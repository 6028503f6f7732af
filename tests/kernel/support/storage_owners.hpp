// What the storage-type tests (fp8, int8 on each backend) build their caches
// from: random rows shaped like keys, one owner of each layout sized alike,
// and the largest-value and largest-difference measures their bounds use.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"

namespace kvcache_test {

/// Rows about N(0, 1) with a few larger outliers (what keys have).
inline std::vector<float> random_rows(std::size_t count, unsigned seed) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> rows(count);
    for (std::size_t i = 0; i < count; ++i) rows[i] = normal(generator) * (i % 37 == 0 ? 4.0f : 1.0f);
    return rows;
}

/// The three owners, built alike for each element type and head config: 2
/// layers, 2 sequences; the window (24 recent, 2 sinks) is shorter than the
/// tests' sequences, so the ring wraps and positions drop.
/// @tparam Element the stored element type
/// @tparam Heads a head_config
template <class Element, class Heads>
struct storage_owners {
    static kvcache::contiguous_cache<Element, Heads> contiguous() { return {2, 2, 96}; }
    static kvcache::paged_cache<Element, Heads> paged() { return {2, 32, 16}; }
    static kvcache::sliding_window_cache<Element, Heads> window() { return {2, 2, 24, 2, 48}; }
};

/// Largest |x| of the rows: the bounds of the lossy types are relative to it.
inline float largest(const std::vector<float>& x) {
    float m = 0.0f;
    for (float v : x) m = std::max(m, std::fabs(v));
    return m;
}

/// Largest |a[i] - b[i]|, in double.
inline double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

}  // namespace kvcache_test
