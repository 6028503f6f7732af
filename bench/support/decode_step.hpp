// A timed decode step that owns its filled cache: benchmarks that time
// several caches in turn keep one such step per cache.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "harness/timing.hpp"
#include "kvcache/backend/cpu.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

/// Seconds of one CPU decode over the filled cache's batch, per call; the
/// step owns the cache, its query rows (random, seed 7) and its outputs.
/// @tparam Filled a filled_cache
template <class Filled>
std::function<double()> timed_decode_step(Filled filled) {
    using heads = typename decltype(Filled::cache)::element_type::heads;
    auto owned = std::make_shared<Filled>(std::move(filled));
    const std::size_t q_elements = owned->batch.size() * std::size_t(heads::query_heads()) * heads::head_dim;
    auto queries = std::make_shared<std::vector<float>>(random_floats(q_elements, 7));
    auto outputs = std::make_shared<std::vector<float>>(q_elements);
    return [owned, queries, outputs] {
        const cpu_backend cpu;
        const auto view = owned->view();
        return seconds_of([&] { cpu.decode(decode_params(view, *queries, *outputs)); });
    };
}

}  // namespace kvcache::bench
