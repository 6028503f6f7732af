// The disk tier below a paged cache's host tier: spilled prefix pages the host
// tier has no room for, one file per page in a directory the user names. Each
// file is a cache file of the project's format (serialization.hpp): one
// record of page_size positions holding the page's token ids and rows, under
// the cache's own header and checksum. A file that is missing, damaged or
// holds other tokens is a miss (the page is recomputed), never wrong rows.
// Only <cstdio> and <fstream> touch the file system, so the umbrella header
// does not pay for <filesystem>.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvcache/cache/parallel_reads.hpp"
#include "kvcache/cache/row_transfer.hpp"
#include "kvcache/cache/serialization.hpp"
#include "kvcache/core/error.hpp"

namespace kvcache {
namespace detail {

/// Counters of a disk tier.
struct disk_tier_counters {
    std::uint64_t stored = 0;   ///< pages written
    std::uint64_t loaded = 0;   ///< pages read back intact
    std::uint64_t damaged = 0;  ///< reads refused: missing, damaged or foreign file (each a miss)
    std::uint64_t bytes_written = 0, bytes_read = 0;
    std::uint64_t write_failures = 0;  ///< pages whose file could not be written (each lost, a later miss)
};

/// Up to `pages` page files in one directory, indexed by the page's chained
/// hash, least recently used first out (its file deleted).
/// @tparam Element stored element type, or a kv_elements pair
template <class Element>
class disk_tier {
public:
    /// Key rows of one page: per layer [page_size][kv_head][row].
    using key_rows = std::vector<std::vector<key_element_t<Element>>>;
    /// Value rows of one page: per layer [page_size][kv_head][row].
    using value_rows = std::vector<std::vector<value_element_t<Element>>>;

    disk_tier() = default;

    /// A tier in `directory`, which must exist and be writable (io_error
    /// naming it otherwise), for pages of a cache whose file header is `header`.
    disk_tier(std::string directory, int pages, const file_header& header)
        : directory_(std::move(directory)), capacity_(pages), header_(header) {
        const std::string probe = directory_ + "/.kvcache-disk-tier-probe";
        const bool writable = static_cast<bool>(std::ofstream(probe, std::ios::binary | std::ios::trunc));
        std::remove(probe.c_str());
        require(writable, error_code::io_error, "disk tier directory '", directory_,
                "' is not a writable directory (it must exist)");
    }
    disk_tier(disk_tier&&) noexcept = default;
    disk_tier& operator=(disk_tier&& other) noexcept {
        if (this != &other) {
            clear();
            directory_ = std::move(other.directory_);
            capacity_ = other.capacity_;
            header_ = other.header_;
            index_ = std::move(other.index_);
            lru_ = std::move(other.lru_);
            pending_ = std::move(other.pending_);
            other.pending_.clear();
            clock_ = other.clock_;
            counters_ = other.counters_;
            other.index_.clear();
            other.lru_.clear();
        }
        return *this;
    }
    disk_tier(const disk_tier&) = delete;
    disk_tier& operator=(const disk_tier&) = delete;
    /// Deletes the files this tier wrote.
    ~disk_tier() { clear(); }

    /// Pages the tier may hold (0: no tier).
    int size() const noexcept { return capacity_; }
    /// Pages it holds.
    int count() const noexcept { return static_cast<int>(index_.size()); }
    const disk_tier_counters& counters() const noexcept { return counters_; }
    const std::string& directory() const noexcept { return directory_; }

    /// True when a page with this key was stored (its file may still be damaged).
    bool contains(std::uint64_t hash, std::uint64_t parent, const std::int32_t* tokens, int count) const {
        auto found = index_.find(hash);
        return found != index_.end() && found->second.parent == parent &&
               found->second.tokens == std::vector<std::int32_t>(tokens, tokens + count);
    }

    /// Writes one page; when full, the least recently used page makes room
    /// and its file is written over (write_page_file). A failed write keeps
    /// nothing of the new page (a later miss) and evicts nothing, unless it
    /// failed after taking the evicted page's file. Inside a write_batch the
    /// page waits in memory and is written with the batch's others, on its
    /// threads, when the batch ends (or max_pending_pages are waiting); until
    /// then contains() and read() do not see it.
    void store(std::uint64_t hash, std::uint64_t parent, const std::vector<std::int32_t>& tokens, key_rows keys,
               value_rows values) {
        if (capacity_ == 0 || index_.count(hash) || pending(hash)) return;
        pending_.push_back(pending_page{hash, parent, tokens, std::move(keys), std::move(values)});
        if (batches_ == 0 || pending_.size() >= max_pending_pages) write_pending();
    }

