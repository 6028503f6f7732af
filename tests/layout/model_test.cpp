// Randomised model-based tests: thousands of random operations applied both
// to a cache owner and to a plain reference model (each sequence a vector of
// per-token K/V rows per layer); after every step every present row seen
// through the view (or read() while swapped out) must equal the model's. All
// three layouts, fp32 and fp16; the paged runs mix in compaction and, with a
// host tier, swap_out/swap_in, and every refused operation must leave the
// pool's and the tier's page counts as they were.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/cache.hpp"
#include "kvcache/layout.hpp"

namespace {

using heads = kvcache::head_config<4, 2, 8>;
constexpr int kv = heads::kv_heads();
constexpr int dim = heads::head_dim;
constexpr int row = kv * dim;
constexpr int layers = 2;

/// The model of one sequence: token ids (prefix mode) and rows per layer, [position][kv][dim].
template <class Element>
struct model_sequence {
    std::vector<std::int32_t> tokens;
    std::vector<std::vector<Element>> keys = std::vector<std::vector<Element>>(layers);
    std::vector<std::vector<Element>> values = std::vector<std::vector<Element>>(layers);
    // Positions a compaction dropped, per layer (rows stay in keys/values, unread).
    std::vector<std::set<int>> dropped = std::vector<std::set<int>>(layers);
    bool swapped = false;
    int length() const { return static_cast<int>(keys[0].size() / row); }
    bool stored(int layer, int p) const { return dropped[layer].count(p) == 0; }
};

/// A value exactly representable in fp16, so both element types compare bit-exactly.
template <class Element>
Element exact(std::uint64_t bits) {
    return kvcache::from_float<Element>(static_cast<float>(static_cast<int>(bits % 129) - 64) / 8.0f);
}

/// One run of random operations against one cache. Layout-specific rules
/// (which positions are present, which operations must fail) are written out
/// here from the layout's definition, not asked from the code under test.
template <class Cache>
class model_run {
    using element = typename Cache::element_type;
    static constexpr kvcache::layout_kind kind = Cache::kind;

public:
    model_run(Cache cache, std::uint32_t seed, bool prefix_mode, int sinks = 0, int ring = 0, int max_chunk = 0,
              int capacity = 0, int slots = 0)
        : cache_(std::move(cache)), random_(seed), prefix_mode_(prefix_mode), sinks_(sinks), ring_(ring),
          max_chunk_(max_chunk), capacity_(capacity), slots_(slots) {}

    void run(int steps) {
        for (step_ = 0; step_ < steps; ++step_) {
            const int op = pick(0, 99);
            const int extra = extra_compactions_ + extra_swaps_ > 0 ? pick(0, 99) : 100;
            if (extra < extra_compactions_) compact();
            else if (extra < extra_compactions_ + extra_swaps_) swap();
            else if (op < 12) add();
            else if (op < 50) append();
            else if (op < 58) fork();
            else if (op < 66) truncate();
            else if (op < 72) remove();
            else if (op < 78) overwrite();
            else if (op < 82) clone_through_file();
            else if (op < 84) reload_everything();
            else if (op < 86) keep_only();
            else if (op < 92) bad_id();
            else if (kind == kvcache::layout_kind::paged && op < 96) compact();
            else if (kind == kvcache::layout_kind::paged && op < 98) swap();
            else append();
            check_all();
            ++operations;
        }
    }

