// What the cached-generation tests share: the sweep over every kvcache layout
// and element type, and the largest logit difference between two traces.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace kvcache::examples::testing {

/// Calls f(cache) for each layout x element type (captured for doctest's
/// messages), the cache options carrying the given page, window, sink and chunk sizes.
/// @tparam F a callable taking const cache_options&
template <class F>
void for_each_cache_kind(int page_size, int window, int sinks, int prefill_chunk, F&& f) {
    for (auto layout : {kvcache::layout_kind::contiguous, kvcache::layout_kind::paged, kvcache::layout_kind::sliding_window})
        for (auto element : {kvcache::element_kind::fp32, kvcache::element_kind::fp16, kvcache::element_kind::bf16}) {
            CAPTURE(std::string(kvcache::to_string(layout)));
            CAPTURE(std::string(kvcache::to_string(element)));
            cache_options cache;
            cache.layout = layout;
            cache.element = element;
            cache.page_size = page_size;
            cache.window = window;
            cache.sinks = sinks;
            cache.prefill_chunk = prefill_chunk;
            f(static_cast<const cache_options&>(cache));
        }
}

/// Largest |logit difference| over every step both traces kept (a's steps index b).
inline double largest_logit_difference(const generation_trace& a, const generation_trace& b) {
    double worst = 0;
    for (std::size_t s = 0; s < a.logits.size(); ++s)
        for (std::size_t i = 0; i < a.logits[s].size(); ++i)
            worst = std::max(worst, double(std::fabs(a.logits[s][i] - b.logits[s][i])));
    return worst;
}

}  // namespace kvcache::examples::testing