    /// Pages a write batch keeps in memory before it writes them: bounds the
    /// memory a long bring-back's spills take.
    static constexpr std::size_t max_pending_pages = 64;

    /// While one lives, store() defers its page files and writes them in
    /// batches on `threads` threads (a bring-back or a long append spills one
    /// page per page it takes: written one after another, the files set the
    /// call's time). Batches nest; the outermost one's end writes what waits.
    class write_batch {
    public:
        write_batch(disk_tier& tier, int threads) noexcept : tier_(tier) {
            if (tier_.batches_++ == 0) tier_.batch_threads_ = threads;
        }
        ~write_batch() {
            if (--tier_.batches_ == 0) tier_.write_pending();
        }
        write_batch(const write_batch&) = delete;
        write_batch& operator=(const write_batch&) = delete;

    private:
        disk_tier& tier_;
    };

    /// One page's rows read back, every layer's after the previous one's:
    /// token-major [position][kv_head][row] as the file holds them, or
    /// head-major [kv_head][position][row] as a pool page holds them.
    struct page_rows {
        std::vector<key_element_t<Element>> keys;
        std::vector<value_element_t<Element>> values;
        std::uint64_t file_bytes = 0;  ///< bytes of the file read
    };

    /// Reads a stored page of `count` positions back, its rows head-major
    /// when asked; nothing when no such page was stored or its file is
    /// missing, fails its checks or holds other tokens. Changes nothing, so
    /// several threads may read at once; note_read() then tells the tier
    /// what became of each read it used.
    std::optional<page_rows> read(std::uint64_t hash, std::uint64_t parent, const std::int32_t* tokens, int count,
                                  bool head_major) const {
        if (!contains(hash, parent, tokens, count)) return std::nullopt;
        file_records<Element> rows;
        try {
            rows = read_page(path_of(hash), count);
            const auto r = *rows.begin();
            require(std::equal(r.tokens.begin(), r.tokens.end(), tokens), error_code::format_error,
                    "the page file holds other tokens");
        } catch (const error&) {
            return std::nullopt;
        }
        page_rows page;
        page.file_bytes = rows.file_bytes();
        page.keys = std::move(rows.key_rows_);
        page.values = std::move(rows.value_rows_);
        if (head_major) {
            to_head_major(page.keys, count);
            to_head_major(page.values, count);
        }
        return page;
    }

    /// Records the outcome of a read() of the page `hash` a caller used: a
    /// hit of `file_bytes` bytes makes it the most recently used page; a miss
    /// (nothing read) forgets the entry and deletes its file.
    void note_read(std::uint64_t hash, bool hit, std::uint64_t file_bytes) {
        if (!hit) {
            ++counters_.damaged;
            forget(hash);
            return;
        }
        counters_.bytes_read += file_bytes;
        touch(hash);
        ++counters_.loaded;
    }

    /// Deletes every page file and forgets it; returns how many there were.
    int clear_pages() noexcept {
        const int n = count();
        clear();
        return n;
    }

private:
    struct entry {
        std::uint64_t parent;
        std::vector<std::int32_t> tokens;
        std::uint64_t last_use;
        std::uint64_t bytes;  ///< of its file
    };
    /// A page on its way to a file.
    struct pending_page {
        std::uint64_t hash, parent;
        std::vector<std::int32_t> tokens;
        key_rows keys;
        value_rows values;
    };

    bool pending(std::uint64_t hash) const noexcept {
        return std::any_of(pending_.begin(), pending_.end(), [&](const pending_page& p) { return p.hash == hash; });
    }

    /// How one page's write went.
    struct write_outcome {
        std::uint64_t bytes = 0;    ///< of the page's file; 0: not written
        bool took_victim = false;   ///< the evicted page's file was taken (reused, or lost with a failed write)
    };

