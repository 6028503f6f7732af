// A sequence's pages carried out of one paged cache and into another: the
// descriptor (configuration, token ids, the prefix cache's chained page
// hashes, per-layer scales) and the rows of each page, each page with its own
// checksum, as one value that turns into bytes and back. A prefill worker
// exports a finished prompt; a decode worker imports it and continues from it
// without recomputing anything. Pages the receiver already caches (a shared
// system prompt) are taken from its prefix cache instead of the payload, and
// an export may leave them out altogether (first_page). A compacted sequence
// and a sliding-window sequence carry only the rows they hold, at their true
// positions (kept).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvcache/cache/checksum.hpp"
#include "kvcache/cache/page_pool.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/cache/serialization.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/span.hpp"

namespace kvcache {

/// One sequence's pages, out of a paged or sliding-window cache
/// (export_pages) and into another of the same layout and configuration
/// (import_pages). A sliding-window export is one block of every position
/// the window holds (page_size = length).
/// @tparam Element the caches' stored element type, or a kv_elements pair
template <class Element>
struct page_export {
    /// What the payload is a vector of: Element itself, or bytes for a
    /// kv_elements pair (its keys and values are rows of two types).
    using payload_element = std::conditional_t<is_kv_pair_v<Element>, unsigned char, Element>;

    kv_kinds element = kinds_of<Element>();  ///< what keys and values are stored as
    layout_kind layout = layout_kind::paged;               ///< the layout it came from and goes to
    head_shape heads{};         ///< the cache's heads (a tensor-parallel shard's, for a shard)
    int shard_rank = 0;         ///< which shard of shard_ranks the rows are (0 of 1: unsharded)
    int shard_ranks = 1;        ///< tensor-parallel ranks the model was split over
    int page_size = 0;          ///< tokens per page
    int layers = 0;             ///< layers, each with its own rows
    int length = 0;             ///< tokens the sequence holds
    int first_page = 0;         ///< pages before it are not carried: the receiver's prefix cache must hold them
    std::vector<kv_scales> scales;             ///< [layers] the rows' scales (1 and 1 but for fp8)
    std::vector<std::int32_t> tokens;          ///< token ids of the first positions (all, some or none known)
    std::vector<std::uint64_t> page_hashes;    ///< chained hash of each full page whose tokens are known
    std::vector<std::uint64_t> page_checksums; ///< [carried pages] striped hash (checksum.hpp) of each carried page's payload
    /// Empty when every position [0, length) has its rows; else [layers] the
    /// positions each layer holds, ascending (a compacted or windowed sequence).
    std::vector<std::vector<std::int32_t>> kept;
    /// Carried page p (first_page + p), layer l: keys then values, each
    /// [rows of the page the layer holds][kv_heads][stored row]; the last page may be partial.
    std::vector<payload_element> payload;

