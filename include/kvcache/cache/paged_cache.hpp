// Owner of the paged layout: per layer a pool of pages (head-major inside),
// one page table per sequence (the same page ids in every layer), copy on
// write for shared pages, a prefix cache of full pages, and compaction: a
// sequence keeps chosen rows per layer at their true positions and gives
// back the pages no layer needs any more.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/cache/compaction.hpp"
#include "kvcache/cache/disk_tier.hpp"
#include "kvcache/cache/host_tier.hpp"
#include "kvcache/cache/owner_base.hpp"
#include "kvcache/cache/page_pool.hpp"
#include "kvcache/cache/parallel_reads.hpp"
#include "kvcache/cache/row_transfer.hpp"
#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/layout/paged_view.hpp"

namespace kvcache {

/// A paged cache of L layers. A sequence's position p lives in its page
/// p / page_size at row p % page_size; pages are reference counted, so forks
/// and prefix hits share them, and a write into a shared page copies it first.
///
/// Prefix cache: give token ids to begin_append()/append(); once a page is
/// full and its rows written (at the sequence's next begin_append, publish()
/// or remove_sequence()), it is indexed by the chained hash of its tokens.
/// match_prefix() on a new sequence shares the longest run of indexed pages.
/// Unreferenced indexed pages stay until the pool runs short (LRU eviction,
/// the ends of chains first).
/// @tparam Element stored element type (float, kvcache::half, kvcache::bfloat16, fp8, qint8, qint4) or a
///         kv_elements pair (keys and values of two of them, each plane in rows of its own type)
/// @tparam Heads a head_config
/// @tparam Memory host_memory or device_memory
template <class Element, class Heads, class Memory = host_memory>
class paged_cache : public detail::owner_base<paged_cache<Element, Heads, Memory>, Element, Heads> {
    static_assert(is_cache_element_v<Element>, "kvcache::paged_cache stores float, kvcache::half, kvcache::bfloat16, kvcache::float8_e4m3, kvcache::float8_e5m2, kvcache::qint8, kvcache::qint4 or a kvcache::kv_elements pair of them");
    using base = detail::owner_base<paged_cache, Element, Heads>;
    friend base;

public:
    using typename base::plan_type;
    using element_type = Element;
    using key_type = key_element_t<Element>;      ///< what key planes hold
    using value_type = value_element_t<Element>;  ///< what value planes hold
    using heads = Heads;
    using memory = Memory;
    using view_type = paged_view<Element, Heads>;
    static constexpr layout_kind kind = layout_kind::paged;

    /// A pool of `pages` pages of page_size tokens in each of `layers` layers.
    /// Any page_size >= 1 works; powers of two make the index math a shift.
    paged_cache(int layers, int pages, int page_size, bool prefix_caching = true)
        : paged_cache(Heads{}, layers, pages, page_size, prefix_caching) {
        static_assert(Heads::static_counts, "kvcache: a cache over a dynamic head_config takes the counts as its first argument");
    }

    /// The same for the given head counts (a dynamic head_config's runtime values).
    paged_cache(const Heads& heads, int layers, int pages, int page_size, bool prefix_caching = true)
        : base(heads), layers_(layers), page_size_(page_size), prefix_caching_(prefix_caching) {
        detail::require_positive(layers, "layers");
        detail::require_positive(pages, "pages");
        detail::require_positive(page_size, "page_size");
        const std::size_t key_elements = detail::checked_bytes(std::size_t(pages), std::size_t(page_elements()));
        const std::size_t value_elements = detail::checked_bytes(std::size_t(pages), std::size_t(value_page_elements()));
        for (int l = 0; l < layers; ++l) {
            keys_.emplace_back(key_elements);
            values_.emplace_back(value_elements);
        }
        pool_ = detail::page_pool(pages);
    }

    int layers() const noexcept { return layers_; }
    int page_size() const noexcept { return page_size_; }
    int page_count() const noexcept { return pool_.size(); }
    bool prefix_caching() const noexcept { return prefix_caching_; }
    /// Elements of one page's key plane (and value plane, unless a kv_elements
    /// pair): kv_heads * page_size * the stored row (head_dim for the float types).
    std::int64_t page_elements() const noexcept { return plane_elements<key_type>(); }
    /// Elements of one page's value plane (page_elements() but for a kv_elements pair).
    std::int64_t value_page_elements() const noexcept { return plane_elements<value_type>(); }
    /// Bytes one page holds in every layer, keys and values.
    std::size_t page_bytes() const noexcept {
        return std::size_t(layers_) * (std::size_t(page_elements()) * sizeof(key_type) +
                                       std::size_t(value_page_elements()) * sizeof(value_type));
    }

    /// Adds an empty sequence (no page yet).
    sequence_id add_sequence() { return sequences_.insert(state{}); }

    /// Drops the sequence's page references (publishing its full pages first,
    /// so a finished request's prefix stays cached); not_found for an unknown id.
    void remove_sequence(sequence_id id) {
        state& s = sequences_.at(id);
        publish_pages(s, s.length);
        for (int page : s.pages) pool_.release(page);
        for (int page : s.host_pages) tier_.release(page);
        sequences_.erase(id);
    }

    /// The sequence's page ids in position order.
    const std::vector<int>& pages(sequence_id id) const { return sequences_.at(id).pages; }
    /// The token ids recorded for the sequence's first positions (begin_append
    /// or plan_with_tokens with ids, match_prefix); later positions' are unknown.
    const std::vector<std::int32_t>& token_ids(sequence_id id) const { return sequences_.at(id).tokens; }
    /// References held on a page (forks and prefix hits share pages).
    int page_references(int page) const { return pool_.references(page); }

    /// Reserves n new positions and returns the first; pages are allocated
    /// (evicting cached pages if needed) and a shared, partly filled last page
    /// is copied first. capacity_exceeded, with nothing changed, when the pool
    /// cannot supply the pages even after eviction.
    int begin_append(sequence_id id, int n) { return append_positions(id, n, nullptr, 0); }

    /// begin_append() recording the new positions' token ids for the prefix
    /// cache; token_ids.size() must be n.
    int begin_append(sequence_id id, int n, const std::vector<std::int32_t>& token_ids) {
        require(static_cast<int>(token_ids.size()) == n, error_code::invalid_argument, "begin_append of ", n,
                " tokens got ", token_ids.size(), " token ids");
        return append_positions(id, n, token_ids.data(), n);
    }

    /// plan() that also records each sequence's new token ids for the prefix
    /// cache (new_token_ids[i] holds batch[i]'s new tokens; see begin_append).
    plan_type plan_with_tokens(const std::vector<sequence_id>& batch,
                               const std::vector<std::vector<std::int32_t>>& new_token_ids,
                               typename Memory::stream_type stream = {}) {
        plan_type p;
        replan_with_tokens(p, batch, new_token_ids, stream);
        return p;
    }

    /// replan() that also records token ids (see plan_with_tokens).
    void replan_with_tokens(plan_type& p, const std::vector<sequence_id>& batch,
                            const std::vector<std::vector<std::int32_t>>& new_token_ids,
                            typename Memory::stream_type stream = {}) {
        require(new_token_ids.size() == batch.size(), error_code::invalid_argument, "new_token_ids has ",
                new_token_ids.size(), " entries but the batch has ", batch.size(), " sequences");
        std::vector<int> counts;
        for (const auto& ids : new_token_ids) counts.push_back(static_cast<int>(ids.size()));
        this->replan_reserving(p, batch, counts, stream, [&](std::size_t i) {
            append_positions(batch[i], counts[i], new_token_ids[i].data(), counts[i], stream);
        });
    }

