// Helpers shared by the cache tests: deterministic rows and a snapshot of an
// owner's whole observable state, to show a failed operation changed nothing.
#pragma once

#include <cstddef>
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

/// Version 1's checksum, 64-bit FNV-1a, as docs/layouts.md defines it.
inline std::uint64_t documented_fnv1a(const std::string& bytes) {
    std::uint64_t hash = 14695981039346656037ull;
    for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
    return hash;
}

/// Version 2's checksum as docs/layouts.md defines it, written from that text
/// over a whole buffer at once (the library hashes in pieces as it streams).
inline std::uint64_t documented_striped_hash(const std::string& bytes) {
    constexpr std::uint64_t p1 = 0x9e3779b185ebca87ull, p2 = 0xc2b2ae3d27d4eb4full, p3 = 0x165667b19e3779f9ull,
                            p4 = 0x85ebca77c2b2ae63ull, p5 = 0x27d4eb2f165667c5ull;
    auto rotl = [](std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
    auto round = [&](std::uint64_t lane, std::uint64_t w) { return rotl(lane + w * p2, 31) * p1; };
    auto word = [&](std::size_t at) {  // little-endian, whatever the host
        std::uint64_t w = 0;
        for (int b = 7; b >= 0; --b) w = (w << 8) | static_cast<unsigned char>(bytes[at + b]);
        return w;
    };
    std::uint64_t lane[4] = {p1 + p2, p2, 0, 0 - p1};
    std::size_t at = 0;
    for (; at + 32 <= bytes.size(); at += 32)
        for (int i = 0; i < 4; ++i) lane[i] = round(lane[i], word(at + 8 * i));
    std::uint64_t h = rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18);
    h = (h ^ std::uint64_t(bytes.size())) * p2;
    for (; at + 8 <= bytes.size(); at += 8) h = rotl(h ^ round(0, word(at)), 27) * p1 + p4;
    for (; at < bytes.size(); ++at) h = rotl(h ^ (static_cast<unsigned char>(bytes[at]) * p5), 11) * p1;
    h ^= h >> 33;
    h *= p2;
    h ^= h >> 29;
    h *= p3;
    return h ^ (h >> 32);
}

/// `payload` followed by the checksum format `version` carries.
inline std::string with_checksum(const std::string& payload, std::uint32_t version) {
    const std::uint64_t sum = version <= 1 ? documented_fnv1a(payload) : documented_striped_hash(payload);
    std::string out = payload;
    out.append(reinterpret_cast<const char*>(&sum), sizeof sum);
    return out;
}

/// A saved file rewritten as format `version`: the version field set and the
/// checksum recomputed as that version defines it.
inline std::string as_version(const std::string& file, std::uint32_t version) {
    std::string payload = file.substr(0, file.size() - 8);
    std::memcpy(&payload[8], &version, sizeof version);
    return with_checksum(payload, version);
}

/// Cache files written by hand from the format in docs/layouts.md (not with
/// the library's writer), so tests can make files no owner would save.
class file_builder {
public:
    /// Starts a file: layout and element kinds as their enum values, heads,
    /// layers, the three layout parameters, the sequence count and the format
    /// version (which picks the checksum).
    file_builder(std::uint32_t layout, std::uint32_t element, int query_heads, int kv_heads, int head_dim, int layers,
                 int p0, int p1, int p2, std::uint32_t sequences, std::uint32_t version = 2)
        : layers_(layers), row_bytes_(std::size_t(kv_heads) * head_dim * (element == 0 ? 4 : 2)), version_(version) {
        bytes_.append("KVCACHE", 8);  // seven letters and the terminating NUL
        put<std::uint32_t>(version);
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
    /// The bytes so far followed by their version's checksum.
    std::string finish() const { return with_checksum(bytes_, version_); }

private:
    std::string bytes_;
    int layers_;
    std::size_t row_bytes_;
    std::uint32_t version_;
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

/// Host memory whose streams are numbers, so a test policy deriving from it
/// can record which stream a cache orders each copy on (CUDA streams on a
/// device); the copies themselves are done on return.
struct numbered_stream_memory : kvcache::host_memory {
    using stream_type = int;
    static void synchronize() noexcept {}
    static void synchronize(stream_type) noexcept {}  // the policy's wait for one stream, as host_memory's
    static void copy_from_host_async(void* destination, const void* source, std::size_t bytes, stream_type) {
        kvcache::host_memory::copy_from_host(destination, source, bytes);
    }
    static void copy_to_host_async(void* destination, const void* source, std::size_t bytes, stream_type) {
        kvcache::host_memory::copy_to_host(destination, source, bytes);
    }
    static void copy_within_async(void* destination, const void* source, std::size_t bytes, stream_type) {
        kvcache::host_memory::copy_within(destination, source, bytes);
    }
};

}  // namespace test_support