    const Cache& cache() const { return cache_; }
    Cache& cache() { return cache_; }
    /// Puts a disk tier of `pages` page files in `directory` below the host
    /// tier (paged runs with one), its files read on three threads, more
    /// than this machine may have; a load into a fresh cache gives it a new
    /// tier in a subdirectory of its own.
    void use_disk_tier(const std::string& directory, int pages) {
        disk_directory_ = directory;
        disk_pages_ = pages;
        cache_.attach_disk_tier(directory, pages, 3);
    }
    void remove_all() {
        for (const auto& entry : model_) cache_.remove_sequence(entry.first);
        model_.clear();
        check_all();
    }
    int operations = 0;
    int failures_seen = 0;  // expected errors that were raised (and checked to change nothing)
    int compactions = 0;
    int swaps = 0;
    int pool_dry = 0;  // of failures_seen: capacity_exceeded from the pool, the tier or a load
    std::string disk_directory_;
    int disk_pages_ = 0;
    mutable int disk_generation_ = 0;
    /// Percents of steps that compact or swap instead of the usual mix (paged only).
    void mix_in(int compactions, int swaps) {
        extra_compactions_ = compactions;
        extra_swaps_ = swaps;
    }

private:
    int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random_); }

    kvcache::sequence_id any_id() {
        auto it = model_.begin();
        std::advance(it, pick(0, static_cast<int>(model_.size()) - 1));
        return it->first;
    }

    // --- layout rules, from the definitions ----------------------------------
    bool present(int length, int p) const {
        if (kind != kvcache::layout_kind::sliding_window) return p >= 0 && p < length;
        return p >= 0 && p < length && (p < sinks_ || p >= length - ring_);
    }
    int max_append() const { return kind == kvcache::layout_kind::sliding_window ? max_chunk_ : 9; }

    // The paged pool's own bound, computed from page tables: pages any live
    // sequence references.
    int pages_referenced() const {
        if constexpr (kind == kvcache::layout_kind::paged) {
            std::set<int> pages;
            for (const auto& entry : model_) {
                const auto& p = cache_.pages(entry.first);
                pages.insert(p.begin(), p.end());
            }
            return static_cast<int>(pages.size());
        }
        return 0;
    }

    // K/V rows in prefix mode depend only on the token prefix, as in a model.
    std::uint64_t prefix_hash(const std::vector<std::int32_t>& tokens, int end) const {
        std::uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < end; ++i) h = (h ^ static_cast<std::uint32_t>(tokens[i])) * 1099511628211ull;
        return h;
    }
    void rows_for_tokens(model_sequence<element>& s, int first, std::vector<std::vector<element>>& k,
                         std::vector<std::vector<element>>& v) {
        for (int l = 0; l < layers; ++l) {
            k[l].clear();
            v[l].clear();
            for (int p = first; p < static_cast<int>(s.tokens.size()); ++p) {
                const std::uint64_t h = prefix_hash(s.tokens, p + 1) * 31 + l;
                for (int i = 0; i < row; ++i) {
                    k[l].push_back(exact<element>(h * 7 + i * 3));
                    v[l].push_back(exact<element>(h * 11 + i * 5 + 1));
                }
            }
        }
    }

    // --- operations -----------------------------------------------------------
    void add() {
        const bool full = kind != kvcache::layout_kind::paged && static_cast<int>(model_.size()) >= slots_;
        if (full) {
            expect_failure(kvcache::error_code::capacity_exceeded, [&] { cache_.add_sequence(); });
            return;
        }
        const kvcache::sequence_id id = cache_.add_sequence();
        REQUIRE(model_.count(id) == 0);
        model_[id];
        if constexpr (kind == kvcache::layout_kind::paged) {
            if (prefix_mode_ && pick(0, 1)) {
                std::vector<std::int32_t> tokens = document(pick(0, 40));
                const int matched = cache_.match_prefix(id, tokens);
                // Matches are whole pages of the offered tokens.
                CHECK(matched % cache_.page_size() == 0);
                CHECK(matched <= static_cast<int>(tokens.size()));
                auto& s = model_[id];
                s.tokens.assign(tokens.begin(), tokens.begin() + matched);
                rows_for_tokens(s, 0, s.keys, s.values);
            }
        }
    }

    // Token streams drawn from a few "documents" so prefixes repeat.
    std::vector<std::int32_t> document(int length) {
        const int doc = pick(0, 2);
        std::vector<std::int32_t> out;
        // Only the first token names the document: later pages hold equal
        // tokens after different prefixes, which the chained hash must tell apart.
        for (int i = 0; i < length; ++i) out.push_back(i == 0 ? doc : (i % 7 == 6 && pick(0, 3) == 0 ? 500 + i : i));
        return out;
    }

    void append() {
        if (model_.empty()) return add();
        const kvcache::sequence_id id = any_id();
        auto& s = model_[id];
        if (s.swapped) {
            expect_failure(kvcache::error_code::invalid_argument, [&] { cache_.begin_append(id, 1); });
            return;
        }
        const int n = pick(0, max_append() + (kind == kvcache::layout_kind::paged ? 0 : 2));
        const int length = s.length();
        bool should_fail = false;
        if (kind == kvcache::layout_kind::contiguous) should_fail = length + n > capacity_;
        if (kind == kvcache::layout_kind::sliding_window) should_fail = n > max_chunk_;
        std::vector<std::vector<element>> k(layers), v(layers);
        std::vector<std::int32_t> new_tokens;
        const bool with_tokens = prefix_mode_ && static_cast<int>(s.tokens.size()) == length;
        if (with_tokens) {
            auto all = document(length + n);
            // Continue the sequence's own tokens; the document picks only the new ones.
            new_tokens.assign(all.begin() + length, all.end());
            auto extended = s;
            extended.tokens.insert(extended.tokens.end(), new_tokens.begin(), new_tokens.end());
            rows_for_tokens(extended, length, k, v);
        } else {
            for (int l = 0; l < layers; ++l)
                for (int i = 0; i < n * row; ++i) {
                    k[l].push_back(exact<element>(random_()));
                    v[l].push_back(exact<element>(random_()));
                }
        }
        const int referenced = pages_referenced();
        const std::string before = pool_state();
        try {
            if constexpr (kind == kvcache::layout_kind::paged) {
                if (with_tokens) cache_.append(id, k[0], v[0], new_tokens);
                else cache_.append(id, 0, k[0], v[0], n);
            } else {
                cache_.append(id, 0, k[0], v[0], n);
            }
            for (int l = 1; l < layers; ++l) cache_.append(id, l, k[l], v[l], n);
        } catch (const kvcache::error& e) {
            bool expected = should_fail;
            std::ostringstream limit;  // why the model allows (or not) this refusal
            if constexpr (kind == kvcache::layout_kind::paged) {
                const int ps = cache_.page_size();
                // Each layer's new rows land after the rows it stores (fewer
                // than length in a compacted sequence); the page table, shared
                // by the layers, covers the layer that stores the most.
                std::size_t fewest = s.dropped[0].size();
                for (int l = 1; l < layers; ++l) fewest = std::min(fewest, s.dropped[l].size());
                const int rows = length - static_cast<int>(fewest);
                const int held = (rows + ps - 1) / ps;
                const int new_pages = (rows + n + ps - 1) / ps - held;
                // Held pages that new rows land in: each may be shared and need a copy.
                std::set<int> touched;
                for (int l = 0; l < layers; ++l) {
                    const int stored = length - static_cast<int>(s.dropped[l].size());
                    for (int r = stored; r < stored + n; ++r)
                        if (r / ps < held) touched.insert(r / ps);
                }
                // The pool may only refuse when referenced pages plus the new ones and the copies overflow it.
                expected = e.code() == kvcache::error_code::capacity_exceeded &&
                           referenced + new_pages + static_cast<int>(touched.size()) > cache_.page_count();
                limit << "; the model: live sequences reference " << referenced << " of " << cache_.page_count()
                      << " pages, the append needs " << new_pages << " new and at most " << touched.size()
                      << " copies";
            }
            INFO("step ", step_, ": ", std::string(e.what()));
            if (!expected)
                FAIL("append of ", n, " rows to sequence ", id, " (length ", length, ") refused at step ", step_,
                     " though the model says it fits", limit.str());
            REQUIRE(pool_state() == before);
            ++failures_seen;
            ++pool_dry;
            return;  // check_all() verifies nothing changed
        }
        INFO("step ", step_, " append of ", n, " to length ", length);
        REQUIRE_FALSE(should_fail);
        if (with_tokens) s.tokens.insert(s.tokens.end(), new_tokens.begin(), new_tokens.end());
        else s.tokens.resize(std::min<std::size_t>(s.tokens.size(), length));
        for (int l = 0; l < layers; ++l) {
            s.keys[l].insert(s.keys[l].end(), k[l].begin(), k[l].end());
            s.values[l].insert(s.values[l].end(), v[l].begin(), v[l].end());
        }
    }

    void fork() {
        if (model_.empty()) return;
        const kvcache::sequence_id id = any_id();
        const bool full = kind != kvcache::layout_kind::paged && static_cast<int>(model_.size()) >= slots_;
        if (full) {
            expect_failure(kvcache::error_code::capacity_exceeded, [&] { cache_.fork(id); });
            return;
        }
        const kvcache::sequence_id child = cache_.fork(id);
        model_[child] = model_[id];
    }

    void truncate() {
        if (model_.empty()) return;
        const kvcache::sequence_id id = any_id();
        auto& s = model_[id];
        const int length = s.length();
        const int to = pick(0, length + 2);
        if (s.swapped) {
            expect_failure(kvcache::error_code::invalid_argument, [&] { cache_.truncate(id, to); });
            return;
        }
        bool should_fail = to > length;
        if (kind == kvcache::layout_kind::sliding_window) should_fail |= to < length && length > sinks_ + ring_;
        if (should_fail) {
            expect_failure(kvcache::error_code::out_of_range, [&] { cache_.truncate(id, to); });
            return;
        }
        cache_.truncate(id, to);
        for (int l = 0; l < layers; ++l) {
            s.keys[l].resize(std::size_t(to) * row);
            s.values[l].resize(std::size_t(to) * row);
        }
        s.tokens.resize(std::min<std::size_t>(s.tokens.size(), to));
        // Positions at or past the new end are gone in every layer, dropped or not.
        for (auto& d : s.dropped) d.erase(d.lower_bound(to), d.end());
    }

    void remove() {
        if (model_.empty()) return;
        const kvcache::sequence_id id = any_id();
        cache_.remove_sequence(id);
        model_.erase(id);
    }

    // Rewrites a few present rows of one layer (not in prefix mode: there a
    // row is by contract the K/V of its tokens).
    void overwrite() {
        if (model_.empty() || prefix_mode_) return;
        const kvcache::sequence_id id = any_id();
        auto& s = model_[id];
        const int length = s.length();
        if (length == 0) return;
        const int layer = pick(0, layers - 1);
        if (s.swapped) {
            expect_failure(kvcache::error_code::invalid_argument, [&] {
                std::vector<element> k(row), v(row);
                cache_.write(id, layer, 0, k, v, 1);
            });
            return;
        }
        const int first = pick(0, length - 1);
        int n = pick(1, std::min(4, length - first));
        auto all_stored = [&](int count) {
            for (int p = first; p < first + count; ++p)
                if (!s.stored(layer, p)) return false;
            return true;
        };
        while (n > 0 && !(present(length, first) && present(length, first + n - 1) && all_stored(n) &&
                          (first >= sinks_ || first + n <= sinks_ || length <= sinks_ + ring_)))
            --n;
        if (n == 0) {
            if (!present(length, first) || !s.stored(layer, first))
                expect_failure(kvcache::error_code::out_of_range, [&] {
                    std::vector<element> k(row), v(row);
                    cache_.write(id, layer, first, k, v, 1);
                });
            return;
        }
        std::vector<element> k(std::size_t(n) * row), v(std::size_t(n) * row);
        for (auto& x : k) x = exact<element>(random_());
        for (auto& x : v) x = exact<element>(random_());
        const std::string before = pool_state();
        try {
            cache_.write(id, layer, first, k, v, n);
        } catch (const kvcache::error& e) {
            INFO(std::string(e.what()));
            // Only a paged copy-on-write may run out of pages.
            REQUIRE(kind == kvcache::layout_kind::paged);
            REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
            REQUIRE(pool_state() == before);
            ++failures_seen;
            ++pool_dry;
            return;
        }
        std::copy(k.begin(), k.end(), s.keys[layer].begin() + std::size_t(first) * row);
        std::copy(v.begin(), v.end(), s.values[layer].begin() + std::size_t(first) * row);
    }

    // Saves one sequence and loads it back as a new one: a copy.
    void clone_through_file() {
        if (model_.empty()) return;
        const kvcache::sequence_id id = any_id();
        std::stringstream file;
        if (!layers_agree(model_[id])) {
            // A file records one list of positions per sequence.
            expect_failure(kvcache::error_code::invalid_argument, [&] { cache_.save(file, {id}); });
            return;
        }
        cache_.save(file, {id});  // reads the host tier while the sequence is swapped out
        const std::string before = pool_state();
        try {
            const auto ids = cache_.load(file);
            REQUIRE(ids.size() == 1);
            model_[ids[0]] = model_[id];
            model_[ids[0]].swapped = false;  // a load lands in the pool
        } catch (const kvcache::error& e) {
            INFO(std::string(e.what()));
            REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
            REQUIRE(pool_state() == before);
            ++failures_seen;
            ++pool_dry;
        }
    }

    // Saves everything, loads it into a fresh cache and carries on with that one.
    void reload_everything() {
        std::stringstream file;
        for (const auto& entry : model_)
            if (!layers_agree(entry.second)) {
                expect_failure(kvcache::error_code::invalid_argument, [&] { cache_.save(file); });
                return;
            }
        cache_.save(file);
        Cache fresh = make_empty_like();
        std::vector<kvcache::sequence_id> ids;
        try {
            ids = fresh.load(file);
        } catch (const kvcache::error& e) {
            // Files hold each sequence's rows, not the sharing between forks,
            // so a reload can need more pages than the original pool used.
            INFO(std::string(e.what()));
            REQUIRE(kind == kvcache::layout_kind::paged);
            REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
            CHECK(fresh.sequence_count() == 0);
            if constexpr (kind == kvcache::layout_kind::paged)
                CHECK(fresh.statistics().pages_free == fresh.page_count());
            ++failures_seen;
            ++pool_dry;
            return;
        }
        REQUIRE(ids.size() == model_.size());
        std::map<kvcache::sequence_id, model_sequence<element>> renamed;
        std::size_t i = 0;
        for (auto& entry : model_) {
            entry.second.swapped = false;
            renamed[ids[i++]] = std::move(entry.second);
        }
        model_ = std::move(renamed);
        cache_ = std::move(fresh);
    }

    Cache make_empty_like() const {
        if constexpr (kind == kvcache::layout_kind::paged) {
            Cache fresh(layers, cache_.page_count(), cache_.page_size(), cache_.prefix_caching());
            if (cache_.host_tier_pages() > 0) fresh.attach_host_tier(cache_.host_tier_pages());
            if (disk_pages_ > 0) {
                const std::string directory = disk_directory_ + "/load" + std::to_string(++disk_generation_);
                std::filesystem::create_directories(directory);
                fresh.attach_disk_tier(directory, disk_pages_, cache_.disk_read_threads());
            }
            return fresh;
        } else if constexpr (kind == kvcache::layout_kind::sliding_window)
            return Cache(layers, cache_.slot_count(), cache_.window(), cache_.sinks(), cache_.max_chunk());
        else
            return Cache(layers, cache_.slot_count(), cache_.capacity(), cache_.growth());
    }

    void keep_only() {
        if (model_.empty() || pick(0, 3) != 0) return;
        std::vector<kvcache::sequence_id> keep;
        for (const auto& entry : model_)
            if (pick(0, 1)) keep.push_back(entry.first);
        if (pick(0, 4) == 0) {
            // An unknown id in the list: nothing may be removed.
            auto bad = keep;
            bad.push_back(1 << 30);
            expect_failure(kvcache::error_code::not_found, [&] { cache_.keep_only(bad); });
            return;
        }
        cache_.keep_only(keep);
        for (auto it = model_.begin(); it != model_.end();)
            it = std::find(keep.begin(), keep.end(), it->first) == keep.end() ? model_.erase(it) : std::next(it);
    }

    void bad_id() {
        const kvcache::sequence_id missing = 1 << 30;
        switch (pick(0, 4)) {
        case 0: expect_failure(kvcache::error_code::not_found, [&] { cache_.remove_sequence(missing); }); break;
        case 1: expect_failure(kvcache::error_code::not_found, [&] { cache_.fork(missing); }); break;
        case 2: expect_failure(kvcache::error_code::not_found, [&] { cache_.truncate(missing, 0); }); break;
        case 3: expect_failure(kvcache::error_code::not_found, [&] { cache_.begin_append(missing, 1); }); break;
        default: expect_failure(kvcache::error_code::not_found, [&] { (void)cache_.length(missing); }); break;
        }
    }

    template <class F>
    void expect_failure(kvcache::error_code code, F&& f) {
        INFO("step ", step_);
        const std::string before = pool_state();
        bool thrown = false;
        try {
            f();
        } catch (const kvcache::error& e) {
            INFO(std::string(e.what()));
            CHECK(e.code() == code);
            thrown = true;
        }
        REQUIRE(thrown);
        // Refused means unchanged: the rows (check_all() next), the page
        // tables and the pool's and host tier's counts.
        REQUIRE(pool_state() == before);
        ++failures_seen;
    }

    // The pool's and host tier's page counts and every sequence's page table.
    std::string pool_state() const {
        std::ostringstream out;
        if constexpr (kind == kvcache::layout_kind::paged) {
            const auto st = cache_.statistics();
            out << "pool pages free " << st.pages_free << ", used " << st.pages_used << ", cached "
                << st.pages_evictable << "; host tier pages used " << st.host_pages_used << "; page tables";
            for (const auto& entry : model_) {
                out << " [" << entry.first << ":";
                for (int p : cache_.pages(entry.first)) out << ' ' << p;
                out << ']';
            }
        }
        return out.str();
    }

    static bool layers_agree(const model_sequence<element>& s) {
        for (int l = 1; l < layers; ++l)
            if (s.dropped[l] != s.dropped[0]) return false;
        return true;
    }

    // Keeps a random ascending subset of each layer's rows (one layer or all
    // at once); now and then a bad list, which must change nothing.
    void compact() {
        if constexpr (kind == kvcache::layout_kind::paged) {
            if (model_.empty()) return;
            const kvcache::sequence_id id = any_id();
            auto& s = model_[id];
            const int length = s.length();
            std::vector<std::vector<int>> visible(layers), kept(layers);  // positions; visible indices
            const int keep_percent = pick(20, 100);
            for (int l = 0; l < layers; ++l) {
                for (int p = 0; p < length; ++p)
                    if (s.stored(l, p)) visible[l].push_back(p);
                for (int i = 0; i < static_cast<int>(visible[l].size()); ++i)
                    if (pick(0, 99) < keep_percent) kept[l].push_back(i);
            }
            const bool one_layer = pick(0, 1) == 0;
            const int layer = pick(0, layers - 1);
            auto apply = [&](const std::vector<std::vector<int>>& lists) {
                if (one_layer) cache_.compact(id, layer, lists[layer]);
                else cache_.compact(id, lists);
            };
            if (s.swapped) {
                expect_failure(kvcache::error_code::invalid_argument, [&] { apply(kept); });
                return;
            }
            const int bad = pick(0, 11);
            if (bad == 0) {  // an index past the layer's rows
                auto wrong = kept;
                wrong[layer].push_back(static_cast<int>(visible[layer].size()) + pick(0, 2));
                expect_failure(kvcache::error_code::out_of_range, [&] { apply(wrong); });
                return;
            }
            if (bad == 1 && !kept[layer].empty()) {  // a repeated index
                auto wrong = kept;
                wrong[layer].push_back(wrong[layer].back());
                expect_failure(kvcache::error_code::invalid_argument, [&] { apply(wrong); });
                return;
            }
            if (bad == 2 && kept[layer].size() >= 2) {  // not ascending
                auto wrong = kept;
                std::swap(wrong[layer][0], wrong[layer][1]);
                expect_failure(kvcache::error_code::invalid_argument, [&] { apply(wrong); });
                return;
            }
            const std::string before = pool_state();
            const auto st = cache_.statistics();
            const std::size_t spare = std::size_t(st.pages_free) + std::size_t(st.pages_evictable);
            try {
                apply(kept);
            } catch (const kvcache::error& e) {
                INFO("step ", step_, ": ", std::string(e.what()));
                // Copies on write need at most one page per page the sequence
                // holds: enough for its layer that stores the most rows.
                std::size_t most = 0;
                for (int l = 0; l < layers; ++l) most = std::max(most, visible[l].size());
                const std::size_t held = (most + cache_.page_size() - 1) / cache_.page_size();
                REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
                if (spare >= held)
                    FAIL("compact of sequence ", id, " refused at step ", step_, " with ", spare,
                         " pages free or cached, though it holds only ", held);
                REQUIRE(pool_state() == before);
                ++failures_seen;
                ++pool_dry;
                return;
            }
            for (int l = 0; l < layers; ++l) {
                if (one_layer && l != layer) continue;
                std::size_t next = 0;
                for (int i = 0; i < static_cast<int>(visible[l].size()); ++i) {
                    if (next < kept[l].size() && kept[l][next] == i) ++next;
                    else s.dropped[l].insert(visible[l][i]);
                }
            }
            ++compactions;
        }
    }

    // swap_out / swap_in of one sequence (paged runs with a host tier); now
    // and then the wrong direction, which must be refused.
    void swap() {
        if constexpr (kind == kvcache::layout_kind::paged) {
            if (model_.empty() || cache_.host_tier_pages() == 0) return;
            const kvcache::sequence_id id = any_id();
            auto& s = model_[id];
            if (pick(0, 7) == 0) {
                if (s.swapped) expect_failure(kvcache::error_code::invalid_argument, [&] { cache_.swap_out(id); });
                else expect_failure(kvcache::error_code::invalid_argument, [&] { cache_.swap_in(id); });
                return;
            }
            const std::string before = pool_state();
            try {
                if (s.swapped) cache_.swap_in(id);
                else cache_.swap_out(id);
            } catch (const kvcache::error& e) {
                INFO("step ", step_, ": ", std::string(e.what()));
                REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
                REQUIRE(pool_state() == before);
                ++failures_seen;
                ++pool_dry;
                return;
            }
            s.swapped = !s.swapped;
            ++swaps;
        }
    }

    // --- the comparison -------------------------------------------------------
    void check_all() {
        INFO("step ", step_);
        std::vector<kvcache::sequence_id> ids, resident;  // a swapped-out sequence has no view
        for (const auto& entry : model_) {
            ids.push_back(entry.first);
            if (!entry.second.swapped) resident.push_back(entry.first);
        }
        REQUIRE(cache_.sequences() == ids);
        for (int l = 0; l < layers; ++l) {
            const auto view = cache_.view(l, resident);
            if (view.sequence_count() != static_cast<int>(resident.size())) FAIL("sequence count at step ", step_);
            for (int b = 0; b < static_cast<int>(resident.size()); ++b) {
                const auto& s = model_.at(resident[b]);
                const int length = s.length();
                if (view.length(b) != length || cache_.length(resident[b]) != length)
                    FAIL("length ", view.length(b), " != model's ", length, " at step ", step_);
                const std::vector<int> expected = expected_positions(s, l);
                if (view.visible_count(b) != static_cast<int>(expected.size()))
                    FAIL("visible count ", view.visible_count(b), " != ", expected.size(), " at step ", step_);
                for (int h = 0; h < kv; ++h) {
                    int at = 0;
                    while (at < view.visible_count(b)) {
                        const auto r = view.run(b, h, at);
                        // Plain ifs in the hot loop: doctest assertions per row are slow under sanitizers.
                        if (r.count <= 0 || at + r.count > view.visible_count(b))
                            FAIL("bad run at step ", step_, ": count ", r.count, " at visible ", at);
                        for (int i = 0; i < r.count; ++i) {
                            const int p = expected[at + i];
                            if (r.first_position + i != p)
                                FAIL("run position ", r.first_position + i, " != expected ", p, " at step ", step_);
                            const element* key = r.keys + std::size_t(i) * r.stride;
                            const element* value = r.values + std::size_t(i) * r.stride;
                            const std::size_t m = std::size_t(p) * row + std::size_t(h) * dim;
                            // Bitwise: every value the model holds is exact in both precisions.
                            if (std::memcmp(key, &s.keys[l][m], dim * sizeof(element)) != 0 ||
                                std::memcmp(value, &s.values[l][m], dim * sizeof(element)) != 0)
                                FAIL("mismatch at step ", step_, " sequence ", resident[b], " layer ", l, " head ", h,
                                     " position ", p);
                        }
                        at += r.count;
                    }
                }
            }
        }
        if constexpr (kind == kvcache::layout_kind::paged)
            for (kvcache::sequence_id id : ids) check_stored(id);
    }

    std::vector<int> expected_positions(const model_sequence<element>& s, int layer) const {
        std::vector<int> expected;
        for (int p = 0; p < s.length(); ++p)
            if (present(s.length(), p) && s.stored(layer, p)) expected.push_back(p);
        return expected;
    }

    // The paged owner's own account of a sequence: swapped or not, which
    // positions each layer stores, and (while swapped out, where no view
    // reaches) the rows read() returns from the host tier.
    void check_stored(kvcache::sequence_id id) {
        const auto& s = model_.at(id);
        if (cache_.swapped_out(id) != s.swapped)
            FAIL("sequence ", id, " swapped out: ", cache_.swapped_out(id), ", model: ", s.swapped, " at step ", step_);
        if (cache_.length(id) != s.length())
            FAIL("length of sequence ", id, " ", cache_.length(id), " != model's ", s.length(), " at step ", step_);
        std::vector<element> k(row), v(row);
        for (int l = 0; l < layers; ++l) {
            const std::vector<int> expected = expected_positions(s, l);
            if (cache_.present_positions(id, l) != expected)
                FAIL("sequence ", id, " layer ", l, " stores ", cache_.present_positions(id, l).size(),
                     " positions, the model ", expected.size(), " (or other ones) at step ", step_);
            if (!s.swapped) continue;
            for (int p : expected) {
                cache_.read(id, l, p, 1, k, v);
                const std::size_t m = std::size_t(p) * row;
                if (std::memcmp(k.data(), &s.keys[l][m], row * sizeof(element)) != 0 ||
                    std::memcmp(v.data(), &s.values[l][m], row * sizeof(element)) != 0)
                    FAIL("swapped-out mismatch at step ", step_, " sequence ", id, " layer ", l, " position ", p);
            }
        }
    }

    Cache cache_;
    std::mt19937 random_;
    bool prefix_mode_;
    int sinks_, ring_, max_chunk_, capacity_, slots_;
    int step_ = 0;
    int extra_compactions_ = 0;
    int extra_swaps_ = 0;
    std::map<kvcache::sequence_id, model_sequence<element>> model_;
};