    using base::append;
    /// append() for layer 0 that also records the token ids (see begin_append).
    void append(sequence_id id, span<const key_type> keys, span<const value_type> values,
                const std::vector<std::int32_t>& token_ids) {
        const int n = static_cast<int>(token_ids.size());
        base::check_rows(keys.size(), values.size(), n, id, 0, "append");
        const int first = begin_append(id, n, token_ids);
        try {
            write(id, 0, first, keys, values, n);
        } catch (...) {
            truncate(id, first);
            throw;
        }
    }

    /// Shares the longest run of cached full pages matching token_ids with
    /// the empty sequence id, and returns the tokens covered (a multiple of
    /// page_size). Pages found in the host or disk tier are copied back into
    /// the pool while it has room; the page files such a match needs are read
    /// on the disk tier's read threads at once. Copies into the pool are
    /// issued on stream (device caches: asynchronous from the host tier's
    /// page-locked pages; a page read from its file is ordinary memory, which
    /// CUDA stages before the copy call returns). Given a stream, the call
    /// returns without waiting for them, so they overlap with what the host
    /// does next: attend to the sequence on that stream, or after it. Without
    /// one they are waited for once, before it returns. Either way a host-tier
    /// page is not refilled before the copies out of it are done (its event).
    /// invalid_argument when the sequence is not empty.
    /// Pass every prompt token but the last: that one must still run through
    /// the model for its logits, so a match never covers it.
    int match_prefix(sequence_id id, const std::vector<std::int32_t>& token_ids,
                     std::optional<typename Memory::stream_type> stream = std::nullopt) {
        const typename Memory::stream_type on = stream.value_or(typename Memory::stream_type{});
        state& s = resident(id, "match_prefix");
        require(s.length == 0, error_code::invalid_argument, "match_prefix needs an empty sequence; sequence ", id,
                " has length ", s.length);
        const int full = static_cast<int>(token_ids.size()) / page_size_;
        // The page files the walk below will read, read first, all at once
        // (changing nothing, so a failure leaves every tier as it was).
        std::vector<std::optional<page_image>> images(static_cast<std::size_t>(full));
        std::vector<char> read_ahead(static_cast<std::size_t>(full), 0);
        if (prefix_caching_) read_disk_pages_ahead(token_ids, full, images, read_ahead);
        queried_ += full;
        if (!prefix_caching_) return 0;
        // Walk the chain, holding each hit (pool pages retained, host-tier
        // pages pinned), so bringing pages back cannot evict a later page of it.
        struct hit {
            int page, host, index;
            std::uint64_t hash, parent;
        };
        std::vector<hit> chain;
        std::uint64_t parent = detail::root_hash;
        int to_bring_back = 0;
        for (int i = 0; i < full; ++i) {
            const std::int32_t* tokens = token_ids.data() + std::size_t(i) * page_size_;
            const std::uint64_t hash = detail::chain_hash(parent, tokens, page_size_);
            const int page = pool_.find(hash, parent, tokens, page_size_);
            // A miss is counted in each tier that was asked (see pool_statistics).
            pool_misses_ += page < 0 ? 1 : 0;
            // A page the pool lacks and has no room for could not come back: the
            // match ends here, before a lower tier is asked or a file is read.
            if (page < 0 && to_bring_back >= pool_.available()) break;
            const int host = page < 0 && tier_.size() > 0 ? tier_.find(hash, parent, tokens, page_size_) : -1;
            host_misses_ += page < 0 && tier_.size() > 0 && host < 0 ? 1 : 0;
            if (page < 0 && host < 0) {  // the disk tier's, or a miss; a damaged file ends the match
                if (!disk_.contains(hash, parent, tokens, page_size_)) {
                    disk_misses_ += disk_.size() > 0 ? 1 : 0;
                    break;
                }
                if (!read_ahead[std::size_t(i)])
                    images[std::size_t(i)] = disk_.read(hash, parent, tokens, page_size_, read_head_major);
                const auto& image = images[std::size_t(i)];
                disk_.note_read(hash, image.has_value(), image ? image->file_bytes : 0);
                if (!image) {
                    ++disk_misses_;
                    break;
                }
            }
            if (page >= 0) pool_.retain(page);
            else if (host >= 0) tier_.retain(host);
            to_bring_back += page < 0 ? 1 : 0;
            chain.push_back(hit{page, host, i, hash, parent});
            parent = hash;
        }
        std::size_t kept = chain.size();
        bool copied = false;
        const disk_write_batch batch(disk_, disk_read_threads_);  // each page back may push one out to a file
        for (std::size_t k = 0; k < chain.size(); ++k) {  // spilled pages come back while the pool has room
            hit& h = chain[k];
            if (h.page >= 0) continue;
            if (pool_.available() == 0) {
                kept = k;
                break;
            }
            const std::int32_t* tokens = token_ids.data() + std::size_t(h.index) * page_size_;
            h.page = allocate_page(on);
            if (h.host >= 0) {
                copy_page_from_host(h.host, h.page, on);
                ++host_hits_;
            } else {
                copy_page_from_image(*images[std::size_t(h.index)], h.page, on);
                ++disk_hits_;
            }
            pool_.publish(h.page, h.hash, h.parent, tokens, page_size_);
            copied = true;
        }
        // Released host-tier pages are refilled only after these copies (their
        // events), and the images were staged: only a caller without a stream waits.
        if (copied && !stream) Memory::synchronize(on);
        for (std::size_t k = 0; k < chain.size(); ++k) {
            if (chain[k].host >= 0) tier_.release(chain[k].host);
            if (k >= kept && chain[k].page >= 0) pool_.release(chain[k].page);
        }
        for (std::size_t k = 0; k < kept; ++k) {
            s.pages.push_back(chain[k].page);
            s.hashes.push_back(chain[k].hash);
        }
        const int matched = static_cast<int>(s.pages.size());
        hits_ += matched;
        s.length = matched * page_size_;
        s.tokens.assign(token_ids.begin(), token_ids.begin() + s.length);
        return s.length;
    }

    /// Indexes the sequence's full pages whose token ids are known; call after
    /// their rows are written (begin_append and remove_sequence do it for
    /// pages finished in earlier steps).
    void publish(sequence_id id) {
        state& s = sequences_.at(id);
        publish_pages(s, s.length);
    }

    /// Drops what the prefix cache keeps for reuse only: every pool page no
    /// sequence holds (the evictable ones) goes back to the free list, the
    /// host tier frees the spilled prefix pages nobody holds, and the disk
    /// tier deletes its page files, so no tier can serve them to a later
    /// match_prefix. Pages sequences hold (their own, forked or matched ones,
    /// swapped ones in the host tier) keep their rows and stay indexed: they
    /// are live memory, which clearing would not release. Afterwards
    /// statistics().pages_free is the pool less the pages sequences hold.
    /// Returns what each tier dropped. Cannot fail (a page file whose name
    /// cannot be built for want of memory stays on disk, forgotten).
    cleared_prefix_pages clear_prefix_cache() noexcept {
        cleared_prefix_pages cleared;
        cleared.pool = pool_.clear_cache([this](int page) noexcept { tier_.unlink_primary(page); });
        cleared.host = tier_.clear_cache();
        cleared.disk = disk_.clear_pages();
        return cleared;
    }

    using base::write;  // also from rows of the other element type, converted