    /// Writes a page's file (its rows moved out of `page`) under a
    /// `.partial` name and renames it into place, so a reader never sees half
    /// a file. When the tier evicts `victim` to make room and its file has
    /// the new file's size, the new page is written over that file, in place:
    /// no block is freed or allocated, and no file created (creating one cost
    /// about 15 times what overwriting one did on the ext4 file system of
    /// docs/performance.md). Touches nothing of the tier but the files:
    /// several threads may write at once.
    write_outcome write_page_file(pending_page& page, const std::uint64_t* victim,
                                  std::uint64_t victim_bytes) const noexcept {
        write_outcome out;
        std::string partial;
        try {
            const std::string path = path_of(page.hash);
            partial = path + ".partial";
            const std::string image = file_image(page);
            const bool reuse = victim && victim_bytes == image.size() &&
                               std::rename(path_of(*victim).c_str(), partial.c_str()) == 0;
            out.took_victim = reuse;
            {
                std::ofstream file(partial, reuse ? std::ios::binary | std::ios::in | std::ios::out
                                                  : std::ios::binary | std::ios::trunc);
                require(static_cast<bool>(file), error_code::io_error, "cannot open '", partial, "'");
                file.write(image.data(), static_cast<std::streamsize>(image.size()));
                file.flush();
                require(static_cast<bool>(file), error_code::io_error, "cannot write '", partial, "'");
            }
            require(std::rename(partial.c_str(), path.c_str()) == 0, error_code::io_error, "cannot rename '", partial,
                    "'");
            out.bytes = image.size();
        } catch (...) {
            if (!partial.empty()) std::remove(partial.c_str());
            out.bytes = 0;
        }
        return out;
    }

    /// A page's file as bytes (its rows moved out of `page`).
    std::string file_image(pending_page& page) const {
        sequence_record<Element> record;
        record.length = static_cast<int>(page.tokens.size());
        for (int p = 0; p < record.length; ++p) record.positions.push_back(p);
        record.tokens = page.tokens;
        record.keys = std::move(page.keys);
        record.values = std::move(page.values);
        file_header header = header_;
        header.sequences = 1;
        std::ostringstream image(std::ios::binary);
        write_file(image, header, std::vector<sequence_record<Element>>{std::move(record)});
        return std::move(image).str();
    }

    /// Indexes a page whose file write_page_file() wrote (`bytes` > 0), the
    /// least recently used page making room; counts a failure otherwise.
    void note_stored(const pending_page& page, std::uint64_t bytes) noexcept {
        if (bytes == 0) {
            ++counters_.write_failures;
            return;
        }
        try {
            if (count() == capacity_) forget(lru_.begin()->second);
            entry e{page.parent, page.tokens, ++clock_, bytes};
            lru_.insert({e.last_use, page.hash});
            try {
                index_.emplace(page.hash, std::move(e));
            } catch (...) {
                lru_.erase({clock_, page.hash});
                throw;
            }
        } catch (...) {  // no memory to index it: the page is lost, as if its write had failed
            remove_file(page.hash);
            ++counters_.write_failures;
            return;
        }
        ++counters_.stored;
        counters_.bytes_written += bytes;
    }

    /// Writes the pages waiting (one, outside a batch), on the batch's
    /// threads, then indexes them in the order they were stored. Each page
    /// the full tier makes room for is written over the file of the page it
    /// evicts, the least recently used first, as one store() after another
    /// would have evicted them. Never throws: a page that cannot be written
    /// is counted as a failed write, and evicts nothing unless its write had
    /// already taken the evicted page's file.
    void write_pending() noexcept {
        std::vector<pending_page> pages = std::move(pending_);
        pending_.clear();
        if (pages.empty()) return;
        std::vector<write_outcome> outcomes;
        std::vector<std::uint64_t> victims;  // victims[i - room]: the page page i evicts
        std::vector<std::uint64_t> victim_bytes;
        // Page i needs room once the pages before it have filled the tier.
        const std::size_t room = std::size_t(capacity_ - count());
        try {
            outcomes.resize(pages.size());
            auto oldest = lru_.begin();
            for (std::size_t i = room; i < pages.size() && oldest != lru_.end(); ++i, ++oldest) {
                victims.push_back(oldest->second);
                victim_bytes.push_back(index_.at(oldest->second).bytes);
            }
            run_in_parallel(static_cast<int>(pages.size()), batch_threads_, [&](int i) {
                const std::size_t v = std::size_t(i) - room;
                const bool evicts = std::size_t(i) >= room && v < victims.size();
                outcomes[std::size_t(i)] = write_page_file(pages[std::size_t(i)], evicts ? &victims[v] : nullptr,
                                                           evicts ? victim_bytes[v] : 0);
            });
        } catch (...) {  // no memory to plan the writes: none was made
            counters_.write_failures += pages.size();
            return;
        }
        for (std::size_t i = 0; i < pages.size(); ++i) {
            const write_outcome& o = outcomes[i];
            const bool evicts = i >= room && i - room < victims.size();
            if (evicts && (o.bytes > 0 || o.took_victim)) forget(victims[i - room], /*delete_file=*/!o.took_victim);
            note_stored(pages[i], o.bytes);
        }
    }

