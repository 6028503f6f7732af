// Factories of the shipped layouts for the kernel tests: each makes storage
// for a context_case and a view over it, with slots and pages deliberately out
// of order so nothing passes by accident of identity mappings.
#pragma once

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "attention_harness.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/layout.hpp"

namespace kvcache_test {

/// Contiguous slabs with capacity above the longest sequence and slots reversed.
struct contiguous_factory {
    static constexpr const char* name = "contiguous";
    template <class Element, class Heads>
    struct owner {
        std::vector<int> lengths, slots;
        int capacity = 0;
        host_buffer<Element> keys, values;
        contiguous_view<Element, Heads> view() {
            return contiguous_view<Element, Heads>::packed(keys.data(), values.data(), lengths.data(), slots.data(),
                                                           int(lengths.size()), capacity);
        }
    };
    template <class Element, class Heads>
    static std::unique_ptr<owner<Element, Heads>> make(const context_case& c, unsigned) {
        auto o = std::make_unique<owner<Element, Heads>>();
        o->lengths = c.lengths;
        o->capacity = *std::max_element(c.lengths.begin(), c.lengths.end()) + 3;
        const int n = int(c.lengths.size());
        for (int i = 0; i < n; ++i) o->slots.push_back(n - 1 - i);
        const std::size_t elements = std::size_t(n) * Heads::kv_heads * o->capacity * Heads::head_dim;
        o->keys = host_buffer<Element>(elements);
        o->values = host_buffer<Element>(elements);
        return o;
    }
};

/// Pages of c.run_length tokens, handed out from a pool in shuffled order, with spare pages.
struct paged_factory {
    static constexpr const char* name = "paged";
    template <class Element, class Heads>
    struct owner {
        std::vector<int> lengths, offsets, pages;
        int page_size = 1;
        host_buffer<Element> keys, values;
        paged_view<Element, Heads> view() {
            return paged_view<Element, Heads>::packed(keys.data(), values.data(), offsets.data(), pages.data(),
                                                      lengths.data(), int(lengths.size()), page_size);
        }
    };
    template <class Element, class Heads>
    static std::unique_ptr<owner<Element, Heads>> make(const context_case& c, unsigned seed) {
        auto o = std::make_unique<owner<Element, Heads>>();
        o->lengths = c.lengths;
        o->page_size = c.run_length;
        int needed = 0;
        o->offsets.push_back(0);
        for (int length : c.lengths) {
            needed += (length + o->page_size - 1) / o->page_size;
            o->offsets.push_back(needed);
        }
        const int pool = needed + 2;
        std::vector<int> order(pool);
        std::iota(order.begin(), order.end(), 0);
        std::mt19937 random(seed);
        std::shuffle(order.begin(), order.end(), random);
        o->pages.assign(order.begin(), order.begin() + needed);
        const std::size_t elements = std::size_t(pool) * Heads::kv_heads * o->page_size * Heads::head_dim;
        o->keys = host_buffer<Element>(elements);
        o->values = host_buffer<Element>(elements);
        return o;
    }
};

/// Sinks plus a ring of window + longest chunk - 1 rows (so a prefill chunk
/// still sees its own window); window 0 means a ring holding everything.
struct sliding_window_factory {
    static constexpr const char* name = "sliding_window";
    template <class Element, class Heads>
    struct owner {
        std::vector<int> lengths, slots;
        int sinks = 0, ring = 1, window = 1;
        host_buffer<Element> keys, values;
        sliding_window_view<Element, Heads> view() {
            return sliding_window_view<Element, Heads>::packed(keys.data(), values.data(), lengths.data(), slots.data(),
                                                               int(lengths.size()), sinks, ring, window);
        }
    };
    template <class Element, class Heads>
    static std::unique_ptr<owner<Element, Heads>> make(const context_case& c, unsigned) {
        auto o = std::make_unique<owner<Element, Heads>>();
        o->lengths = c.lengths;
        const int longest = *std::max_element(c.lengths.begin(), c.lengths.end());
        const int chunk = *std::max_element(c.chunk.begin(), c.chunk.end());
        o->sinks = c.sinks;
        o->window = c.window > 0 ? c.window : longest;
        o->ring = c.window > 0 ? c.window + chunk - 1 : longest;
        const int n = int(c.lengths.size());
        for (int i = 0; i < n; ++i) o->slots.push_back((i + 1) % n);
        const std::size_t elements = std::size_t(n) * Heads::kv_heads * (o->sinks + o->ring) * Heads::head_dim;
        o->keys = host_buffer<Element>(elements);
        o->values = host_buffer<Element>(elements);
        return o;
    }
};

}  // namespace kvcache_test