    /// owner_base::set_scales, refused also while the prefix cache keeps rows
    /// (in the pool, the host tier or on disk) that no sequence holds: they
    /// were stored with the old scales and a later match would reuse them.
    void set_scales(int layer, kv_scales scales) {
        const pool_statistics st = statistics();
        const std::size_t kept = st.pages_evictable + st.host_pages_cached + st.disk_pages_used;
        require(kept == 0, error_code::invalid_argument, "set_scales on layer ", layer, ": the prefix cache keeps ",
                kept, " pages stored with the old scales (", st.pages_evictable, " in the pool, ",
                st.host_pages_cached, " in the host tier, ", st.disk_pages_used, " on disk)");
        base::set_scales(layer, scales);
    }
    /// Writes rows of positions [first, first + n) of one layer from host
    /// arrays [token][kv_head][head_dim]; shared pages touched are copied
    /// first (capacity_exceeded, with nothing changed, if no page is left).
    void write(sequence_id id, int layer, int first, span<const key_type> key_rows, span<const value_type> value_rows, int n) {
        base::check_rows(key_rows.size(), value_rows.size(), n, id, layer, "write");
        const key_type* const keys = key_rows.data();
        const value_type* const values = value_rows.data();
        this->check_layer(layer);
        state& s = resident(id, "write");
        base::check_range(id, first, n, s.length);
        if (n == 0) return;
        const int row = stored_row(s, id, layer, first, n, "write");
        const int first_page = row / page_size_, last_page = (row + n - 1) / page_size_;
        int copies = 0;
        for (int i = first_page; i <= last_page; ++i) copies += pool_.shared(s.pages[i]) ? 1 : 0;
        require_pages(copies, id);
        for (int i = first_page; i <= last_page; ++i) {
            if (pool_.shared(s.pages[i])) make_private(s, i);
            tier_.unlink_primary(s.pages[i]);  // its rows change: a host copy no longer matches
        }
        for_each_page_segment(s, row, n, [&](int page, int in_page, int done, int count) {
            scatter_side(keys_[layer].data(), page, in_page, keys + std::size_t(done) * this->key_token_row(), count);
            scatter_side(values_[layer].data(), page, in_page, values + std::size_t(done) * this->value_token_row(), count);
        });
    }

    using base::read;  // also into float or 16-bit rows, widened (int8, int4 and fp8 dequantised)

    /// Reads rows of positions [first, first + n) of one layer into host
    /// arrays (from the host tier while the sequence is swapped out).
    void read(sequence_id id, int layer, int first, int n, span<key_type> key_rows, span<value_type> value_rows) const {
        base::check_rows(key_rows.size(), value_rows.size(), n, id, layer, "read");
        key_type* const keys = key_rows.data();
        value_type* const values = value_rows.data();
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        base::check_range(id, first, n, s.length);
        if (n == 0) return;
        const int row = stored_row(s, id, layer, first, n, "read");
        if (s.swapped) {  // from the host tier (save() of a preempted sequence works too)
            for (int page : s.host_pages) tier_.wait_for_copies(page);  // the swap's copies may be in flight on its stream
            const auto& tier = tier_;
            for_each_page_segment(s.host_pages, row, n, [&](int page, int in_page, int done, int count) {
                gather_side<host_memory>(keys + std::size_t(done) * this->key_token_row(), tier.keys(layer, 0), page, in_page, count);
                gather_side<host_memory>(values + std::size_t(done) * this->value_token_row(), tier.values(layer, 0), page,
                                         in_page, count);
            });
            return;
        }
        for_each_page_segment(s, row, n, [&](int page, int in_page, int done, int count) {
            gather_side<Memory>(keys + std::size_t(done) * this->key_token_row(), keys_[layer].data(), page, in_page, count);
            gather_side<Memory>(values + std::size_t(done) * this->value_token_row(), values_[layer].data(), page, in_page,
                                count);
        });
    }

    /// Shortens the sequence, releasing pages past the new end; out_of_range
    /// when new_length is past the end. A compacted sequence drops, in every
    /// layer, the rows of positions at or past new_length (the next append
    /// lands at position new_length).
    void truncate(sequence_id id, int new_length) {
        state& s = resident(id, "truncate");
        base::check_truncate(id, new_length, s.length);
        s.compaction.truncate(new_length);
        s.length = new_length;
        release_pages_past(s, stored_rows(s));
        s.tokens.resize(std::min<std::size_t>(s.tokens.size(), new_length));
        s.hashes.resize(std::min<std::size_t>(s.hashes.size(), new_length / page_size_));
    }

    /// Keeps, in one layer of the sequence, only the rows at the visible
    /// indices `kept` (ascending, no repeats, each below visible_count(id,
    /// layer); a visible index is a row's rank among the layer's present
    /// positions, the index attention's views use). The kept rows move in
    /// order to the front of the sequence's storage and keep their true
    /// positions; length(id), the next token's position, does not change, and
    /// tokens appended later land after the kept rows. Pages shared with a
    /// fork, a prefix hit or the prefix cache are copied before a row moves
    /// into them; pages no layer's rows reach any more are released. The
    /// sequence's pages from the first moved row on are no longer offered to
    /// the prefix cache (they no longer hold its token ids' rows).
    /// Throws, with nothing changed: not_found (unknown id), out_of_range (a
    /// bad layer or index), invalid_argument (indices not ascending or
    /// repeated, a swapped-out sequence), capacity_exceeded (no page for a copy on write).
    void compact(sequence_id id, int layer, const std::vector<int>& kept) {
        this->check_layer(layer);
        compact_layers(id, {layer}, {&kept});
    }

    /// compact() of every layer at once: kept[l] is layer l's list (layers
    /// may keep different rows and counts; pages are released only past the
    /// rows of the layer that keeps the most, since the page table is shared
    /// by all layers). All or nothing: a bad list changes no layer.
    void compact(sequence_id id, const std::vector<std::vector<int>>& kept) {
        const detail::every_layer_lists every(id, kept, layers_);
        compact_layers(id, every.which, every.lists);
    }

    /// Rows the sequence stores in one layer: its present positions there
    /// (length(id) until a compaction drops some).
    int visible_count(sequence_id id, int layer) const {
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        return s.length - rows_of_layer(s, layer).dropped;
    }
    /// The positions of the rows one layer stores, ascending (visible index i
    /// holds the i-th): what a policy's visible indices refer to.
    std::vector<int> present_positions(sequence_id id, int layer) const {
        this->check_layer(layer);
        const state& s = sequences_.at(id);
        return s.compaction.positions(layer, s.length);
    }
    /// True while some layer of the sequence holds fewer rows than its length.
    bool compacted(sequence_id id) const { return !sequences_.at(id).compaction.empty(); }

    /// A new sequence sharing every page of id (reference counts + 1); the
    /// first write into a shared page by either side copies that page.
    sequence_id fork(sequence_id id) {
        state child = sequences_.at(id);
        for (int page : child.pages) pool_.retain(page);
        for (int page : child.host_pages) tier_.retain(page);  // a swapped sequence forks in the host tier
        return sequences_.insert(std::move(child));
    }

