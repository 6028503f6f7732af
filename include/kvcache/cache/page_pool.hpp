// Bookkeeping of a pool of pages: free list, reference counts, and the
// prefix index (full pages keyed by a chained hash of their token ids) with
// least-recently-used eviction of cached pages nobody references, leaves of
// a chain before the pages they extend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvcache/core/error.hpp"

namespace kvcache {

/// Counters and sizes of a paged cache.
struct pool_statistics {
    int pages_total = 0;      ///< pages in the pool
    int pages_used = 0;       ///< pages referenced by at least one sequence
    int pages_free = 0;       ///< pages on the free list
    int pages_cached = 0;     ///< pages in the prefix index (referenced or not)
    int pages_evictable = 0;  ///< cached pages nobody references: reusable on demand
    std::uint64_t prefix_queried_pages = 0;  ///< full pages offered to match_prefix
    std::uint64_t prefix_hit_pages = 0;      ///< of those, pages found in the index and shared
    std::uint64_t evictions = 0;             ///< cached pages reclaimed for new data
    std::uint64_t copies = 0;                ///< pages copied on write
    std::uint64_t pages_released_by_compaction = 0; ///< pages compact() gave back (no layer's kept rows reach them)
    std::uint64_t rows_moved_by_compaction = 0;     ///< rows (of one layer, every KV head) compact() moved down
    std::size_t bytes_reserved = 0;          ///< bytes of every page of every layer
    std::size_t bytes_used = 0;              ///< bytes of referenced pages
    std::size_t bytes_cached = 0;            ///< bytes of evictable cached pages
    int host_pages_total = 0;                ///< pages of the host tier (0: none)
    int host_pages_used = 0;                 ///< host-tier pages holding swapped rows
    int sequences_swapped_out = 0;           ///< sequences whose rows are in the host tier
    std::uint64_t pages_swapped_out = 0;     ///< pages copied pool -> host tier
    std::uint64_t pages_swapped_in = 0;      ///< pages copied host tier -> pool
    std::uint64_t swap_copies_avoided = 0;   ///< page moves served by a copy the other tier still held
    std::size_t bytes_swapped_out = 0;       ///< bytes of pages_swapped_out (every layer, keys and values)
    std::size_t bytes_swapped_in = 0;        ///< bytes of pages_swapped_in
    int host_pages_cached = 0;               ///< host-tier pages holding spilled prefix pages
    std::uint64_t pages_spilled = 0;         ///< cached pages copied to the host tier as the pool evicted them
    std::uint64_t host_prefix_hit_pages = 0; ///< of prefix_hit_pages, pages brought back from the host tier
    int disk_pages_total = 0;                ///< pages the disk tier may hold (0: none)
    int disk_pages_used = 0;                 ///< page files it holds
    std::uint64_t pages_written_to_disk = 0; ///< spilled pages the host tier evicted, written to files
    std::uint64_t disk_prefix_hit_pages = 0; ///< of prefix_hit_pages, pages read back from files
    std::uint64_t disk_pages_refused = 0;    ///< page files missing, damaged or foreign when read (misses)
    // Misses, per tier. match_prefix walks the offered pages in order and looks
    // each up in the pool's index, then (not there) in the host tier, then (not
    // there either) in the disk tier, and stops at the first page no tier holds.
    // A miss is one such lookup of one page in one tier that did not find it:
    // pages past the walk's end are looked up nowhere, a tier the cache lacks is
    // never looked up, and a page found in a tier but left there (the pool had no
    // room to bring it back) is neither a hit nor a miss of that tier.
    std::uint64_t pool_prefix_miss_pages = 0; ///< pages looked up in the pool's prefix index and not found there
    std::uint64_t host_prefix_miss_pages = 0; ///< of pool_prefix_miss_pages, pages then not found in the host tier
    std::uint64_t disk_prefix_miss_pages = 0; ///< of host_prefix_miss_pages, pages then not read back from a file
                                              ///< (no file for them, or one refused: see disk_pages_refused)
    std::uint64_t bytes_written_to_disk = 0, bytes_read_from_disk = 0;
    std::uint64_t pool_prefix_hit_pages = 0;  ///< of prefix_hit_pages, pages the pool still held (no copy)
    std::size_t host_bytes_total = 0;         ///< bytes of host_pages_total
    std::size_t host_bytes_used = 0;          ///< bytes of host_pages_used
    std::size_t host_bytes_cached = 0;        ///< bytes of host_pages_cached
    std::size_t bytes_spilled = 0;            ///< bytes of pages_spilled (pool -> host tier)
    std::size_t bytes_brought_back_from_host = 0; ///< bytes of host_prefix_hit_pages (host tier -> pool)
    std::uint64_t disk_write_failures = 0;    ///< pages whose file could not be written (lost: later misses)

