// The host tier behind a paged cache: pages of the primary pool's shape in
// host memory (page-locked when the primary pool is in device memory), with
// reference counts, so a page that several swapped sequences share is held
// once; twin links: while a page's copy in the other tier is known to be
// unchanged, swapping it back reuses that copy instead of moving the bytes;
// a prefix index of its own for cached pages the pool evicted (spilled);
// and, per page, an event after the last copies into or out of it, so a
// reader or a new fill of one page waits for that page's copies only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvcache/cache/page_pool.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/memory.hpp"

namespace kvcache {
namespace detail {

/// Pages of `layers` key and value planes in host memory, and the links
/// between each host page and the primary page it was copied from or to.
/// A link says both pages hold the same rows; the owner breaks it when the
/// primary page is written or handed out again, and the tier breaks it when
/// the host page is freed.
/// @tparam Element stored element type, or a kv_elements pair
/// @tparam Memory the primary pool's memory policy (its host_tier_buffer)
template <class Element, class Memory>
class host_tier {
public:
    using key_type = key_element_t<Element>;      ///< what key planes hold
    using value_type = value_element_t<Element>;  ///< what value planes hold

    host_tier() = default;

    /// pages host pages of key_page_elements key and value_page_elements
    /// value elements in each of layers layers, linkable to primary pages
    /// 0..primary_pages-1.
    host_tier(int layers, int pages, std::int64_t key_page_elements, std::int64_t value_page_elements, int primary_pages)
        : key_page_elements_(key_page_elements), value_page_elements_(value_page_elements), pool_(pages),
          host_of_primary_(primary_pages, -1), primary_of_host_(pages, -1), copies_(std::size_t(pages)) {
        const std::size_t key_elements = checked_bytes(std::size_t(pages), std::size_t(key_page_elements));
        const std::size_t value_elements = checked_bytes(std::size_t(pages), std::size_t(value_page_elements));
        for (int l = 0; l < layers; ++l) {
            keys_.emplace_back(key_elements);
            values_.emplace_back(value_elements);
        }
    }

    /// Host pages in the tier (0: no tier).
    int size() const noexcept { return pool_.size(); }
    int free_count() const noexcept { return pool_.free_count(); }
    /// Pages allocate() can hand out: free, plus spilled prefix pages nobody holds.
    int available() const noexcept { return pool_.available(); }
    /// Spilled prefix pages kept (referenced or not).
    int cached_count() const noexcept { return pool_.cached_count(); }
    /// Pages swapped sequences hold (spilled prefix pages nobody holds do not count).
    int used() const noexcept { return size() - available(); }
    int references(int page) const { return pool_.references(page); }

    /// A host page with one reference, evicting the least recently spilled
    /// prefix page when none is free; the caller checked available().
    int allocate() {
        const int page = pool_.allocate();
        unlink_host(page);
        return page;
    }
    void retain(int page) { pool_.retain(page); }
    /// The spilled page allocate() evicts next, or -1 (it takes a free page, or has none).
    int next_victim() const { return pool_.next_victim(); }
    /// A spilled page's key (see page_pool).
    std::uint64_t hash_of(int page) const { return pool_.hash_of(page); }
    std::uint64_t parent_of(int page) const { return pool_.parent_of(page); }
    const std::vector<std::int32_t>& tokens_of(int page) const { return pool_.tokens_of(page); }
    /// Enters a spilled prefix page under its key (see page_pool::publish).
    void publish(int page, std::uint64_t hash, std::uint64_t parent, const std::vector<std::int32_t>& tokens) {
        pool_.publish(page, hash, parent, tokens.data(), static_cast<int>(tokens.size()));
    }
    /// The spilled prefix page for (parent, tokens), or -1.
    int find(std::uint64_t hash, std::uint64_t parent, const std::int32_t* tokens, int count) const {
        return pool_.find(hash, parent, tokens, count);
    }
    /// Frees every spilled prefix page nobody holds (see page_pool::clear_cache);
    /// returns how many.
    int clear_cache() noexcept {
        return pool_.clear_cache([this](int page) noexcept { unlink_host(page); });
    }
    /// Drops a reference; a page nobody references is freed and unlinked.
    void release(int page) {
        pool_.release(page);
        if (pool_.references(page) == 0) unlink_host(page);
    }

    /// The host page linked to a primary page, or -1.
    int host_twin(int primary) const { return host_of_primary_[primary]; }
    /// The primary page linked to a host page, or -1 (the owner checks it is still held).
    int primary_twin(int host) const { return primary_of_host_[host]; }
    /// Records that the two pages hold the same rows (breaking their older links).
    void link(int primary, int host) {
        unlink_primary(primary);
        unlink_host(host);
        host_of_primary_[primary] = host;
        primary_of_host_[host] = primary;
    }
    /// Forgets the primary page's link: its rows are about to change, or it was reused.
    void unlink_primary(int primary) {
        if (primary < 0 || primary >= int(host_of_primary_.size())) return;
        const int host = host_of_primary_[primary];
        if (host >= 0) primary_of_host_[host] = -1;
        host_of_primary_[primary] = -1;
    }

    /// Marks the end of the copies just issued on stream into or out of
    /// host page `page` (issued after order_after_copies, so the mark covers
    /// every earlier copy of the page as well).
    /// @tparam Stream the memory policy's stream_type
    template <class Stream>
    void note_copies(int page, const Stream& stream) {
        Memory::record_event(copies_[std::size_t(page)], stream);
    }
    /// Waits on the host for the copies into and out of `page` issued so far,
    /// on whatever streams: what a host read or a synchronous fill of it needs.
    void wait_for_copies(int page) const { Memory::wait_event(copies_[std::size_t(page)]); }
    /// Makes the stream's later work (a copy out of the page, or a new fill
    /// of it) wait for the copies of `page` issued so far, without waiting on the host.
    /// @tparam Stream the memory policy's stream_type
    template <class Stream>
    void order_after_copies(int page, const Stream& stream) const {
        Memory::order_after(stream, copies_[std::size_t(page)]);
    }

    /// Key plane of a host page in one layer.
    key_type* keys(int layer, int page) { return keys_[layer].data() + page * key_page_elements_; }
    const key_type* keys(int layer, int page) const { return keys_[layer].data() + page * key_page_elements_; }
    /// Value plane of a host page in one layer.
    value_type* values(int layer, int page) { return values_[layer].data() + page * value_page_elements_; }
    const value_type* values(int layer, int page) const { return values_[layer].data() + page * value_page_elements_; }

private:
    void unlink_host(int host) {
        const int primary = primary_of_host_[host];
        if (primary >= 0) host_of_primary_[primary] = -1;
        primary_of_host_[host] = -1;
    }

    std::int64_t key_page_elements_ = 0, value_page_elements_ = 0;
    page_pool pool_;  // reference counts, the free list, and the index of spilled prefix pages
    std::vector<typename Memory::template host_tier_buffer<key_type>> keys_;
    std::vector<typename Memory::template host_tier_buffer<value_type>> values_;
    std::vector<int> host_of_primary_, primary_of_host_;
    std::vector<typename Memory::event_type> copies_;  // per host page: after the last copies into or out of it
};

}  // namespace detail
}  // namespace kvcache