constexpr int seeds = 5;
constexpr int steps = 500;

std::uint32_t seed_for(int i) { return 1000u + 7919u * static_cast<std::uint32_t>(i); }

}  // namespace

TEST_CASE_TEMPLATE("model-based: contiguous static cache", Element, float, kvcache::half) {
    int total = 0;
    for (int i = 0; i < seeds; ++i) {
        const std::uint32_t seed = seed_for(i);
        INFO("seed ", seed);
        model_run<kvcache::contiguous_cache<Element, heads>> run(
            kvcache::contiguous_cache<Element, heads>(layers, 5, 40), seed, false, 0, 0, 0, 40, 5);
        run.run(steps);
        total += run.operations;
        CHECK(run.failures_seen > 0);
    }
    CHECK(total == seeds * steps);
}

TEST_CASE_TEMPLATE("model-based: contiguous dynamic cache", Element, float, kvcache::half) {
    for (int i = 0; i < seeds; ++i) {
        const std::uint32_t seed = seed_for(i) + 1;
        INFO("seed ", seed);
        // Never full: capacity and slot limits set beyond reach for the model.
        model_run<kvcache::contiguous_cache<Element, heads>> run(
            kvcache::dynamic_cache<Element, heads>(layers, 1, 4), seed, false, 0, 0, 0, 1 << 30, 1 << 30);
        run.run(steps);
        CHECK(run.operations == steps);
    }
}