    /// Hit pages / queried pages (0 before any query).
    double hit_rate() const noexcept {
        return prefix_queried_pages ? double(prefix_hit_pages) / double(prefix_queried_pages) : 0.0;
    }
};

/// What paged_cache::clear_prefix_cache() dropped, per tier.
struct cleared_prefix_pages {
    int pool = 0;  ///< pool pages put back on the free list (were evictable)
    int host = 0;  ///< host-tier pages of spilled prefix pages nobody held, freed
    int disk = 0;  ///< page files deleted from the disk tier
};

namespace detail {

/// The chained hash of a full page: mixes the parent page's hash with the
/// page's token ids, so equal pages after different prefixes differ.
inline std::uint64_t chain_hash(std::uint64_t parent, const std::int32_t* tokens, int count) noexcept {
    std::uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < count; ++i) {
        h ^= static_cast<std::uint32_t>(tokens[i]);
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    h ^= static_cast<std::uint64_t>(count) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    return h;
}
inline constexpr std::uint64_t root_hash = 0x6b76636163686521ull;  // hash "parent" of a first page

/// Page ids 0..N-1 with reference counts; cached pages stay indexed by hash
/// after their last reference goes, until evicted. Strong guarantee: each
/// operation checks before it changes anything.
class page_pool {
public:
    page_pool() = default;
    explicit page_pool(int pages) : info_(pages) {
        free_.reserve(pages);
        for (int p = pages - 1; p >= 0; --p) free_.push_back(p);
    }

    int size() const noexcept { return static_cast<int>(info_.size()); }
    int free_count() const noexcept { return static_cast<int>(free_.size()); }
    int evictable_count() const noexcept { return static_cast<int>(lru_.size()); }
    /// Pages allocate() can still hand out: free plus evictable.
    int available() const noexcept { return free_count() + evictable_count(); }
    int references(int page) const { return info_.at(page).references; }
    bool cached(int page) const { return info_.at(page).cached; }
    /// True when writing into the page would change what someone else sees.
    bool shared(int page) const { return info_[page].references > 1 || info_[page].cached; }
    int cached_count() const noexcept { return static_cast<int>(index_.size()); }
    std::uint64_t evictions() const noexcept { return evictions_; }

    /// A page with one reference: from the free list, else an evictable cached
    /// page. capacity_exceeded when neither is left.
    ///
    /// The victim is the least recently used evictable page that no other
    /// cached page extends (a leaf of its chain): matching walks a chain from
    /// its first page, so evicting the first page would leave the rest cached
    /// but unreachable. Only when every evictable page is extended by a page
    /// someone still references is the least recently used one taken anyway.
    int allocate() {
        if (free_.empty()) {
            require(!lru_.empty(), error_code::capacity_exceeded, "page pool of ", size(),
                    " pages has no free page and no evictable cached page");
            const int victim = next_victim();
            uncache(victim);
            ++evictions_;
            free_.push_back(victim);
        }
        const int page = free_.back();
        free_.pop_back();
        info_[page].references = 1;
        return page;
    }

    /// The cached page the next allocate() evicts, or -1 when it takes a free
    /// page (or has none to take).
    int next_victim() const {
        if (!free_.empty() || lru_.empty()) return -1;
        return leaves_.empty() ? lru_.begin()->second : leaves_.begin()->second;
    }

    /// A cached page's key in the index: its chained hash, its parent's hash, its token ids.
    std::uint64_t hash_of(int page) const { return info_.at(page).hash; }
    std::uint64_t parent_of(int page) const { return info_.at(page).parent; }
    const std::vector<std::int32_t>& tokens_of(int page) const { return info_.at(page).tokens; }

    void retain(int page) {
        page_info& p = info_[page];
        if (p.references == 0 && p.cached) make_unevictable(page);
        ++p.references;
    }

