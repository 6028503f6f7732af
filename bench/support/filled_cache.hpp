// A cache owner of each layout, filled with random K/V for a batch of
// sequences, so decode and layout benchmarks time the kernels on real owners'
// memory rather than on hand-made buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/cache/step_plan.hpp"
#include "kvcache/core/element.hpp"

namespace kvcache::bench {

/// The heads of the attention benchmarks: Llama-3-8B's attention shape
/// (32 query heads sharing 8 KV heads, head_dim 128).
using bench_heads = head_config<32, 8, 128>;

/// Sinks of the sliding-window configurations.
inline constexpr int bench_sinks = 4;
/// Tokens per page of the paged configurations.
inline constexpr int bench_page_size = 16;

/// Uniform floats in [-1, 1) from a fixed seed.
inline std::vector<float> random_floats(std::size_t count, std::uint64_t seed) {
    std::mt19937_64 engine(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> out(count);
    for (auto& x : out) x = uniform(engine);
    return out;
}

/// An owner with `batch` sequences whose decode query sees exactly `visible`
/// keys, one layer, every present row written with random values.
/// @tparam Cache static_cache, paged_cache or sliding_window_cache in host memory
template <class Cache>
struct filled_cache {
    std::unique_ptr<Cache> cache;
    std::vector<sequence_id> batch;
    int visible = 0;
    /// Attend-only plan of the batch (no new tokens), made once filled; its type is
    /// what cache.plan() returns (the contiguous_cache base's plan for static_cache).
    typename Cache::plan_type plan;

    /// The view of layer 0 over the batch: the plan's, so views of several filled caches coexist.
    typename Cache::view_type view() const { return plan.view(0); }
    /// Bytes of K and V a decode step over the batch reads, as stored (an int8 row's scale included;
    /// a K/V pair's keys and values each in their own type).
    std::size_t kv_bytes() const {
        return std::size_t(batch.size()) * std::size_t(visible) *
               std::size_t(stored_token_bytes(kinds_of<typename Cache::element_type>(), Cache::heads::kv_heads(),
                                              Cache::heads::head_dim));
    }
};

namespace detail {

/// Writes every present row of each sequence from one random source (an
/// int8 or int4 cache, or a K/V pair, takes the float rows and stores each
/// side in its own type, int8 and int4 rows with their own scales).
template <class Cache>
void write_present_rows(Cache& cache, const std::vector<sequence_id>& batch, int rows_per_sequence) {
    using stored = typename Cache::element_type;
    using element = std::conditional_t<is_row_quantised_v<stored> || is_kv_pair_v<stored>, float, stored>;
    constexpr std::size_t row = std::size_t(Cache::heads::kv_heads()) * Cache::heads::head_dim;
    const std::vector<float> floats = random_floats(std::size_t(rows_per_sequence) * row * 2, 42);
    std::vector<element> keys(std::size_t(rows_per_sequence) * row), values(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        keys[i] = from_float<element>(floats[i]);
        values[i] = from_float<element>(floats[keys.size() + i]);
    }
    for (sequence_id id : batch) {
        const std::vector<int> present = cache.present_positions(id);
        std::size_t i = 0;
        while (i < present.size()) {  // one write per run of consecutive positions
            std::size_t j = i + 1;
            while (j < present.size() && present[j] == present[j - 1] + 1) ++j;
            const std::size_t count = (j - i) * row;
            cache.write(id, 0, present[i], kvcache::span<const element>(keys.data() + i * row, count),
                        kvcache::span<const element>(values.data() + i * row, count), int(j - i));
            i = j;
        }
    }
}

}  // namespace detail

/// Contiguous (static) cache: batch slots of exactly `context` positions.
/// @tparam Element float, kvcache::half, kvcache::bfloat16, an fp8 type, kvcache::qint8 or kvcache::qint4
/// @tparam Heads a head_config with compiled counts
template <class Element, class Heads = bench_heads>
filled_cache<static_cache<Element, Heads>> make_contiguous(int batch, int context) {
    filled_cache<static_cache<Element, Heads>> out;
    out.cache = std::make_unique<static_cache<Element, Heads>>(1, batch, context);
    for (int b = 0; b < batch; ++b) {
        out.batch.push_back(out.cache->add_sequence());
        out.cache->begin_append(out.batch.back(), context);
    }
    out.visible = context;
    detail::write_present_rows(*out.cache, out.batch, context);
    out.plan = out.cache->plan(out.batch);
    return out;
}

/// Paged cache (16-token pages unless told) handed out round-robin across the
/// batch (as a server interleaves requests), so a sequence's pages are not adjacent.
/// @tparam Element float, kvcache::half, kvcache::bfloat16, an fp8 type, kvcache::qint8 or kvcache::qint4
/// @tparam Heads a head_config with compiled counts
template <class Element, class Heads = bench_heads>
filled_cache<paged_cache<Element, Heads>> make_paged(int batch, int context, int page_size = bench_page_size) {
    filled_cache<paged_cache<Element, Heads>> out;
    const int pages_per_sequence = (context + page_size - 1) / page_size;
    out.cache = std::make_unique<paged_cache<Element, Heads>>(1, batch * pages_per_sequence, page_size, false);
    for (int b = 0; b < batch; ++b) out.batch.push_back(out.cache->add_sequence());
    for (int first = 0; first < context; first += page_size)
        for (sequence_id id : out.batch) out.cache->begin_append(id, std::min(page_size, context - first));
    out.visible = context;
    detail::write_present_rows(*out.cache, out.batch, context);
    out.plan = out.cache->plan(out.batch);
    return out;
}

/// Sliding-window cache whose decode query sees `visible` keys (4 sinks plus
/// a window of visible - 4), generated past the ring's end so the ring has
/// wrapped: each sequence's keys come in three runs (sinks, ring tail, ring head).
/// @tparam Element float, kvcache::half, kvcache::bfloat16, an fp8 type, kvcache::qint8 or kvcache::qint4
/// @tparam Heads a head_config with compiled counts
template <class Element, class Heads = bench_heads>
filled_cache<sliding_window_cache<Element, Heads>> make_sliding_window(int batch, int visible) {
    filled_cache<sliding_window_cache<Element, Heads>> out;
    const int window = visible - bench_sinks;
    out.cache = std::make_unique<sliding_window_cache<Element, Heads>>(1, batch, window, bench_sinks, 1);
    const int length = bench_sinks + out.cache->ring() + visible / 2;  // the wrap point in mid-ring
    for (int b = 0; b < batch; ++b) {
        out.batch.push_back(out.cache->add_sequence());
        for (int t = 0; t < length; ++t) out.cache->begin_append(out.batch.back(), 1);
    }
    out.visible = visible;
    detail::write_present_rows(*out.cache, out.batch, bench_sinks + out.cache->ring());
    out.plan = out.cache->plan(out.batch);
    return out;
}

/// Calls body(filled) with a filled cache of the given layout and element type.
/// @tparam Body a generic callable taking filled_cache<Cache>&
template <class Body>
void with_filled_cache(layout_kind layout, element_kind element, int batch, int visible, Body&& body) {
    auto run = [&](auto element_tag) {
        using element_t = decltype(element_tag);
        switch (layout) {
        case layout_kind::contiguous: {
            auto filled = make_contiguous<element_t>(batch, visible);
            body(filled);
            return;
        }
        case layout_kind::paged: {
            auto filled = make_paged<element_t>(batch, visible);
            body(filled);
            return;
        }
        case layout_kind::sliding_window: {
            auto filled = make_sliding_window<element_t>(batch, visible);
            body(filled);
            return;
        }
        }
    };
    if (element == element_kind::fp16)
        run(half{});
    else if (element == element_kind::bf16)
        run(bfloat16{});
    else if (element == element_kind::fp8_e4m3)
        run(float8_e4m3{});
    else if (element == element_kind::fp8_e5m2)
        run(float8_e5m2{});
    else
        run(float{});
}

}  // namespace kvcache::bench