    /// Gives the cache a host tier of `pages` pages of the pool's page shape
    /// (page-locked host memory for a device cache; 0 removes the tier).
    /// invalid_argument while a sequence is swapped out, out_of_memory when
    /// the allocation fails; either way the old tier stays.
    void attach_host_tier(int pages) {
        require(pages >= 0, error_code::invalid_argument, "host tier pages = ", pages, " must not be negative");
        for (const auto& entry : sequences_)
            require(!entry.second.swapped, error_code::invalid_argument, "cannot replace the host tier while sequence ",
                    entry.first, " is swapped out to it");
        tier_ = detail::host_tier<Element, Memory>(layers_, pages, page_elements(), value_page_elements(), pool_.size());
    }
    /// Gives the host tier a disk tier below it: up to `pages` spilled prefix
    /// pages the host tier evicts are written to files in `directory` (which
    /// must exist), one cache file per page, and match_prefix reads them
    /// back, on up to read_threads threads at once (0: the machine's hardware
    /// threads, at most 8). A call that may spill many pages (match_prefix,
    /// append, swap_out, swap_in, load) writes their files together on the
    /// same threads before it returns. A file that is missing, damaged or
    /// holds other tokens is a miss. The files are deleted with the tier.
    /// invalid_argument without a host tier or for a negative count;
    /// io_error when the directory is missing or not writable.
    void attach_disk_tier(const std::string& directory, int pages, int read_threads = 0) {
        require(tier_.size() > 0, error_code::invalid_argument,
                "a disk tier sits below the host tier: attach_host_tier(pages) first");
        require(pages >= 0, error_code::invalid_argument, "disk tier pages = ", pages, " must not be negative");
        require(read_threads >= 0, error_code::invalid_argument, "disk tier read_threads = ", read_threads,
                " must not be negative (0: the machine's hardware threads)");
        disk_ = detail::disk_tier<Element>(directory, pages, header());
        disk_read_threads_ =
            read_threads > 0 ? read_threads : std::clamp(int(std::thread::hardware_concurrency()), 1, 8);
    }
    /// Threads the disk tier reads page files on, and writes batches of them on.
    int disk_read_threads() const noexcept { return disk_read_threads_; }
    /// Pages of the disk tier (0: none).
    int disk_tier_pages() const noexcept { return disk_.size(); }

    /// Pages of the host tier (0: none).
    int host_tier_pages() const noexcept { return tier_.size(); }
    /// True while the sequence's rows are in the host tier.
    bool swapped_out(sequence_id id) const { return sequences_.at(id).swapped; }

    /// Moves a sequence's pages to the host tier and releases them in the
    /// pool (preemption under memory pressure). Its full pages are published
    /// to the prefix cache first, so they may still serve matches while they
    /// stay cached. A page already in the tier for another swapped sequence
    /// (a fork, a prefix hit) is not copied again but shared there; a page
    /// whose unchanged copy is still in the tier from an earlier swap is not
    /// copied either. Until swap_in(), attending to, writing, appending to or
    /// truncating the sequence is refused; read() and save() read the tier. Copies are ordered on stream
    /// (device caches: asynchronous into page-locked memory; later work that
    /// reuses the released pages must be on the same stream).
    /// invalid_argument without a tier or when already swapped;
    /// capacity_exceeded, with nothing changed, when the tier is short.
    void swap_out(sequence_id id, typename Memory::stream_type stream = {}) {
        state& s = resident(id, "swap out");
        require(tier_.size() > 0, error_code::invalid_argument, "cannot swap out sequence ", id,
                ": the cache has no host tier (attach_host_tier(pages) first)");
        int needed = 0;
        for (int page : s.pages) needed += tier_.host_twin(page) < 0 ? 1 : 0;
        require(needed <= tier_.available(), error_code::capacity_exceeded, "swapping out sequence ", id, " needs ",
                needed, " host-tier pages; ", tier_.available(), " of ", tier_.size(),
                " are free or hold spilled prefix pages");
        publish_pages(s, s.length);
        const disk_write_batch batch(disk_, disk_read_threads_);
        std::vector<int> host_pages;
        host_pages.reserve(s.pages.size());
        for (int page : s.pages) {
            int host = tier_.host_twin(page);
            if (host >= 0) {
                tier_.retain(host);
                ++swap_copies_avoided_;
            } else {
                host = allocate_host_page();
                copy_page_to_host(page, host, stream);
                tier_.link(page, host);
                ++swapped_out_pages_;
            }
            host_pages.push_back(host);
        }
        for (int page : s.pages) pool_.release(page);
        s.pages.clear();
        s.host_pages = std::move(host_pages);
        s.swapped = true;
    }

    /// Brings a swapped-out sequence back into the pool (to any pages; its
    /// page table is rewritten). A host page shared by several swapped
    /// sequences comes back as one shared page, and one whose pool copy is
    /// still held (by a fork, or the prefix cache) is not copied. Copies are
    /// ordered on stream. Given a stream, swap_in returns without waiting for
    /// them, so they overlap with what the host does next (device caches:
    /// attend to the sequence on that stream, or after it); without one it
    /// waits for them. The host pages they read are not refilled before they
    /// are done (each page's event). invalid_argument when the sequence is not swapped
    /// out; capacity_exceeded, with nothing changed, when the pool is short
    /// even after evicting cached pages.
    void swap_in(sequence_id id, std::optional<typename Memory::stream_type> stream = std::nullopt) {
        const typename Memory::stream_type on = stream.value_or(typename Memory::stream_type{});
        state& s = sequences_.at(id);
        require(s.swapped, error_code::invalid_argument, "cannot swap in sequence ", id, ": it is not swapped out");
        int needed = 0, kept_evictable = 0;
        for (int host : s.host_pages) {
            const int twin = live_primary_twin(host);
            if (twin < 0) ++needed;
            else if (pool_.references(twin) == 0) ++kept_evictable;  // reusing it takes it off the evictable list
        }
        require(needed <= pool_.available() - kept_evictable, error_code::capacity_exceeded, "swapping in sequence ",
                id, " needs ", needed, " pages; the pool of ", pool_.size(), " has ", pool_.free_count(),
                " free and ", pool_.evictable_count() - kept_evictable, " evictable");
        const disk_write_batch batch(disk_, disk_read_threads_);
        std::vector<int> pages(s.host_pages.size(), -1);
        for (std::size_t i = 0; i < pages.size(); ++i) {  // the twins first, so no allocation evicts one
            const int twin = live_primary_twin(s.host_pages[i]);
            if (twin < 0) continue;
            pool_.retain(twin);
            pages[i] = twin;
            ++swap_copies_avoided_;
        }
        for (std::size_t i = 0; i < pages.size(); ++i) {
            if (pages[i] >= 0) continue;
            pages[i] = allocate_page();
            copy_page_from_host(s.host_pages[i], pages[i], on);
            tier_.link(pages[i], s.host_pages[i]);
            ++swapped_in_pages_;
        }
        // Released host pages are refilled only after the copies out of them
        // (their events): only a caller without a stream waits.
        if (!stream) Memory::synchronize(on);
        for (int host : s.host_pages) tier_.release(host);
        s.host_pages.clear();
        s.pages = std::move(pages);
        s.swapped = false;
    }

    /// Positions a kernel may read: all of [0, length) unless the sequence
    /// was compacted, then those of its layers, which must agree (what save()
    /// records): invalid_argument when layers keep different positions.
    std::vector<int> present_positions(sequence_id id) const {
        const state& s = sequences_.at(id);
        return s.compaction.common_positions(id, s.length, layers_);
    }

    /// The view of one layer over a batch, with the CSR page table in the
    /// cache's memory space. Valid until the cache changes or a view of a
    /// different batch is made (every layer's view of one batch shares the
    /// table); a step_plan's views (plan()) have no such limit.
    view_type view(int layer, const std::vector<sequence_id>& batch) {
        this->check_layer(layer);
        const std::vector<int> table = view_table(batch);
        view_type v = view_over(layer, table_.upload(table), static_cast<int>(batch.size()), table.data());
        v.sequence_ids = table_.label(batch);
        return v;
    }