    /// Drops a reference; a page nobody references goes back to the free list,
    /// or, if cached, becomes evictable (most recently used last).
    void release(int page) {
        page_info& p = info_[page];
        if (--p.references > 0) return;
        if (p.cached) {
            p.last_use = ++clock_;
            make_evictable(page);
        } else {
            free_.push_back(page);
        }
    }

    /// Enters a full page in the prefix index under its chained hash, unless
    /// an equal page is already there.
    void publish(int page, std::uint64_t hash, std::uint64_t parent, const std::int32_t* tokens, int count) {
        page_info& p = info_[page];
        if (p.cached || index_.count(hash)) return;
        p.cached = true;
        p.hash = hash;
        p.parent = parent;
        p.tokens.assign(tokens, tokens + count);
        index_.emplace(hash, page);
        auto parent_entry = index_.find(parent);
        p.parent_page = parent_entry == index_.end() ? -1 : parent_entry->second;
        if (p.parent_page >= 0) {
            page_info& q = info_[p.parent_page];
            if (q.cached_children++ == 0 && q.references == 0) leaves_.erase({q.last_use, p.parent_page});
        }
    }

    /// Drops every cached page nobody references from the index and puts it
    /// on the free list (what allocate() would evict one by one), calling
    /// on_freed(page) for each; referenced cached pages stay indexed.
    /// Returns how many pages it freed. Cannot fail: the free list has room
    /// for every page since construction.
    /// @tparam OnFreed void(int page), noexcept
    template <class OnFreed>
    int clear_cache(OnFreed&& on_freed) noexcept {
        int freed = 0;
        while (!lru_.empty()) {
            const int page = lru_.begin()->second;
            uncache(page);  // also takes it off lru_ and leaves_
            free_.push_back(page);
            on_freed(page);
            ++freed;
        }
        return freed;
    }

    /// Cached pages that extend this page's chain by one page.
    int cached_children(int page) const { return info_.at(page).cached_children; }

    /// The cached page for (parent, tokens), or -1. The tokens and parent
    /// hash are compared too, so a hash collision is a miss, not wrong data.
    int find(std::uint64_t hash, std::uint64_t parent, const std::int32_t* tokens, int count) const {
        auto found = index_.find(hash);
        if (found == index_.end()) return -1;
        const page_info& p = info_[found->second];
        if (p.parent != parent || static_cast<int>(p.tokens.size()) != count ||
            !std::equal(p.tokens.begin(), p.tokens.end(), tokens))
            return -1;
        return found->second;
    }

private:
    struct page_info {
        int references = 0;
        bool cached = false;
        std::uint64_t hash = 0, parent = 0, last_use = 0;
        std::vector<std::int32_t> tokens;
        int parent_page = -1;     // the cached page this one extends, -1 for a first page or an orphan
        int cached_children = 0;  // cached pages whose parent_page is this one
    };

    void make_evictable(int page) {
        const page_info& p = info_[page];
        lru_.insert({p.last_use, page});
        if (p.cached_children == 0) leaves_.insert({p.last_use, page});
    }

    void make_unevictable(int page) {
        const page_info& p = info_[page];
        lru_.erase({p.last_use, page});
        leaves_.erase({p.last_use, page});
    }

    void uncache(int page) {
        page_info& p = info_[page];
        make_unevictable(page);
        index_.erase(p.hash);
        p.cached = false;
        p.tokens.clear();
        if (p.parent_page >= 0) {
            page_info& q = info_[p.parent_page];
            if (--q.cached_children == 0 && q.references == 0 && q.cached) leaves_.insert({q.last_use, p.parent_page});
            p.parent_page = -1;
        }
        // Taken before its children (only when they are all referenced): they
        // become orphans, still matchable if an equal parent is cached again.
        if (p.cached_children > 0) {
            for (page_info& child : info_)
                if (child.cached && child.parent_page == page) child.parent_page = -1;
            p.cached_children = 0;
        }
    }

    std::vector<page_info> info_;
    std::vector<int> free_;  // a stack
    std::unordered_map<std::uint64_t, int> index_;
    std::set<std::pair<std::uint64_t, int>> lru_;     // (last use, page) of unreferenced cached pages
    std::set<std::pair<std::uint64_t, int>> leaves_;  // those of lru_ that no cached page extends
    std::uint64_t clock_ = 0, evictions_ = 0;
};

}  // namespace detail
}  // namespace kvcache