    /// One pass over a page file: its sizes are known before it is opened, so
    /// the rows are read straight into arrays of those sizes and the checksum
    /// is checked once they are in (a general load reads a file twice to
    /// allocate nothing for a damaged one).
    file_records<Element> read_page(const std::string& path, int count) const {
        std::ifstream in(path, std::ios::binary | std::ios::ate);
        require(static_cast<bool>(in), error_code::io_error, "cannot open '", path, "'");
        const std::istream::pos_type end = in.tellg();
        require(end != std::istream::pos_type(-1), error_code::io_error, "cannot size '", path, "'");
        in.seekg(0);
        const std::uint64_t size = static_cast<std::uint64_t>(end);
        checked_reader r(in, size);
        require(read_header(r, header_) == 1, error_code::format_error, "a page file holds one record");
        record_totals expected;
        expected.positions = expected.tokens = std::uint64_t(count);
        expected.key_rows =
            std::uint64_t(header_.layers) * count * position_row_elements<key_element_t<Element>>(header_.heads);
        expected.value_rows =
            std::uint64_t(header_.layers) * count * position_row_elements<value_element_t<Element>>(header_.heads);
        file_records<Element> out = sized_records<Element>(1, expected, header_);
        const record_totals read = read_records<Element>(r, 1, header_.layers, out.key_row_, out.value_row_, &out);
        require(read == expected && out.counts_[0].length == count, error_code::format_error,
                "a page file holds one full page of ", count, " positions");
        const std::uint64_t hash = r.hash();
        require(r.stored_checksum() == hash, error_code::format_error, "checksum does not match contents");
        require(r.unread() == 0, error_code::format_error, r.unread(), " bytes follow the checksum");
        out.file_bytes_ = size;
        return out;
    }

    /// Each layer's token-major rows [position][kv_head][row] of `rows`
    /// reordered in place into a head-major plane.
    template <class Side>
    void to_head_major(std::vector<Side>& rows, int count) const {
        const int kv = header_.heads.kv_heads;
        const int row = row_elements<Side>(header_.heads.head_dim);
        const std::size_t plane = std::size_t(count) * kv * row;
        std::vector<Side> scratch(plane);
        for (std::size_t at = 0; at + plane <= rows.size(); at += plane) {
            token_rows_to_planes(rows.data() + at, scratch.data(), count, kv, row);
            std::copy(scratch.begin(), scratch.end(), rows.begin() + std::ptrdiff_t(at));
        }
    }

    std::string path_of(std::uint64_t hash) const {
        char name[40];
        std::snprintf(name, sizeof name, "page-%016llx.kvcache", static_cast<unsigned long long>(hash));
        return directory_ + "/" + name;
    }
    void touch(std::uint64_t hash) {
        entry& e = index_.at(hash);
        lru_.erase({e.last_use, hash});
        e.last_use = ++clock_;
        lru_.insert({e.last_use, hash});
    }
    /// Drops a page from the index, and its file unless its write took it.
    /// Never throws: when naming the file fails for want of memory, the file
    /// stays behind, unindexed (a later store of that page replaces it).
    void forget(std::uint64_t hash, bool delete_file = true) noexcept {
        auto found = index_.find(hash);
        if (found == index_.end()) return;
        lru_.erase({found->second.last_use, hash});
        index_.erase(found);
        if (delete_file) remove_file(hash);
    }
    /// Deletes a page's file; when naming it fails for want of memory, the file stays.
    void remove_file(std::uint64_t hash) const noexcept {
        try {
            std::remove(path_of(hash).c_str());
        } catch (...) {
        }
    }
    void clear() noexcept {
        while (!index_.empty()) forget(index_.begin()->first);
        lru_.clear();
        pending_.clear();
    }

    std::string directory_;
    int capacity_ = 0;
    file_header header_;
    std::unordered_map<std::uint64_t, entry> index_;
    std::set<std::pair<std::uint64_t, std::uint64_t>> lru_;  // (last use, hash)
    std::uint64_t clock_ = 0;
    disk_tier_counters counters_;
    std::vector<pending_page> pending_;  // stored inside a write_batch, not yet written
    int batches_ = 0;                    // write_batch objects alive
    int batch_threads_ = 1;              // the outermost batch's threads
};

}  // namespace detail
}  // namespace kvcache