    /// The index table a view of batch reads: lengths [n], page offsets
    /// [n + 1], the page ids of each sequence, then 0 when no sequence of
    /// the batch is compacted, else 1, where each layer's section starts [L],
    /// and per layer its section: dropped positions [n], offsets [n + 1]
    /// into the kept positions that follow (see paged_view).
    std::vector<int> view_table(const std::vector<sequence_id>& batch) const {
        sequences_.require_all(batch);
        const std::size_t n = batch.size();
        std::vector<int> table(2 * n + 1);
        for (std::size_t i = 0; i < n; ++i) {
            const state& s = resident(batch[i], "attend to");
            table[i] = s.length;
            table[n + 1 + i] = table[n + i] + static_cast<int>(s.pages.size());
            table.insert(table.end(), s.pages.begin(), s.pages.end());
        }
        detail::append_compaction_sections(table, n, layers_,
                                           [&](std::size_t i) -> const layer_table& { return sequences_.at(batch[i]).compaction; });
        return table;
    }

    /// The view of one layer whose index table (view_table()'s contents, in
    /// the cache's memory space) the caller keeps at table, for n entries;
    /// host_table is the same table in host memory (it says where the
    /// layer's compaction section starts). A host cache may pass null: the
    /// table itself is read then; a device cache must pass it.
    view_type view_over(int layer, const int* table, int n, const int* host_table = nullptr) {
        this->check_layer(layer);
        if constexpr (Memory::space == memory_space::host) {
            if (!host_table) host_table = table;
        }
        require(host_table != nullptr || n == 0, error_code::invalid_argument,
                "view_over of a device cache needs the index table's host copy");
        view_type v = view_type::packed(keys_[layer].data(), values_[layer].data(), table + n, table + 2 * n + 1, table, n,
                                 page_size_, this->head_counts());
        v.scales = this->scales(layer);
        if (n == 0 || !table) return v;
        detail::attach_compaction(v, table, host_table, 2 * n + 1 + host_table[2 * n], layer, n);
        return v;
    }

    /// Pages, prefix-cache counters and bytes.
    pool_statistics statistics() const {
        pool_statistics st;
        st.pages_total = pool_.size();
        st.pages_free = pool_.free_count();
        st.pages_evictable = pool_.evictable_count();
        st.pages_used = st.pages_total - st.pages_free - st.pages_evictable;
        st.pages_cached = pool_.cached_count();
        st.prefix_queried_pages = queried_;
        st.prefix_hit_pages = hits_;
        st.evictions = pool_.evictions();
        st.copies = copies_;
        st.pages_released_by_compaction = compaction_releases_;
        st.rows_moved_by_compaction = rows_moved_;
        const std::size_t page_bytes = this->page_bytes();
        st.bytes_reserved = page_bytes * st.pages_total;
        st.bytes_used = page_bytes * st.pages_used;
        st.bytes_cached = page_bytes * st.pages_evictable;
        st.host_pages_total = tier_.size();
        st.host_pages_used = tier_.used();
        for (const auto& entry : sequences_) st.sequences_swapped_out += entry.second.swapped ? 1 : 0;
        st.pages_swapped_out = swapped_out_pages_;
        st.pages_swapped_in = swapped_in_pages_;
        st.swap_copies_avoided = swap_copies_avoided_;
        st.bytes_swapped_out = page_bytes * swapped_out_pages_;
        st.bytes_swapped_in = page_bytes * swapped_in_pages_;
        st.host_pages_cached = tier_.cached_count();
        st.pages_spilled = spilled_pages_;
        st.host_prefix_hit_pages = host_hits_;
        st.disk_pages_total = disk_.size();
        st.disk_pages_used = disk_.count();
        st.pages_written_to_disk = disk_.counters().stored;
        st.disk_prefix_hit_pages = disk_hits_;
        st.disk_pages_refused = disk_.counters().damaged;
        st.pool_prefix_miss_pages = pool_misses_;
        st.host_prefix_miss_pages = host_misses_;
        st.disk_prefix_miss_pages = disk_misses_;
        st.bytes_written_to_disk = disk_.counters().bytes_written;
        st.bytes_read_from_disk = disk_.counters().bytes_read;
        st.pool_prefix_hit_pages = hits_ - host_hits_ - disk_hits_;
        st.host_bytes_total = page_bytes * std::size_t(st.host_pages_total);
        st.host_bytes_used = page_bytes * std::size_t(st.host_pages_used);
        st.host_bytes_cached = page_bytes * std::size_t(st.host_pages_cached);
        st.bytes_spilled = page_bytes * spilled_pages_;
        st.bytes_brought_back_from_host = page_bytes * host_hits_;
        st.disk_write_failures = disk_.counters().write_failures;
        return st;
    }
    std::size_t bytes_reserved() const { return statistics().bytes_reserved; }
    std::size_t bytes_used() const { return statistics().bytes_used; }

private:
    using layer_rows = detail::layer_rows;
    using layer_table = detail::layer_table;

    struct state {
        int length = 0;
        std::vector<int> pages;
        std::vector<std::int32_t> tokens;  // token ids of positions [0, tokens.size()); later ones unknown
        std::vector<std::uint64_t> hashes; // chained hash of each full page with known tokens
        bool swapped = false;              // the rows are in the host tier (host_pages), pages is empty
        std::vector<int> host_pages;       // host-tier page ids in position order while swapped
        layer_table compaction;            // per layer once compacted; empty: storage row == position everywhere
    };

    /// The sequence's state; invalid_argument, naming what was asked, while it is swapped out.
    state& resident(sequence_id id, const char* what) {
        return const_cast<state&>(static_cast<const paged_cache&>(*this).resident(id, what));
    }
    const state& resident(sequence_id id, const char* what) const {
        const state& s = sequences_.at(id);
        require(!s.swapped, error_code::invalid_argument, "cannot ", what, " sequence ", id,
                ": it is swapped out to the host tier (swap_in(", id, ") first)");
        return s;
    }

    /// A page for new rows: when that evicts a cached prefix page, the page
    /// is spilled to the host tier first (if there is one); any host-tier link
    /// of its previous contents is broken. With a stream, the spill's copy is
    /// ordered on it (a plan's), else it is done on return.
    int allocate_page(std::optional<typename Memory::stream_type> stream = std::nullopt) {
        spill(pool_.next_victim(), stream);
        const int page = pool_.allocate();
        tier_.unlink_primary(page);
        return page;
    }

    /// Copies a cached page about to be evicted into the host tier's prefix
    /// index (evicting the tier's least recently spilled page if it is full).
    /// When every host-tier page is held (swapped sequences, pinned hits), the
    /// page goes straight to the disk tier, if there is one, rather than being lost.
    void spill(int victim, std::optional<typename Memory::stream_type> stream) {
        if (victim < 0 || tier_.size() == 0) return;
        const std::vector<std::int32_t>& tokens = pool_.tokens_of(victim);
        const std::uint64_t hash = pool_.hash_of(victim), parent = pool_.parent_of(victim);
        if (tier_.find(hash, parent, tokens.data(), static_cast<int>(tokens.size())) >= 0) return;  // spilled before
        if (tier_.available() == 0) {
            if (disk_.size() > 0) spill_pool_page_to_disk(victim, hash, parent, tokens, stream);
            return;
        }
        const int host = allocate_host_page();
        if (stream) {
            copy_page_to_host(victim, host, *stream);
        } else {
            tier_.wait_for_copies(host);  // earlier copies of the page, on any stream, must not land after this one
            for (int l = 0; l < layers_; ++l) {
                Memory::copy_to_host(tier_.keys(l, host), key_plane(l, victim), key_plane_bytes());
                Memory::copy_to_host(tier_.values(l, host), value_plane(l, victim), value_plane_bytes());
            }
        }
        tier_.publish(host, hash, parent, tokens);
        tier_.release(host);  // nobody holds it: evictable in the tier, least recently spilled first
        ++spilled_pages_;
    }

