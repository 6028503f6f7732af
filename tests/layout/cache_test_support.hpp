// Helpers shared by the cache tests: deterministic rows and a snapshot of an
// owner's whole observable state, to show a failed operation changed nothing.
#pragma once

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/cache.hpp"

namespace test_support {

/// n tokens' rows [token][kv_head][head_dim] with values exact in fp16.
template <class Element, class Heads>
std::vector<Element> rows(int n, int salt) {
    std::vector<Element> out(std::size_t(n) * Heads::kv_heads() * Heads::head_dim);
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
        out << "|tiers " << s.host_pages_used << "," << s.host_pages_cached << "," << s.sequences_swapped_out << ","
            << s.disk_pages_used;
        // The running counters too: a refused call must not count anything either.
        out << "|counters " << s.prefix_queried_pages << "," << s.prefix_hit_pages << "," << s.pages_swapped_out << ","
            << s.pages_swapped_in << "," << s.swap_copies_avoided << "," << s.pages_spilled << ","
            << s.host_prefix_hit_pages << "," << s.pages_written_to_disk << "," << s.disk_prefix_hit_pages << ","
            << s.disk_pages_refused << "," << s.bytes_written_to_disk << "," << s.bytes_read_from_disk << ","
            << s.pool_prefix_miss_pages << "," << s.host_prefix_miss_pages << "," << s.disk_prefix_miss_pages << ","
            << s.disk_write_failures;
        for (auto id : cache.sequences()) out << (cache.swapped_out(id) ? "s" : "r");
        for (auto id : cache.sequences())
            for (int p : cache.pages(id)) out << ";" << p << "x" << cache.page_references(p);
    }
    return out.str();
}

/// Cache files written by hand from the format in docs/layouts.md (not with
/// the library's writer), so tests can make files no owner would save.
class file_builder {
public:
    /// Starts a file: layout and element kinds as their enum values, heads,
    /// layers, the three layout parameters and the sequence count.
    file_builder(std::uint32_t layout, std::uint32_t element, int query_heads, int kv_heads, int head_dim, int layers,
                 int p0, int p1, int p2, std::uint32_t sequences)
        : layers_(layers), row_bytes_(std::size_t(kv_heads) * head_dim * (element == 0 ? 4 : 2)) {
        bytes_.append("KVCACHE", 8);  // seven letters and the terminating NUL
        put<std::uint32_t>(1);
        put(layout);
        put(element);
        for (int v : {query_heads, kv_heads, head_dim, layers, p0, p1, p2}) put<std::int32_t>(v);
        put(sequences);
    }
    /// A record with these positions, no token ids and rows of a repeating byte.
    void record(int length, const std::vector<int>& positions) {
        put<std::int32_t>(length);
        put<std::int32_t>(static_cast<std::int32_t>(positions.size()));
        for (int p : positions) put<std::int32_t>(p);
        put<std::int32_t>(0);
        bytes_.append(positions.size() * layers_ * 2 * row_bytes_, '\x3c');
    }
    /// An empty record: length 0, nothing present, no token ids (12 bytes).
    void empty_record() { record(0, {}); }
    /// Raw 32-bit values, for records that lie about their sizes.
    template <class T>
    void put(T v) {
        bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    /// The bytes so far followed by their FNV-1a 64 checksum.
    std::string finish() const {
        std::uint64_t hash = 14695981039346656037ull;
        for (unsigned char c : bytes_) hash = (hash ^ c) * 1099511628211ull;
        std::string out = bytes_;
        out.append(reinterpret_cast<const char*>(&hash), sizeof hash);
        return out;
    }

private:
    std::string bytes_;
    int layers_;
    std::size_t row_bytes_;
};

/// Rows [token][row] of tokens at positions first, first + 1, ...: each
/// value a function of (token, position, layer) only, so equal token
/// prefixes hold equal rows (what the prefix cache relies on).
inline std::vector<float> token_rows(const std::vector<std::int32_t>& tokens, int first, int layer, bool is_value,
                                     int row) {
    std::vector<float> out;
    for (std::size_t t = 0; t < tokens.size(); ++t)
        for (int i = 0; i < row; ++i)
            out.push_back(static_cast<float>((tokens[t] * 131 + (first + int(t)) * 17 + layer * 7 + i * 3 +
                                              (is_value ? 5 : 0)) % 251) / 8.0f);
    return out;
}

/// Positions 0..n-1.
inline std::vector<int> iota(int n) {
    std::vector<int> out(n);
    for (int i = 0; i < n; ++i) out[i] = i;
    return out;
}

}  // namespace test_support
