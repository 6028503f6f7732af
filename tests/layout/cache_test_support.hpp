// Helpers shared by the cache tests: deterministic rows and a snapshot of an
// owner's whole observable state, to show a failed operation changed nothing.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/cache.hpp"

namespace test_support {

/// n tokens' rows [token][kv_head][head_dim] with values exact in fp16.
template <class Element, class Heads>
std::vector<Element> rows(int n, int salt) {
    std::vector<Element> out(std::size_t(n) * Heads::kv_heads * Heads::head_dim);
    for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = kvcache::from_float<Element>(static_cast<float>((int(i) * 7 + salt * 13) % 97 - 48) / 4.0f);
    return out;
}

/// Appends n tokens to every layer of a cache with rows from rows(n, salt).
template <class Cache>
void append_all_layers(Cache& cache, kvcache::sequence_id id, int n, int salt) {
    using element = typename Cache::element_type;
    using heads = typename Cache::heads;
    for (int l = 0; l < cache.layers(); ++l) {
        auto k = rows<element, heads>(n, salt + 100 * l), v = rows<element, heads>(n, salt + 100 * l + 50);
        cache.append(id, l, k, v, n);
    }
}

/// Everything observable: ids, lengths and rows (through save), plus pool
/// bookkeeping for paged caches.
template <class Cache>
std::string snapshot(const Cache& cache) {
    std::ostringstream out;
    cache.save(out);
    out << "|";
    for (auto id : cache.sequences()) out << id << ":" << cache.length(id) << ",";
    if constexpr (Cache::kind == kvcache::layout_kind::paged) {
        const auto s = cache.statistics();
        out << "|" << s.pages_used << "," << s.pages_free << "," << s.pages_cached << "," << s.pages_evictable << ","
            << s.evictions << "," << s.copies;
        for (auto id : cache.sequences())
            for (int p : cache.pages(id)) out << ";" << p << "x" << cache.page_references(p);
    }
    return out.str();
}

}  // namespace test_support