TEST_CASE_TEMPLATE("model-based: paged cache, plain and prefix modes", Element, float, kvcache::half) {
    std::uint64_t hits = 0, evictions = 0, copies = 0;
    int refusals = 0;
    for (int i = 0; i < seeds; ++i) {
        for (bool prefix : {false, true}) {
            for (int page_size : {1, 3, 4}) {
                const std::uint32_t seed = seed_for(i) + 2 + page_size;
                INFO("seed ", seed, " prefix ", prefix, " page_size ", page_size);
                // A small pool, so the pool runs dry and eviction happens.
                model_run<kvcache::paged_cache<Element, heads>> run(
                    kvcache::paged_cache<Element, heads>(layers, 150 / page_size, page_size, prefix), seed, prefix);
                run.run(steps / 2);
                CHECK(run.operations == steps / 2);
                const auto stats = run.cache().statistics();
                hits += stats.prefix_hit_pages;
                evictions += stats.evictions;
                copies += stats.copies;
                refusals += run.failures_seen;
            }
        }
    }
    // The runs must have exercised sharing, eviction, copy-on-write and a dry pool.
    CHECK(hits > 0);
    CHECK(evictions > 0);
    CHECK(copies > 0);
    CHECK(refusals > 0);
    MESSAGE("paged runs: ", hits, " prefix page hits, ", evictions, " evictions, ", copies, " copies on write, ",
            refusals, " refused operations");
}