    /// A host-tier page for new rows: when that evicts a spilled prefix page,
    /// the page goes to the disk tier first (if there is one).
    int allocate_host_page() {
        const int victim = tier_.next_victim();
        if (victim >= 0 && disk_.size() > 0) spill_to_disk(victim);
        return tier_.allocate();
    }

    /// Writes spilled host page `host` to the disk tier as token-major rows.
    void spill_to_disk(int host) {
        tier_.wait_for_copies(host);  // the spill's copy into it may still be in flight on a plan's stream
        typename detail::disk_tier<Element>::key_rows keys(layers_);
        typename detail::disk_tier<Element>::value_rows values(layers_);
        for (int l = 0; l < layers_; ++l) {
            keys[l].resize(std::size_t(page_size_) * this->kv_heads() * row_of<key_type>);
            values[l].resize(std::size_t(page_size_) * this->kv_heads() * row_of<value_type>);
            detail::planes_to_token_rows(tier_.keys(l, host), keys[l].data(), page_size_, this->kv_heads(),
                                         row_of<key_type>);
            detail::planes_to_token_rows(tier_.values(l, host), values[l].data(), page_size_, this->kv_heads(),
                                         row_of<value_type>);
        }
        disk_.store(tier_.hash_of(host), tier_.parent_of(host), tier_.tokens_of(host), std::move(keys),
                    std::move(values));
    }

    /// Writes pool page `victim` to the disk tier as token-major rows (the
    /// host tier had no page to give), once the writes that may be pending
    /// on its rows are done: with a stream, that stream's work (the page is
    /// being handed to work on it, which must be ordered after whatever
    /// wrote the page, or its own writes would race them); without one,
    /// every stream's, as any plan's may still be writing them.
    void spill_pool_page_to_disk(int victim, std::uint64_t hash, std::uint64_t parent,
                                 const std::vector<std::int32_t>& tokens,
                                 std::optional<typename Memory::stream_type> stream) {
        if (disk_.contains(hash, parent, tokens.data(), static_cast<int>(tokens.size()))) return;
        if (stream)
            Memory::synchronize(*stream);
        else
            Memory::synchronize();
        typename detail::disk_tier<Element>::key_rows keys(layers_);
        typename detail::disk_tier<Element>::value_rows values(layers_);
        for (int l = 0; l < layers_; ++l) {
            keys[l].resize(std::size_t(page_size_) * this->kv_heads() * row_of<key_type>);
            values[l].resize(std::size_t(page_size_) * this->kv_heads() * row_of<value_type>);
            gather_side<Memory>(keys[l].data(), keys_[l].data(), victim, 0, page_size_);
            gather_side<Memory>(values[l].data(), values_[l].data(), victim, 0, page_size_);
        }
        disk_.store(hash, parent, tokens, std::move(keys), std::move(values));
    }

    /// A page read back from its file.
    using page_image = typename detail::disk_tier<Element>::page_rows;
    /// Holds the disk tier's page writes back for a call that may spill many
    /// pages, and writes them on the tier's threads when the call ends.
    using disk_write_batch = typename detail::disk_tier<Element>::write_batch;
    /// Pages read back for device memory are made head-major on the read
    /// threads, so each plane is one copy call; a host pool takes the file's
    /// rows and reorders them as it copies.
    static constexpr bool read_head_major = Memory::space != memory_space::host;

    /// Reads the page files match_prefix's walk over token_ids will ask for
    /// (a few more when a file turns out damaged: the walk stops there) on
    /// the disk tier's read threads, each into images at its place in the
    /// chain, and marks it in read_ahead (a damaged file leaves an empty image).
    void read_disk_pages_ahead(const std::vector<std::int32_t>& token_ids, int full,
                               std::vector<std::optional<page_image>>& images, std::vector<char>& read_ahead) const {
        if (disk_.count() == 0) return;
        struct wanted {
            int index;
            std::uint64_t hash, parent;
        };
        std::vector<wanted> reads;
        std::uint64_t parent = detail::root_hash;
        // The same walk as match_prefix's, without its side effects: retaining
        // an evictable page takes it from what the pool has available.
        int room = pool_.available();
        for (int i = 0; i < full; ++i) {
            const std::int32_t* tokens = token_ids.data() + std::size_t(i) * page_size_;
            const std::uint64_t hash = detail::chain_hash(parent, tokens, page_size_);
            const int page = pool_.find(hash, parent, tokens, page_size_);
            if (page >= 0) {
                room -= pool_.references(page) == 0 ? 1 : 0;
            } else {
                if (room <= 0) break;
                --room;
                if (tier_.size() == 0 || tier_.find(hash, parent, tokens, page_size_) < 0) {
                    if (!disk_.contains(hash, parent, tokens, page_size_)) break;
                    reads.push_back(wanted{i, hash, parent});
                }
            }
            parent = hash;
        }
        detail::run_in_parallel(static_cast<int>(reads.size()), disk_read_threads_, [&](int k) {
            const wanted& w = reads[std::size_t(k)];
            images[std::size_t(w.index)] =
                disk_.read(w.hash, w.parent, token_ids.data() + std::size_t(w.index) * page_size_, page_size_,
                           read_head_major);
        });
        for (const wanted& w : reads) read_ahead[std::size_t(w.index)] = 1;
    }

    /// The primary page still holding host page h's rows, or -1: a linked page
    /// someone references or the prefix cache keeps (a freed one may be reused).
    int live_primary_twin(int h) const {
        const int p = tier_.primary_twin(h);
        return p >= 0 && (pool_.references(p) > 0 || pool_.cached(p)) ? p : -1;
    }

    /// Copies one page between the tiers in every layer, ordered on stream
    /// and after the host page's earlier copies (on any stream: a fill on
    /// another plan's stream, or a copy out of it still in flight); the host
    /// page's event then marks these copies' end.
    void copy_page_to_host(int primary, int host, typename Memory::stream_type stream) {
        tier_.order_after_copies(host, stream);
        for (int l = 0; l < layers_; ++l) {
            Memory::copy_to_host_async(tier_.keys(l, host), key_plane(l, primary), key_plane_bytes(), stream);
            Memory::copy_to_host_async(tier_.values(l, host), value_plane(l, primary), value_plane_bytes(), stream);
        }
        tier_.note_copies(host, stream);
    }
    void copy_page_from_host(int host, int primary, typename Memory::stream_type stream) {
        tier_.order_after_copies(host, stream);
        for (int l = 0; l < layers_; ++l) {
            Memory::copy_from_host_async(key_plane(l, primary), tier_.keys(l, host), key_plane_bytes(), stream);
            Memory::copy_from_host_async(value_plane(l, primary), tier_.values(l, host), value_plane_bytes(), stream);
        }
        tier_.note_copies(host, stream);  // a later fill of the page waits for this read
    }
    /// Copies a page read from its file into pool page `primary`, ordered on stream.
    void copy_page_from_image(const page_image& image, int primary, typename Memory::stream_type stream) {
        for (int l = 0; l < layers_; ++l) {
            const key_type* keys = image.keys.data() + l * page_elements();
            const value_type* values = image.values.data() + l * value_page_elements();
            if constexpr (read_head_major) {
                Memory::copy_from_host_async(key_plane(l, primary), keys, key_plane_bytes(), stream);
                Memory::copy_from_host_async(value_plane(l, primary), values, value_plane_bytes(), stream);
            } else {
                detail::token_rows_to_planes(keys, key_plane(l, primary), page_size_, this->kv_heads(),
                                             row_of<key_type>);
                detail::token_rows_to_planes(values, value_plane(l, primary), page_size_, this->kv_heads(),
                                             row_of<value_type>);
            }
        }
    }

