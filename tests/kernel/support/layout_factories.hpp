// Factories of the shipped layouts for the kernel tests: each makes storage
// for a context_case and a view over it, with slots and pages deliberately out
// of order so nothing passes by accident of identity mappings.
#pragma once

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "attention_harness.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/layout.hpp"

namespace kvcache_test {

/// An int array in the factory's memory (host_buffer here; the GPU test uses managed memory).
template <template <class> class Buffer>
Buffer<int> int_buffer(const std::vector<int>& values) {
    Buffer<int> buffer(std::max<std::size_t>(values.size(), 1));
    for (std::size_t i = 0; i < values.size(); ++i) buffer[i] = values[i];
    return buffer;
}

/// Key and value buffers of `rows` stored rows each, a K/V pair's sides in their own types.
template <class Keys, class Values>
void allocate_rows(Keys& keys, Values& values, std::size_t rows, int head_dim) {
    using key = std::remove_reference_t<decltype(keys[0])>;
    using value = std::remove_reference_t<decltype(values[0])>;
    keys = Keys(rows * std::size_t(kvcache::row_elements<key>(head_dim)));
    values = Values(rows * std::size_t(kvcache::row_elements<value>(head_dim)));
}

/// Contiguous slabs with capacity above the longest sequence and slots reversed.
template <template <class> class Buffer = host_buffer>
struct contiguous_factory_in {
    static constexpr const char* name = "contiguous";
    template <class T>
    using buffer = Buffer<T>;
    template <class Element, class Heads>
    struct owner {
        int sequences = 0, capacity = 0;
        Buffer<int> lengths, slots;
        Buffer<kvcache::key_element_t<Element>> keys;      // a K/V pair's sides in their own types
        Buffer<kvcache::value_element_t<Element>> values;
        Heads heads{};
        contiguous_view<Element, Heads> view() {
            return contiguous_view<Element, Heads>::packed(keys.data(), values.data(), lengths.data(), slots.data(),
                                                           sequences, capacity, heads);
        }
    };
    template <class Element, class Heads>
    static std::unique_ptr<owner<Element, Heads>> make(const context_case& c, unsigned, const Heads& heads = Heads{}) {
        auto o = std::make_unique<owner<Element, Heads>>();
        o->heads = heads;
        const int n = int(c.lengths.size());
        o->sequences = n;
        o->lengths = int_buffer<Buffer>(c.lengths);
        o->capacity = *std::max_element(c.lengths.begin(), c.lengths.end()) + 3;
        std::vector<int> slots;
        for (int i = 0; i < n; ++i) slots.push_back(n - 1 - i);
        o->slots = int_buffer<Buffer>(slots);
        const std::size_t rows = std::size_t(n) * heads.kv_heads() * o->capacity;
        allocate_rows(o->keys, o->values, rows, Heads::head_dim);
        return o;
    }
};

/// Pages of c.run_length tokens, handed out from a pool in shuffled order, with spare pages.
template <template <class> class Buffer = host_buffer>
struct paged_factory_in {
    static constexpr const char* name = "paged";
    template <class T>
    using buffer = Buffer<T>;
    template <class Element, class Heads>
    struct owner {
        int sequences = 0, page_size = 1;
        Buffer<int> lengths, offsets, pages;
        Buffer<kvcache::key_element_t<Element>> keys;      // a K/V pair's sides in their own types
        Buffer<kvcache::value_element_t<Element>> values;
        Heads heads{};
        paged_view<Element, Heads> view() {
            return paged_view<Element, Heads>::packed(keys.data(), values.data(), offsets.data(), pages.data(),
                                                      lengths.data(), sequences, page_size, heads);
        }
    };
    template <class Element, class Heads>
    static std::unique_ptr<owner<Element, Heads>> make(const context_case& c, unsigned seed,
                                                       const Heads& heads = Heads{}) {
        auto o = std::make_unique<owner<Element, Heads>>();
        o->heads = heads;
        o->sequences = int(c.lengths.size());
        o->lengths = int_buffer<Buffer>(c.lengths);
        o->page_size = c.run_length;
        int needed = 0;
        std::vector<int> offsets(1, 0);
        for (int length : c.lengths) {
            needed += (length + o->page_size - 1) / o->page_size;
            offsets.push_back(needed);
        }
        o->offsets = int_buffer<Buffer>(offsets);
        const int pool = needed + 2;
        std::vector<int> order(pool);
        std::iota(order.begin(), order.end(), 0);
        std::mt19937 random(seed);
        std::shuffle(order.begin(), order.end(), random);
        o->pages = int_buffer<Buffer>(std::vector<int>(order.begin(), order.begin() + needed));
        const std::size_t rows = std::size_t(pool) * heads.kv_heads() * o->page_size;
        allocate_rows(o->keys, o->values, rows, Heads::head_dim);
        return o;
    }
};

/// Sinks plus a ring of window + longest chunk - 1 rows (so a prefill chunk
/// still sees its own window); window 0 means a ring holding everything.
template <template <class> class Buffer = host_buffer>
struct sliding_window_factory_in {
    static constexpr const char* name = "sliding_window";
    template <class T>
    using buffer = Buffer<T>;
    template <class Element, class Heads>
    struct owner {
        int sequences = 0, sinks = 0, ring = 1, window = 1;
        Buffer<int> lengths, slots;
        Buffer<kvcache::key_element_t<Element>> keys;      // a K/V pair's sides in their own types
        Buffer<kvcache::value_element_t<Element>> values;
        Heads heads{};
        sliding_window_view<Element, Heads> view() {
            return sliding_window_view<Element, Heads>::packed(keys.data(), values.data(), lengths.data(), slots.data(),
                                                               sequences, sinks, ring, window, heads);
        }
    };
    template <class Element, class Heads>
    static std::unique_ptr<owner<Element, Heads>> make(const context_case& c, unsigned, const Heads& heads = Heads{}) {
        auto o = std::make_unique<owner<Element, Heads>>();
        o->heads = heads;
        o->sequences = int(c.lengths.size());
        o->lengths = int_buffer<Buffer>(c.lengths);
        const int longest = *std::max_element(c.lengths.begin(), c.lengths.end());
        const int chunk = *std::max_element(c.chunk.begin(), c.chunk.end());
        o->sinks = c.sinks;
        o->window = c.window > 0 ? c.window : longest;
        o->ring = c.window > 0 ? c.window + chunk - 1 : longest;
        const int n = int(c.lengths.size());
        std::vector<int> slots;
        for (int i = 0; i < n; ++i) slots.push_back((i + 1) % n);
        o->slots = int_buffer<Buffer>(slots);
        const std::size_t rows = std::size_t(n) * heads.kv_heads() * (o->sinks + o->ring);
        allocate_rows(o->keys, o->values, rows, Heads::head_dim);
        return o;
    }
};

/// A factory whose views carry scales (fp8 caches): Factory's storage, each
/// view given key and value scales far from 1 and from each other, so a
/// backend that drops or swaps one is off by that factor. A layout without a
/// scales member (the scatter test layout) reads with 1 and 1.
/// @tparam Factory a layout factory
template <class Factory>
struct scaled_factory {
    static constexpr const char* name = Factory::name;
    static constexpr kvcache::kv_scales scales{0.0625f, 0.25f};
    template <class T>
    using buffer = typename Factory::template buffer<T>;
    template <class Element, class Heads>
    struct owner {
        decltype(Factory::template make<Element, Heads>(std::declval<const context_case&>(), 0u)) storage;
        auto view() {
            auto v = storage->view();
            if constexpr (kvcache::detail::has_scales<decltype(v)>::value) v.scales = scales;
            return v;
        }
    };
    template <class Element, class Heads>
    static std::unique_ptr<owner<Element, Heads>> make(const context_case& c, unsigned seed, const Heads& heads = Heads{}) {
        return std::make_unique<owner<Element, Heads>>(owner<Element, Heads>{Factory::template make<Element, Heads>(c, seed, heads)});
    }
};

using contiguous_factory = contiguous_factory_in<>;
using paged_factory = paged_factory_in<>;
using sliding_window_factory = sliding_window_factory_in<>;

}  // namespace kvcache_test