// Issues 15 and 16: compaction mixed with append, fork, prefix hits,
// truncate, save/load and swap through a host tier with a disk tier below
// it, in a pool of 24 pages of 4 tokens that runs dry often; fp32, so every
// comparison is exact.
TEST_CASE("model-based: paged cache mixing compaction, swaps and a dry pool") {
    using cache_type = kvcache::paged_cache<float, heads>;
    int compactions = 0, swaps = 0, refusals = 0, dry = 0;
    std::uint64_t hits = 0, released = 0, copies = 0, disk_written = 0, disk_hits = 0;
    const auto disk_root = std::filesystem::temp_directory_path() / "kvcache_model_test_disk";
    for (int i = 0; i < 8; ++i) {
        for (bool prefix : {false, true}) {
            const std::uint32_t seed = seed_for(i) + 11 + (prefix ? 1 : 0);
            INFO("seed ", seed, " prefix ", prefix);
            cache_type cache(layers, 24, 4, prefix);
            cache.attach_host_tier(16);
            const auto directory = disk_root / std::to_string(seed);
            std::filesystem::remove_all(directory);
            std::filesystem::create_directories(directory);
            model_run<cache_type> run(std::move(cache), seed, prefix);
            run.use_disk_tier(directory.string(), 8);
            // Swaps often enough that one sequence is swapped out, back in,
            // changed and swapped out again: a stale host copy must not return.
            run.mix_in(10, 8);
            run.run(500);
            CHECK(run.operations == 500);
            const auto stats = run.cache().statistics();
            hits += stats.prefix_hit_pages;
            disk_written += stats.pages_written_to_disk;
            disk_hits += stats.disk_prefix_hit_pages;
            released += stats.pages_released_by_compaction;
            copies += stats.copies;
            compactions += run.compactions;
            swaps += run.swaps;
            refusals += run.failures_seen;
            dry += run.pool_dry;

            // Everything released: no page is referenced; once the prefix
            // cache is cleared every page is free (evictable pages are not
            // counted as free), and the whole pool serves one new sequence.
            run.remove_all();
            cache_type& c = run.cache();
            CHECK(c.statistics().pages_used == 0);
            for (int p = 0; p < c.page_count(); ++p) CHECK(c.page_references(p) == 0);
            const int evictable = c.statistics().pages_evictable;
            const kvcache::cleared_prefix_pages cleared = c.clear_prefix_cache();
            CHECK(cleared.pool == evictable);
            CHECK(c.statistics().pages_free == c.page_count());
            CHECK(c.statistics().pages_evictable == 0);
            CHECK(c.statistics().pages_cached == 0);
            CHECK(c.statistics().host_pages_used == 0);
            CHECK(c.statistics().host_pages_cached == 0);
            CHECK(c.statistics().disk_pages_used == 0);
            const int tokens = c.page_count() * c.page_size();
            const std::vector<float> rows(std::size_t(tokens) * row, 1.0f);
            const kvcache::sequence_id id = c.add_sequence();
            for (int l = 0; l < layers; ++l) c.append(id, l, rows, rows, tokens);
            CHECK(c.statistics().pages_free == 0);
            c.remove_sequence(id);
            CHECK(c.statistics().pages_used == 0);
        }
    }
    CHECK(compactions > 0);
    CHECK(swaps > 0);
    CHECK(refusals > 0);
    CHECK(dry > 0);
    CHECK(hits > 0);
    CHECK(released > 0);
    CHECK(copies > 0);
    CHECK(disk_written > 0);
    CHECK(disk_hits > 0);
    std::filesystem::remove_all(disk_root);
    MESSAGE("disk tier: ", disk_written, " pages written, ", disk_hits, " prefix pages read back");
    MESSAGE("compaction runs: ", compactions, " compactions (", released, " pages released), ", swaps, " swaps, ",
            hits, " prefix page hits, ", copies, " copies on write, ", refusals, " refused operations (", dry,
            " for want of pages)");
}

TEST_CASE_TEMPLATE("model-based: sliding window cache", Element, float, kvcache::half) {
    for (int i = 0; i < seeds; ++i) {
        const std::uint32_t seed = seed_for(i) + 3;
        const int sinks = i % 3, window = 3 + i % 4, chunk = 1 + i % 3;
        INFO("seed ", seed, " sinks ", sinks, " window ", window, " chunk ", chunk);
        model_run<kvcache::sliding_window_cache<Element, heads>> run(
            kvcache::sliding_window_cache<Element, heads>(layers, 5, window, sinks, chunk), seed, false, sinks,
            window + chunk - 1, chunk, 0, 5);
        run.run(steps);
        CHECK(run.failures_seen > 0);
    }
}