    template <class Side>
    static constexpr int row_of = row_elements<Side>(Heads::head_dim);  ///< elements of one stored row of a side
    /// Elements of one page's plane of a side.
    template <class Side>
    std::int64_t plane_elements() const noexcept { return std::int64_t(this->kv_heads()) * page_size_ * row_of<Side>; }
    /// Page `page`'s key (value) plane in one layer, and its bytes.
    key_type* key_plane(int layer, int page) { return keys_[layer].data() + page * page_elements(); }
    value_type* value_plane(int layer, int page) { return values_[layer].data() + page * value_page_elements(); }
    std::size_t key_plane_bytes() const noexcept { return std::size_t(page_elements()) * sizeof(key_type); }
    std::size_t value_plane_bytes() const noexcept { return std::size_t(value_page_elements()) * sizeof(value_type); }
    /// Element of row `in_page` of head 0 in page `page` of a side's plane array.
    template <class Side>
    std::int64_t row_at(int page, int in_page) const noexcept {
        return page * plane_elements<Side>() + std::int64_t(in_page) * row_of<Side>;
    }
    /// count token-major host rows [token][kv_head][row] into rows in_page.. of a pool page of one side.
    template <class Side>
    void scatter_side(Side* planes, int page, int in_page, const Side* rows, int count) {
        detail::scatter_rows<Side, Heads, Memory>(planes + row_at<Side>(page, in_page), std::int64_t(page_size_) * row_of<Side>,
                                                  rows, count, this->kv_heads());
    }
    /// The reverse of scatter_side, from planes in memory space From (the pool's, or the host tier's).
    template <class From, class Side>
    void gather_side(Side* rows, const Side* planes, int page, int in_page, int count) const {
        detail::gather_rows<Side, Heads, From>(rows, planes + row_at<Side>(page, in_page),
                                               std::int64_t(page_size_) * row_of<Side>, count, this->kv_heads());
    }

    std::size_t pages_for(int length) const { return (std::size_t(length) + page_size_ - 1) / page_size_; }

    /// One layer's stored positions (row == position when never compacted).
    const layer_rows& rows_of_layer(const state& s, int layer) const { return s.compaction.layer(layer); }
    /// Which of s's pages the rows of n new tokens land in: each layer's go
    /// after its own rows, so with layers of different counts, earlier pages too.
    std::vector<char> pages_landed_in(const state& s, int n) const {
        std::vector<char> landing(s.pages.size(), 0);
        const auto mark = [&](int dropped) {
            const int rows = s.length - dropped;
            for (std::size_t i = std::size_t(rows / page_size_); i < landing.size() && n > 0 &&
                                                                 i <= std::size_t((rows + n - 1) / page_size_); ++i)
                landing[i] = 1;
        };
        if (s.compaction.empty()) mark(0);
        for (const layer_rows& r : s.compaction) mark(r.dropped);
        return landing;
    }
    /// Rows of the layer that stores the most: what s's pages must hold.
    int stored_rows(const state& s) const { return s.length - s.compaction.fewest_dropped(); }

    /// Storage row of position first of one layer (see layer_table::stored_row).
    int stored_row(const state& s, sequence_id id, int layer, int first, int n, const char* op) const {
        return s.compaction.stored_row(id, s.length, layer, first, n, op);
    }

    /// A compacted sequence's pages past its identity rows no longer hold the
    /// rows of their token ids (or will not once appended to): it forgets
    /// those token ids, so the pages are never offered to the prefix cache.
    void forget_tokens_past_identity(state& s) const {
        const std::size_t identity = s.compaction.identity_rows();
        s.tokens.resize(std::min(s.tokens.size(), identity));
        s.hashes.resize(std::min(s.hashes.size(), identity / std::size_t(page_size_)));
    }

    /// Releases s's pages past those rows [0, rows) need.
    void release_pages_past(state& s, int rows) {
        const std::size_t keep = pages_for(rows);
        for (std::size_t i = keep; i < s.pages.size(); ++i) pool_.release(s.pages[i]);
        if (keep < s.pages.size()) s.pages.resize(keep);
    }

    /// compact() of the listed layers: everything is checked (and the pages
    /// copies on write need counted) before anything changes.
    void compact_layers(sequence_id id, const std::vector<int>& layers, const std::vector<const std::vector<int>*>& lists) {
        state& s = resident(id, "compact");
        // The new stored positions of each listed layer (all checked here).
        std::vector<layer_rows> after = s.compaction.after_compaction(id, s.length, layers_, layers, lists);
        // Rows move down to the front: each destination page that someone else
        // can see (a fork, a prefix hit, the prefix cache) is copied first.
        std::vector<char> touched(s.pages.size(), 0);
        for (std::size_t k = 0; k < layers.size(); ++k) {
            const std::vector<int>& kept = *lists[k];
            for (std::size_t j = 0; j < kept.size(); ++j)
                if (kept[j] != static_cast<int>(j)) touched[j / std::size_t(page_size_)] = 1;
        }
        int copies = 0;
        for (std::size_t i = 0; i < touched.size(); ++i) copies += touched[i] && pool_.shared(s.pages[i]) ? 1 : 0;
        require_pages(copies, id);

        for (std::size_t i = 0; i < touched.size(); ++i) {
            if (!touched[i]) continue;
            if (pool_.shared(s.pages[i])) make_private(s, static_cast<int>(i));
            tier_.unlink_primary(s.pages[i]);  // its rows change: a host copy no longer matches
        }
        for (std::size_t k = 0; k < layers.size(); ++k) move_rows(s, layers[k], *lists[k]);
        s.compaction = std::move(after);
        s.compaction.normalize();
        forget_tokens_past_identity(s);
        const std::size_t pages_before = s.pages.size();
        release_pages_past(s, stored_rows(s));
        compaction_releases_ += pages_before - s.pages.size();
    }

    /// Moves row kept[j] of one layer to row j, front to back (a row only
    /// moves down, so none is overwritten before it moved), in pieces that
    /// neither cross a page nor overlap their source.
    void move_rows(const state& s, int layer, const std::vector<int>& kept) {
        // count rows from storage row `from` to `to` in every KV head of one side's planes.
        const auto move = [&](auto* planes, int to, int from, int count) {
            using side = std::remove_pointer_t<decltype(planes)>;
            const auto at = [&](int row) { return row_at<side>(s.pages[std::size_t(row / page_size_)], row % page_size_); };
            const std::int64_t head_stride = std::int64_t(page_size_) * row_of<side>;
            const std::size_t bytes = std::size_t(count) * row_of<side> * sizeof(side);
            for (int h = 0; h < this->kv_heads(); ++h)
                Memory::copy_within(planes + at(to) + h * head_stride, planes + at(from) + h * head_stride, bytes);
        };
        for (int j = 0; j < static_cast<int>(kept.size());) {
            const int from = kept[std::size_t(j)];
            if (from == j) {
                ++j;
                continue;
            }
            int count = 1;
            const int limit = std::min({from - j, page_size_ - j % page_size_, page_size_ - from % page_size_});
            while (count < limit && j + count < static_cast<int>(kept.size()) && kept[std::size_t(j + count)] == from + count)
                ++count;
            move(keys_[layer].data(), j, from, count);
            move(values_[layer].data(), j, from, count);
            rows_moved_ += std::uint64_t(count);
            j += count;
        }
    }