    /// Pages the sequence spans.
    int page_count() const noexcept { return page_size > 0 ? (length + page_size - 1) / page_size : 0; }
    /// Positions page p spans.
    int rows_in_page(int p) const noexcept { return p + 1 < page_count() ? page_size : length - p * page_size; }
    /// Rows of page p that layer l carries: rows_in_page(p) unless positions were dropped.
    int rows_carried(int p, int l) const noexcept {
        if (kept.empty()) return rows_in_page(p);
        const auto& k = kept[std::size_t(l)];
        const auto first = std::lower_bound(k.begin(), k.end(), p * page_size);
        return int(std::lower_bound(first, k.end(), p * page_size + rows_in_page(p)) - first);
    }
    /// Payload elements of one carried position's keys in one layer (kv_heads stored rows).
    std::size_t key_units() const noexcept { return side_units<key_element_t<Element>>(); }
    /// Payload elements of one carried position's values in one layer.
    std::size_t value_units() const noexcept { return side_units<value_element_t<Element>>(); }
    /// Payload elements of page p (every layer, keys and values).
    std::size_t page_elements(int p) const noexcept {
        std::size_t rows = 0;
        for (int l = 0; l < layers; ++l) rows += std::size_t(rows_carried(p, l));
        return rows * (key_units() + value_units());
    }
    /// Bytes of the carried rows.
    std::size_t payload_bytes() const noexcept { return payload.size() * sizeof(payload_element); }

private:
    template <class Side>
    std::size_t side_units() const noexcept {
        return std::size_t(heads.kv_heads) * std::size_t(row_elements<Side>(heads.head_dim)) * sizeof(Side) /
               sizeof(payload_element);
    }
};

namespace detail {

inline constexpr char page_export_magic[8] = {'K', 'V', 'P', 'A', 'G', 'E', 'S', '\0'};
/// 3: the striped hash for the page and frame checksums (2: FNV-1a, byte-serial,
/// about 0.7 GB/s; still read).
inline constexpr std::uint32_t page_export_version = 3;

/// The hash an export of `version` states its checksums in: the cache
/// files' FNV-1a (their version 1) up to export version 2, then their
/// striped hash (their version 2).
inline file_checksum export_checksum(std::uint32_t version = page_export_version) noexcept {
    return file_checksum(version <= 2 ? 1 : 2);
}

/// A carried page's checksum as an export of `version` states it.
template <class Element>
std::uint64_t page_checksum(const Element* rows, std::size_t elements, std::uint32_t version = page_export_version) {
    file_checksum hash = export_checksum(version);
    hash.update(rows, elements * sizeof(Element));
    return hash.value();
}

/// The chained hashes of the full pages whose tokens are known.
inline std::vector<std::uint64_t> chain_hashes(const std::vector<std::int32_t>& tokens, int page_size) {
    std::vector<std::uint64_t> hashes;
    std::uint64_t parent = root_hash;
    for (std::size_t p = 0; (p + 1) * std::size_t(page_size) <= tokens.size(); ++p) {
        parent = chain_hash(parent, tokens.data() + p * page_size, page_size);
        hashes.push_back(parent);
    }
    return hashes;
}

/// Calls f(position, done, count) for each run of adjacent positions layer l
/// carries in page p; done counts the page's earlier carried rows of the layer.
template <class Element, class F>
void for_each_carried_run(const page_export<Element>& e, int p, int l, F&& f) {
    const int begin = p * e.page_size, end = begin + e.rows_in_page(p);
    if (e.kept.empty()) {
        if (end > begin) f(begin, 0, end - begin);
        return;
    }
    const auto& k = e.kept[std::size_t(l)];
    const auto first = std::lower_bound(k.begin(), k.end(), begin);
    const std::size_t n = std::size_t(std::lower_bound(first, k.end(), end) - first);
    const span<const std::int32_t> in_page(k.data() + (first - k.begin()), n);
    for_each_position_run(in_page, [&](std::size_t i, std::size_t j) { f(int(in_page[i]), int(i), int(j - i)); });
}

/// Reads count positions' rows of layer l from `position` into the payload at
/// keys and values (a pair's rows go through staging arrays of their own
/// types, then their bytes into the payload).
template <class Element, class Cache>
void read_into_payload(const Cache& cache, sequence_id id, int l, int position, int count,
                       typename page_export<Element>::payload_element* keys,
                       typename page_export<Element>::payload_element* values, std::size_t key_units,
                       std::size_t value_units) {
    if constexpr (!is_kv_pair_v<Element>) {
        cache.read(id, l, position, count, span<Element>(keys, count * key_units), span<Element>(values, count * value_units));
    } else {
        std::vector<key_element_t<Element>> key_rows(count * key_units / sizeof(key_element_t<Element>));
        std::vector<value_element_t<Element>> value_rows(count * value_units / sizeof(value_element_t<Element>));
        cache.read(id, l, position, count, span<key_element_t<Element>>(key_rows),
                   span<value_element_t<Element>>(value_rows));
        std::memcpy(keys, key_rows.data(), count * key_units);
        std::memcpy(values, value_rows.data(), count * value_units);
    }
}

/// The reverse of read_into_payload: count positions' rows from the payload into layer l.
template <class Element, class Cache>
void write_from_payload(Cache& cache, sequence_id id, int l, int position, int count,
                        const typename page_export<Element>::payload_element* keys,
                        const typename page_export<Element>::payload_element* values, std::size_t key_units,
                        std::size_t value_units) {
    if constexpr (!is_kv_pair_v<Element>) {
        cache.write(id, l, position, span<const Element>(keys, count * key_units),
                    span<const Element>(values, count * value_units), count);
    } else {
        std::vector<key_element_t<Element>> key_rows(count * key_units / sizeof(key_element_t<Element>));
        std::vector<value_element_t<Element>> value_rows(count * value_units / sizeof(value_element_t<Element>));
        std::memcpy(key_rows.data(), keys, count * key_units);
        std::memcpy(value_rows.data(), values, count * value_units);
        cache.write(id, l, position, span<const key_element_t<Element>>(key_rows),
                    span<const value_element_t<Element>>(value_rows), count);
    }
}

/// Reads the carried rows of every page from first_page on out of cache
/// into the payload, with each page's checksum.
template <class Element, class Cache>
void carry_pages(const Cache& cache, sequence_id id, page_export<Element>& e) {
    const std::size_t key_units = e.key_units(), value_units = e.value_units();
    for (int p = e.first_page; p < e.page_count(); ++p) {
        const std::size_t begin = e.payload.size();
        e.payload.resize(begin + e.page_elements(p));
        auto* out = e.payload.data() + begin;
        for (int l = 0; l < e.layers; ++l) {
            const std::size_t rows = std::size_t(e.rows_carried(p, l));
            for_each_carried_run(e, p, l, [&](int position, int done, int count) {
                read_into_payload<Element>(cache, id, l, position, count, out + done * key_units,
                                           out + rows * key_units + done * value_units, key_units, value_units);
            });
            out += rows * (key_units + value_units);
        }
        e.page_checksums.push_back(page_checksum(e.payload.data() + begin, e.page_elements(p)));
    }
}

/// Writes the payload's rows of every page from first_page on into id,
/// skipping the full pages below `shared_rows` (taken from the prefix cache).
template <class Element, class Cache>
void place_pages(Cache& cache, sequence_id id, const page_export<Element>& e, int shared_rows) {
    const std::size_t key_units = e.key_units(), value_units = e.value_units();
    const auto* in = e.payload.data();
    for (int p = e.first_page; p < e.page_count(); ++p) {
        const bool held = (p + 1) * e.page_size <= shared_rows;
        for (int l = 0; l < e.layers; ++l) {
            const std::size_t rows = std::size_t(e.rows_carried(p, l));
            if (!held)
                for_each_carried_run(e, p, l, [&](int position, int done, int count) {
                    write_from_payload<Element>(cache, id, l, position, count, in + done * key_units,
                                                in + rows * key_units + done * value_units, key_units, value_units);
                });
            in += rows * (key_units + value_units);
        }
    }
}

}  // namespace detail

/// Exports sequence id's rows from page first_page on, with its token ids, the
/// chained hashes of its full pages and the scales of every layer. Reads
/// through read(), so a swapped-out sequence exports from the host tier. A
/// compacted sequence carries each layer's kept positions and only their
/// rows, and exports whole. not_found for an unknown id; out_of_range when
/// first_page is past the sequence's pages; invalid_argument for a
/// first_page other than 0 of a compacted sequence (its pages no longer
/// hold what the prefix cache would give the receiver).
/// @tparam Element stored element type
/// @tparam Heads head_config
/// @tparam Memory the cache's memory policy
template <class Element, class Heads, class Memory>
page_export<Element> export_pages(const paged_cache<Element, Heads, Memory>& cache, sequence_id id, int first_page = 0) {
    page_export<Element> e;
    e.heads = shape_of(cache.head_counts());
    e.page_size = cache.page_size();
    e.layers = cache.layers();
    e.length = cache.length(id);
    require(first_page >= 0 && first_page <= e.page_count(), error_code::out_of_range, "first_page = ", first_page,
            " is outside [0, ", e.page_count(), "] for sequence ", id, " of ", e.length, " tokens in pages of ",
            e.page_size);
    e.first_page = first_page;
    if (cache.compacted(id)) {
        require(first_page == 0, error_code::invalid_argument, "sequence ", id,
                " was compacted, so it exports whole; first_page = ", first_page, " would leave out pages");
        for (int l = 0; l < e.layers; ++l) {
            const std::vector<int> present = cache.present_positions(id, l);
            e.kept.emplace_back(present.begin(), present.end());
        }
    }
    for (int l = 0; l < e.layers; ++l) e.scales.push_back(cache.scales(l));
    e.tokens = cache.token_ids(id);
    e.page_hashes = detail::chain_hashes(e.tokens, e.page_size);
    detail::carry_pages(cache, id, e);
    return e;
}

/// Exports a sliding-window sequence: the rows of the positions the window
/// holds (its sinks and ring, the same in every layer) as one block, with
/// the scales of every layer; the window keeps no token ids. not_found for an
/// unknown id.
/// @tparam Element stored element type
/// @tparam Heads head_config
/// @tparam Memory the cache's memory policy
template <class Element, class Heads, class Memory>
page_export<Element> export_pages(const sliding_window_cache<Element, Heads, Memory>& cache, sequence_id id) {
    page_export<Element> e;
    e.layout = layout_kind::sliding_window;
    e.heads = shape_of(cache.head_counts());
    e.layers = cache.layers();
    e.length = cache.length(id);
    e.page_size = std::max(1, e.length);
    const std::vector<int> present = cache.present_positions(id);
    e.kept.assign(std::size_t(e.layers), std::vector<std::int32_t>(present.begin(), present.end()));
    for (int l = 0; l < e.layers; ++l) e.scales.push_back(cache.scales(l));
    detail::carry_pages(cache, id, e);
    return e;
}

namespace detail {

/// Every check import_pages makes before it changes anything.
template <class Element, class Cache>
void check_import(const Cache& cache, const page_export<Element>& e, int shard_rank, int shard_ranks) {
    const head_shape heads = shape_of(cache.head_counts());
    require(e.layout == Cache::kind, error_code::invalid_argument, "the export holds a ", to_string(e.layout),
            " sequence but the cache is ", to_string(Cache::kind));
    require(e.element == kinds_of<Element>(), error_code::invalid_argument, "the export holds ",
            e.element.to_string(), " rows but the cache stores ", kvcache::element_name<Element>());
    require(e.heads == heads, error_code::invalid_argument, "the export's heads ", e.heads.to_string(),
            " differ from the cache's ", heads.to_string());
    require(e.shard_rank == shard_rank && e.shard_ranks == shard_ranks, error_code::invalid_argument,
            "the export holds tensor-parallel shard ", e.shard_rank, " of ", e.shard_ranks,
            " but the cache is shard ", shard_rank, " of ", shard_ranks);
    if constexpr (Cache::kind == layout_kind::paged)
        require(e.page_size == cache.page_size(), error_code::invalid_argument, "the export's page_size ",
                e.page_size, " differs from the cache's ", cache.page_size());
    else
        require(e.page_size == std::max(1, e.length), error_code::format_error, "a sliding-window export is one block of ",
                std::max(1, e.length), " positions, not pages of ", e.page_size);
    require(e.layers == cache.layers(), error_code::invalid_argument, "the export's layers ", e.layers,
            " differ from the cache's ", cache.layers());
    require(int(e.scales.size()) == e.layers, error_code::format_error, "the export holds ", e.scales.size(),
            " layers' scales for ", e.layers, " layers");
    for (int l = 0; l < e.layers; ++l) {
        const kv_scales mine = cache.scales(l);
        require(e.scales[l].key == mine.key && e.scales[l].value == mine.value, error_code::invalid_argument,
                "the export's scales of layer ", l, " (key ", e.scales[l].key, ", value ", e.scales[l].value,
                ") differ from the cache's (key ", mine.key, ", value ", mine.value, ")");
    }
    require(e.length >= 0 && e.first_page >= 0 && e.first_page <= e.page_count(), error_code::format_error,
            "the export's first_page ", e.first_page, " is outside [0, ", e.page_count(), "] for ", e.length,
            " tokens");
    require(e.kept.empty() || (int(e.kept.size()) == e.layers && e.first_page == 0), error_code::format_error,
            "the export holds ", e.kept.size(), " lists of kept positions for ", e.layers,
            " layers, from page ", e.first_page, " (kept positions go with whole exports)");
    for (std::size_t l = 0; l < e.kept.size(); ++l)
        for (std::size_t i = 0; i < e.kept[l].size(); ++i)
            require(e.kept[l][i] >= (i > 0 ? e.kept[l][i - 1] + 1 : 0) && e.kept[l][i] < e.length,
                    error_code::format_error, "layer ", l, "'s kept position ", e.kept[l][i], " (entry ", i,
                    ") is not ascending within [0, ", e.length, ")");
    require(e.tokens.size() <= std::size_t(e.length), error_code::format_error, "the export holds ", e.tokens.size(),
            " token ids for ", e.length, " tokens");
    require(e.first_page == 0 || e.tokens.size() >= std::size_t(e.first_page) * e.page_size,
            error_code::format_error, "the export leaves out ", e.first_page,
            " pages but holds the token ids of only ", e.tokens.size(), " tokens to find them by");
    const auto hashes = chain_hashes(e.tokens, e.page_size);
    require(hashes.size() == e.page_hashes.size(), error_code::format_error, "the export holds ", e.page_hashes.size(),
            " page hashes for ", hashes.size(), " full pages of known tokens");
    for (std::size_t p = 0; p < hashes.size(); ++p)
        require(hashes[p] == e.page_hashes[p], error_code::format_error, "page ", p,
                "'s hash in the export does not match its token ids");
    const int carried = e.page_count() - e.first_page;
    require(int(e.page_checksums.size()) == carried, error_code::format_error, "the export holds ",
            e.page_checksums.size(), " page checksums for ", carried, " carried pages");
    std::size_t offset = 0;
    for (int p = e.first_page; p < e.page_count(); ++p) {
        const std::size_t n = e.page_elements(p);
        require(offset + n <= e.payload.size(), error_code::format_error, "the export's payload holds ",
                e.payload.size(), " elements, short of page ", p, "'s end at ", offset + n);
        require(page_checksum(e.payload.data() + offset, n) == e.page_checksums[p - e.first_page],
                error_code::format_error, "page ", p, " of the export is damaged (checksum mismatch)");
        offset += n;
    }
    require(offset == e.payload.size(), error_code::format_error, "the export's payload holds ", e.payload.size(),
            " elements, more than its pages' ", offset);
}

}  // namespace detail

/// Imports an export as a new sequence of cache and returns its id. Full
/// pages the cache's prefix cache holds (any tier) are shared from it, not
/// copied, and must be there for the pages the export left out; the rest are
/// written from the payload into new pages, and full pages with known tokens
/// enter the prefix index. Everything in the export is checked first (types,
/// heads and shard, page size, layers, scales, hashes against tokens, each
/// page's checksum): a mismatch is invalid_argument or format_error naming
/// both sides, a page left out that the cache lacks is not_found, a pool
/// too small is capacity_exceeded; then no sequence is added and no page
/// changes hands (the prefix counters count the lookups made).
/// @tparam Element stored element type
/// @tparam Heads head_config
/// @tparam Memory the cache's memory policy
template <class Element, class Heads, class Memory>
sequence_id import_pages(paged_cache<Element, Heads, Memory>& cache, const page_export<Element>& e, int shard_rank = 0,
                         int shard_ranks = 1) {
    detail::check_import(cache, e, shard_rank, shard_ranks);
    const sequence_id id = cache.add_sequence();
    int matched = 0;
    try {
        const std::size_t full_known = e.page_hashes.size() * std::size_t(e.page_size);
        if (full_known > 0 && cache.prefix_caching() && e.kept.empty())
            matched = cache.match_prefix(id, std::vector<std::int32_t>(e.tokens.begin(), e.tokens.begin() + full_known));
        require(matched >= e.first_page * e.page_size, error_code::not_found, "the export leaves out ", e.first_page,
                " pages but the cache's prefix cache holds only the first ", matched / e.page_size, " of them");
        const int rest = e.length - matched;
        if (e.tokens.size() == std::size_t(e.length))
            cache.begin_append(id, rest, std::vector<std::int32_t>(e.tokens.begin() + matched, e.tokens.end()));
        else
            cache.begin_append(id, rest);
    } catch (...) {
        cache.remove_sequence(id);  // holds at most the matched pages, whose rows are whole
        throw;
    }
    detail::place_pages(cache, id, e, matched);
    if (!e.kept.empty()) {
        // Every position was written where it was held, so a position's
        // visible index is the position itself until this compaction.
        std::vector<std::vector<int>> kept(e.kept.begin(), e.kept.end());
        try {
            cache.compact(id, kept);
        } catch (...) {
            cache.truncate(id, 0);  // its unwritten rows must not reach the prefix cache
            cache.remove_sequence(id);
            throw;
        }
    }
    cache.publish(id);
    return id;
}

/// Imports a sliding-window export as a new sequence of cache and returns
/// its id. The export must hold positions this window keeps at its length
/// (the same sinks and ring): all of them, or, from a compacted sequence, a
/// subset, whose missing positions become holes here as they were there.
/// Besides what import_pages of a paged cache checks, a position this
/// window does not keep is invalid_argument naming both, a cache with no
/// free slot is capacity_exceeded, and then nothing changes.
/// @tparam Element stored element type
/// @tparam Heads head_config
/// @tparam Memory the cache's memory policy
template <class Element, class Heads, class Memory>
sequence_id import_pages(sliding_window_cache<Element, Heads, Memory>& cache, const page_export<Element>& e,
                         int shard_rank = 0, int shard_ranks = 1) {
    detail::check_import(cache, e, shard_rank, shard_ranks);
    const std::vector<int> holds = cache.present_positions_for(e.length);
    // Per layer, the visible indices of the export's positions among those the window keeps.
    std::vector<std::vector<int>> kept(e.kept.size());
    bool compacted = false;
    for (std::size_t l = 0; l < e.kept.size(); ++l) {
        std::size_t j = 0;
        for (const std::int32_t position : e.kept[l]) {
            while (j < holds.size() && holds[j] < position) ++j;
            require(j < holds.size() && holds[j] == position, error_code::invalid_argument, "layer ", l,
                    " of the export holds position ", position, ", which this window (sinks ", cache.sinks(),
                    ", ring ", cache.ring(), ") does not keep in a sequence of ", e.length, " tokens (the export names ",
                    e.kept[l].size(), " positions, the window keeps ", holds.size(), ")");
            kept[l].push_back(static_cast<int>(j));
        }
        compacted = compacted || kept[l].size() != holds.size();
    }
    require(!e.kept.empty() || e.layers == 0, error_code::format_error,
            "a sliding-window export names the positions it holds");
    const sequence_id id = cache.add_sequence();
    try {
        for (int done = 0; done < e.length;) {
            const int n = std::min(cache.max_chunk(), e.length - done);
            cache.begin_append(id, n);
            done += n;
        }
        if (compacted) cache.compact(id, kept);  // holes first: then the export's rows are written where they go
        detail::place_pages(cache, id, e, 0);
    } catch (...) {
        cache.remove_sequence(id);
        throw;
    }
    return id;
}

/// Exports the longest chain of full pages the cache's prefix cache (any
/// tier) holds for token_ids, with no sequence of the caller's involved: what
/// a prefix store or another worker's cache imports with import_prefix. The
/// chain is identified by its chained page hashes (the export's
/// page_hashes); pages from the host or disk tier come back to the pool on
/// the way, as a prefix hit brings them. An empty export when nothing
/// matches. capacity_exceeded when no sequence slot is free.
/// @tparam Element stored element type
/// @tparam Heads head_config
/// @tparam Memory the cache's memory policy
template <class Element, class Heads, class Memory>
page_export<Element> export_prefix(paged_cache<Element, Heads, Memory>& cache, const std::vector<std::int32_t>& token_ids) {
    const sequence_id id = cache.add_sequence();
    try {
        cache.match_prefix(id, token_ids);
        page_export<Element> e = export_pages(cache, id);
        cache.remove_sequence(id);
        return e;
    } catch (...) {
        cache.remove_sequence(id);
        throw;
    }
}

/// Imports a chain of full pages (export_prefix's, or any export whose pages
/// are whole and whose token ids are known) into the cache's prefix cache
/// only: afterwards match_prefix finds them, no sequence holds them, and the
/// cache may evict them as any cached prefix. Returns the tokens now cached
/// for the chain. The checks and refusals of import_pages; besides,
/// invalid_argument for a compacted export or one whose tokens are not all
/// known, and a cache without prefix caching.
/// @tparam Element stored element type
/// @tparam Heads head_config
/// @tparam Memory the cache's memory policy
template <class Element, class Heads, class Memory>
int import_prefix(paged_cache<Element, Heads, Memory>& cache, const page_export<Element>& e, int shard_rank = 0,
                  int shard_ranks = 1) {
    require(cache.prefix_caching(), error_code::invalid_argument,
            "import_prefix needs a cache with prefix caching; this one has none");
    require(e.kept.empty() && e.tokens.size() == std::size_t(e.length), error_code::invalid_argument,
            "import_prefix takes whole pages with known tokens; the export holds ", e.tokens.size(), " token ids of ",
            e.length, e.kept.empty() ? " tokens" : " tokens and was compacted");
    const int cached = int(e.page_hashes.size()) * e.page_size;
    const sequence_id id = import_pages(cache, e, shard_rank, shard_ranks);
    cache.remove_sequence(id);  // its full pages stay in the prefix cache; a partial last page goes
    return cached;
}

/// The export as bytes, for a transport or a file: a fixed header, the
/// descriptor, the page checksums and the payload, then a checksum (the
/// striped hash) of everything before it.
/// @tparam Element stored element type
template <class Element>
std::vector<unsigned char> to_bytes(const page_export<Element>& e) {
    std::vector<unsigned char> out;
    const auto put = [&](const void* data, std::size_t n) {
        const auto* p = static_cast<const unsigned char*>(data);
        out.insert(out.end(), p, p + n);
    };
    const auto put_value = [&](auto v) { put(&v, sizeof v); };
    put(detail::page_export_magic, sizeof detail::page_export_magic);
    put_value(detail::page_export_version);
    put_value(std::uint32_t(encode_kv_kinds(e.element)));
    put_value(std::uint32_t(e.layout));
    // Named arrays rather than braced lists in the loops: nvcc's host-code rewrite breaks those.
    const std::int32_t fields[] = {e.heads.query_heads, e.heads.kv_heads, e.heads.head_dim, e.shard_rank,
                                   e.shard_ranks, e.page_size, e.layers, e.length, e.first_page};
    for (const std::int32_t v : fields) put_value(v);
    const std::uint64_t counts[] = {std::uint64_t(e.scales.size()), std::uint64_t(e.tokens.size()),
                                    std::uint64_t(e.page_hashes.size()), std::uint64_t(e.page_checksums.size()),
                                    std::uint64_t(e.payload.size()), std::uint64_t(e.kept.size())};
    for (const std::uint64_t n : counts) put_value(n);
    for (const kv_scales& s : e.scales) put_value(s.key), put_value(s.value);
    put(e.tokens.data(), e.tokens.size() * sizeof(std::int32_t));
    put(e.page_hashes.data(), e.page_hashes.size() * sizeof(std::uint64_t));
    put(e.page_checksums.data(), e.page_checksums.size() * sizeof(std::uint64_t));
    for (const auto& k : e.kept) {
        put_value(std::uint64_t(k.size()));
        put(k.data(), k.size() * sizeof(std::int32_t));
    }
    put(e.payload.data(), e.payload_bytes());
    detail::file_checksum frame = detail::export_checksum();
    frame.update(out.data(), out.size());
    put_value(frame.value());
    return out;
}

/// The export to_bytes() wrote. format_error, naming what is wrong, for bytes
/// that are short, damaged (checksum), of another format version, or of
/// another element type than Element; nothing is allocated for a count the
/// bytes cannot hold. Reads version 2 (FNV-1a checksums) too: its page
/// checksums are verified and restated in the current hash.
/// @tparam Element stored element type
template <class Element>
page_export<Element> page_export_from_bytes(span<const unsigned char> bytes) {
    constexpr std::size_t fixed = 8 + 4 + 4 + 4 + 9 * 4 + 6 * 8;
    require(bytes.size() >= fixed + 8, error_code::format_error, "a page export needs at least ", fixed + 8,
            " bytes; got ", bytes.size());
    std::uint32_t version = 0;
    std::memcpy(&version, bytes.data() + 8, 4);  // which checksum the frame carries
    require(version == 2 || version == detail::page_export_version, error_code::format_error, "page export version ",
            version, " is not one this build reads (2 or ", detail::page_export_version, ")");
    std::uint64_t stored = 0;
    std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
    detail::file_checksum frame = detail::export_checksum(version);
    frame.update(bytes.data(), bytes.size() - 8);
    require(frame.value() == stored, error_code::format_error, "the page export's ", bytes.size(),
            " bytes are damaged (checksum mismatch)");
    std::size_t at = 0;
    const auto take = [&](void* data, std::size_t n) {
        require(n <= bytes.size() - 8 - at, error_code::format_error, "the page export ends ", n - (bytes.size() - 8 - at),
                " bytes short");
        if (n > 0) std::memcpy(data, bytes.data() + at, n);  // an empty vector's data() may be null
        at += n;
    };
    char magic[8];
    take(magic, 8);
    require(std::memcmp(magic, detail::page_export_magic, 8) == 0, error_code::format_error,
            "these bytes are not a kvcache page export");
    std::uint32_t element = 0;
    take(&version, 4);
    take(&element, 4);
    page_export<Element> e;
    require(element == std::uint32_t(encode_kv_kinds(e.element)), error_code::format_error, "the page export holds ",
            detail::element_name(element), " rows, not ", kvcache::element_name<Element>());
    std::uint32_t layout = 0;
    take(&layout, 4);
    require(layout <= std::uint32_t(layout_kind::sliding_window), error_code::format_error, "the page export's layout ",
            layout, " is not one this build knows");
    e.layout = layout_kind(layout);
    std::int32_t v[9];
    take(v, sizeof v);
    e.heads = head_shape{v[0], v[1], v[2]};
    e.shard_rank = v[3], e.shard_ranks = v[4], e.page_size = v[5], e.layers = v[6], e.length = v[7], e.first_page = v[8];
    std::uint64_t counts[6];
    take(counts, sizeof counts);
    const std::uint64_t left = bytes.size() - 8 - at;
    // A kept list takes at least its count's 8 bytes.
    const std::uint64_t sizes[6] = {2 * sizeof(float), sizeof(std::int32_t), sizeof(std::uint64_t),
                                    sizeof(std::uint64_t), sizeof(typename page_export<Element>::payload_element),
                                    sizeof(std::uint64_t)};
    std::uint64_t needed = 0;
    for (int i = 0; i < 6; ++i) {
        require(counts[i] <= left / sizes[i] && needed + counts[i] * sizes[i] <= left, error_code::format_error,
                "the page export's counts need more than its ", left, " bytes");
        needed += counts[i] * sizes[i];
    }
    e.scales.resize(counts[0]);
    for (kv_scales& s : e.scales) take(&s.key, sizeof(float)), take(&s.value, sizeof(float));
    e.tokens.resize(counts[1]);
    take(e.tokens.data(), counts[1] * sizeof(std::int32_t));
    e.page_hashes.resize(counts[2]);
    take(e.page_hashes.data(), counts[2] * sizeof(std::uint64_t));
    e.page_checksums.resize(counts[3]);
    take(e.page_checksums.data(), counts[3] * sizeof(std::uint64_t));
    e.kept.resize(counts[5]);
    for (auto& k : e.kept) {
        std::uint64_t n = 0;
        take(&n, sizeof n);
        require(n <= (bytes.size() - 8 - at) / sizeof(std::int32_t), error_code::format_error,
                "the page export's kept positions need more than its ", bytes.size() - 8 - at, " bytes");
        k.resize(n);
        take(k.data(), n * sizeof(std::int32_t));
    }
    e.payload.resize(counts[4]);
    take(e.payload.data(), counts[4] * sizeof(typename page_export<Element>::payload_element));
    require(at == bytes.size() - 8, error_code::format_error, "the page export has ", bytes.size() - 8 - at,
            " bytes past its payload");
    if (version < detail::page_export_version) {  // the old hash's page checksums, checked, then in the new one
        std::size_t offset = 0;
        for (int p = e.first_page; p < e.page_count() && std::size_t(p - e.first_page) < e.page_checksums.size(); ++p) {
            const std::size_t n = e.page_elements(p);
            if (n > e.payload.size() - offset) break;  // validation names the short payload
            std::uint64_t& checksum = e.page_checksums[std::size_t(p - e.first_page)];
            require(detail::page_checksum(e.payload.data() + offset, n, version) == checksum, error_code::format_error,
                    "page ", p, " of the export is damaged (checksum mismatch)");
            checksum = detail::page_checksum(e.payload.data() + offset, n);
            offset += n;
        }
    }
    return e;
}

}  // namespace kvcache