    /// Calls f(page, in_page, done, count) for each page-long piece of storage
    /// rows [first, first + n) of s (the positions, unless it was compacted):
    /// the piece is rows in_page .. in_page + count of page id `page`, and
    /// token `done` of the caller's [token][kv_head][row] arrays.
    template <class F>
    void for_each_page_segment(const state& s, int first, int n, F&& f) const {
        for_each_page_segment(s.pages, first, n, f);
    }
    /// The same over a list of page ids (a swapped sequence's host pages).
    template <class F>
    void for_each_page_segment(const std::vector<int>& pages, int first, int n, F&& f) const {
        for (int done = 0; done < n;) {
            const int p = first + done, row = p % page_size_;
            const int count = std::min(page_size_ - row, n - done);
            f(pages[std::size_t(p / page_size_)], row, done, count);
            done += count;
        }
    }

    void require_pages(int needed, sequence_id id) const {
        require(needed <= pool_.available(), error_code::capacity_exceeded, "sequence ", id, " needs ", needed,
                " pages; the pool of ", pool_.size(), " has ", pool_.free_count(), " free and ",
                pool_.evictable_count(), " evictable");
    }

    /// A plan's reservation: copies on write ordered on the plan's stream.
    void reserve_for_plan(sequence_id id, int n, typename Memory::stream_type stream) {
        append_positions(id, n, nullptr, 0, stream);
    }

    /// Reserves n positions (see begin_append); with a stream, a copy on
    /// write is ordered on it (a plan's), else it is done on return.
    int append_positions(sequence_id id, int n, const std::int32_t* tokens, int token_count,
                         std::optional<typename Memory::stream_type> stream = std::nullopt) {
        detail::require_count(n, "n_tokens");
        state& s = resident(id, "append to");
        require(n <= 0x7fffffff - s.length, error_code::capacity_exceeded, "length ", s.length, " + ", n,
                " overflows int");
        const int old = s.length;
        const int needed = static_cast<int>(pages_for(stored_rows(s) + n) - s.pages.size());
        const std::vector<char> landing = pages_landed_in(s, n);
        int copies = 0;
        for (std::size_t i = 0; i < landing.size(); ++i) copies += landing[i] && pool_.shared(s.pages[i]) ? 1 : 0;
        require_pages(needed + copies, id);
        publish_pages(s, old);  // rows below the old length were written in earlier steps
        for (std::size_t i = 0; i < landing.size(); ++i) {
            if (!landing[i]) continue;
            if (pool_.shared(s.pages[i])) make_private(s, static_cast<int>(i), stream);
            tier_.unlink_primary(s.pages[i]);  // new rows land in it
        }
        const disk_write_batch batch(disk_, disk_read_threads_);
        for (int i = 0; i < needed; ++i) s.pages.push_back(allocate_page(stream));
        if (static_cast<int>(s.tokens.size()) == old) s.tokens.insert(s.tokens.end(), tokens, tokens + token_count);
        s.length = old + n;
        return old;
    }

    /// Indexes full pages below `written` whose token ids are known.
    void publish_pages(state& s, int written) {
        if (s.swapped) return;  // published when it was swapped out
        const int full = std::min<int>(written, static_cast<int>(s.tokens.size())) / page_size_;
        for (int i = static_cast<int>(s.hashes.size()); i < full; ++i) {
            const std::uint64_t parent = i ? s.hashes[i - 1] : detail::root_hash;
            const std::int32_t* tokens = s.tokens.data() + std::size_t(i) * page_size_;
            const std::uint64_t hash = detail::chain_hash(parent, tokens, page_size_);
            if (prefix_caching_) pool_.publish(s.pages[i], hash, parent, tokens, page_size_);
            s.hashes.push_back(hash);
        }
    }

    /// Replaces page i of s by a private copy (every layer), ordered on
    /// stream when one is given.
    void make_private(state& s, int i, std::optional<typename Memory::stream_type> stream = std::nullopt) {
        const int old = s.pages[i];
        const int fresh = allocate_page(stream);
        const auto copy = [&](auto* planes) {
            using side = std::remove_pointer_t<decltype(planes)>;
            const std::int64_t elements = plane_elements<side>();
            const std::size_t bytes = std::size_t(elements) * sizeof(side);
            if (stream)
                Memory::copy_within_async(planes + fresh * elements, planes + old * elements, bytes, *stream);
            else
                Memory::copy_within(planes + fresh * elements, planes + old * elements, bytes);
        };
        for (int l = 0; l < layers_; ++l) {
            copy(keys_[l].data());
            copy(values_[l].data());
        }
        pool_.release(old);
        s.pages[i] = fresh;
        ++copies_;
    }

    std::vector<std::int32_t> tokens_of(sequence_id id) const { return sequences_.at(id).tokens; }


    detail::file_header header() const {
        detail::file_header h;
        h.layout = kind;
        h.element = kinds_of<Element>();
        h.heads = shape_of(this->head_counts());
        h.layers = layers_;
        h.parameters[0] = page_size_;
        return h;
    }

    /// Loads records; one holding fewer positions than its length (a
    /// compacted sequence's) comes back compacted the same in every layer.
    std::vector<sequence_id> restore(const detail::file_records<Element>& records) {
        std::size_t needed = 0;
        for (const auto& r : records) needed += pages_for(r.present());
        require(needed <= std::size_t(pool_.available()), error_code::capacity_exceeded, "loading needs ", needed,
                " pages; the pool of ", pool_.size(), " has ", pool_.free_count(), " free and ",
                pool_.evictable_count(), " evictable");
        std::vector<sequence_id> ids;
        ids.reserve(records.size());
        const disk_write_batch batch(disk_, disk_read_threads_);
        for (const auto& r : records) {
            const sequence_id id = add_sequence();
            ids.push_back(id);
            state& s = sequences_.at(id);
            if (r.present() < r.length) {  // positions the reader checked ascend inside [0, length)
                s.compaction.assign_everywhere(layers_, r.length, r.positions);
                s.length = r.length;
                s.tokens.assign(r.tokens.begin(), r.tokens.end());
                forget_tokens_past_identity(s);
                for (std::size_t i = 0; i < pages_for(r.present()); ++i) s.pages.push_back(allocate_page());
            } else {
                append_positions(id, r.length, r.tokens.data(), static_cast<int>(r.tokens.size()));
            }
            const std::size_t key_row = this->key_token_row(), value_row = this->value_token_row();
            detail::for_each_position_run(r.positions, [&](std::size_t i, std::size_t j) {
                for (int l = 0; l < layers_; ++l)
                    write(id, l, r.positions[i], span<const key_type>(r.keys(l) + i * key_row, (j - i) * key_row),
                          span<const value_type>(r.values(l) + i * value_row, (j - i) * value_row),
                          static_cast<int>(j - i));
            });
            publish(id);
        }
        return ids;
    }

    int layers_;
    int page_size_;
    bool prefix_caching_;
    std::vector<typename Memory::template buffer<key_type>> keys_;
    std::vector<typename Memory::template buffer<value_type>> values_;
    detail::page_pool pool_;
    detail::sequence_registry<state> sequences_;
    detail::index_table<Memory> table_;
    detail::host_tier<Element, Memory> tier_;
    std::uint64_t swapped_out_pages_ = 0, swapped_in_pages_ = 0, swap_copies_avoided_ = 0;
    std::uint64_t spilled_pages_ = 0, host_hits_ = 0, disk_hits_ = 0;
    std::uint64_t pool_misses_ = 0, host_misses_ = 0, disk_misses_ = 0;  // match_prefix lookups not found, per tier
    detail::disk_tier<Element> disk_;  // after tier_: pages move host -> disk
    int disk_read_threads_ = 1;
    std::uint64_t queried_ = 0, hits_ = 0, copies_ = 0;
    std::uint64_t compaction_releases_ = 0, rows_moved_ = 0;
};

}  // namespace kvcache
