// Randomised model-based tests: thousands of random operations applied both
// to a cache owner and to a plain reference model (each sequence a vector of
// per-token K/V rows per layer); after every step every present row seen
// through the view must equal the model's. All three layouts, fp32 and fp16.
// The paged runs also compact (random kept rows per layer) and swap
// sequences through a host tier; the model then records, per layer, the
// positions a compaction dropped.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
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
    /// Per layer, the positions below length() a compaction dropped (rows stay indexed by position).
    std::vector<std::set<int>> dropped = std::vector<std::set<int>>(layers);
    int length() const { return static_cast<int>(keys[0].size() / row); }
    bool compacted() const {
        for (const auto& d : dropped)
            if (!d.empty()) return true;
        return false;
    }
    /// Whether every layer keeps the same positions (a saved record holds one set).
    bool layers_agree() const {
        for (const auto& d : dropped)
            if (d != dropped[0]) return false;
        return true;
    }
    /// Rows the most-keeping layer stores: what the shared page table must hold.
    int stored_rows() const {
        std::size_t fewest = dropped[0].size();
        for (const auto& d : dropped) fewest = std::min(fewest, d.size());
        return length() - static_cast<int>(fewest);
    }
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
            if (op < 12) add();
            else if (op < 50) append();
            else if (op < 58) fork();
            else if (op < 66) truncate();
            else if (op < 72) remove();
            else if (op < 78) overwrite();
            else if (op < 82) clone_through_file();
            else if (op < 84) reload_everything();
            else if (op < 86) keep_only();
            else if (op < 92) bad_id();
            else if (kind == kvcache::layout_kind::paged && op < 97) compact();
            else if (kind == kvcache::layout_kind::paged) swap_round_trip();
            else append();
            check_all();
            ++operations;
        }
    }

    const Cache& cache() const { return cache_; }
    int operations = 0;
    int failures_seen = 0;  // expected errors that were raised (and checked to change nothing)

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
            if constexpr (kind == kvcache::layout_kind::paged) {
                const int ps = cache_.page_size();
                const int stored = s.stored_rows();
                const int held = (stored + ps - 1) / ps;
                const int new_pages = (stored + n + ps - 1) / ps - held;
                // Pages the new rows land in that exist already may need a copy on write: one
                // at most, unless compaction left layers with fewer rows, which land lower down.
                std::set<int> landing = {0};
                for (int l = 0; l < layers && n > 0; ++l) {
                    const int rows = length - static_cast<int>(s.dropped[l].size());
                    for (int page = rows / ps; page <= (rows + n - 1) / ps && page < held; ++page) landing.insert(page);
                }
                // The pool may only refuse when referenced pages plus the new ones (and the copies) overflow it.
                expected = e.code() == kvcache::error_code::capacity_exceeded &&
                           referenced + new_pages + static_cast<int>(landing.size()) > cache_.page_count();
            }
            INFO("step ", step_, ": ", std::string(e.what()));
            REQUIRE(expected);
            ++failures_seen;
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
        bool should_fail = to > length;
        if (kind == kvcache::layout_kind::sliding_window) should_fail |= to < length && length > sinks_ + ring_;
        if (should_fail) {
            expect_failure(kvcache::error_code::out_of_range, [&] { cache_.truncate(id, to); });
            return;
        }
        cache_.truncate(id, to);
        for (int l = 0; l < layers; ++l) {
            s.dropped[l].erase(s.dropped[l].lower_bound(to), s.dropped[l].end());
            s.keys[l].resize(std::size_t(to) * row);
            s.values[l].resize(std::size_t(to) * row);
        }
        s.tokens.resize(std::min<std::size_t>(s.tokens.size(), to));
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
        if (s.compacted()) return;  // writes address positions; a compacted layer's are not all there
        const int length = s.length();
        if (length == 0) return;
        const int first = pick(0, length - 1);
        int n = pick(1, std::min(4, length - first));
        while (n > 0 && !(present(length, first) && present(length, first + n - 1) &&
                          (first >= sinks_ || first + n <= sinks_ || length <= sinks_ + ring_)))
            --n;
        if (n == 0) {
            if (!present(length, first))
                expect_failure(kvcache::error_code::out_of_range, [&] {
                    std::vector<element> k(row), v(row);
                    cache_.write(id, 0, first, k, v, 1);
                });
            return;
        }
        const int layer = pick(0, layers - 1);
        std::vector<element> k(std::size_t(n) * row), v(std::size_t(n) * row);
        for (auto& x : k) x = exact<element>(random_());
        for (auto& x : v) x = exact<element>(random_());
        try {
            cache_.write(id, layer, first, k, v, n);
        } catch (const kvcache::error& e) {
            INFO(std::string(e.what()));
            // Only a paged copy-on-write may run out of pages.
            REQUIRE(kind == kvcache::layout_kind::paged);
            REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
            ++failures_seen;
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
        if (!model_[id].layers_agree()) {
            expect_failure(kvcache::error_code::invalid_argument, [&] { cache_.save(file, {id}); });
            return;
        }
        cache_.save(file, {id});
        try {
            const auto ids = cache_.load(file);
            REQUIRE(ids.size() == 1);
            model_[ids[0]] = model_[id];
        } catch (const kvcache::error& e) {
            INFO(std::string(e.what()));
            REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
            ++failures_seen;
        }
    }

    // Saves everything, loads it into a fresh cache and carries on with that one.
    void reload_everything() {
        std::stringstream file;
        for (const auto& entry : model_)
            if (!entry.second.layers_agree()) {
                expect_failure(kvcache::error_code::invalid_argument, [&] { cache_.save(file); });
                return;
            }
        cache_.save(file);
        Cache fresh = make_empty_like();
        std::vector<kvcache::sequence_id> ids;
        try {
            if constexpr (kind == kvcache::layout_kind::paged)
                if (cache_.host_tier_pages() > 0) fresh.attach_host_tier(cache_.host_tier_pages());
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
            return;
        }
        REQUIRE(ids.size() == model_.size());
        std::map<kvcache::sequence_id, model_sequence<element>> renamed;
        std::size_t i = 0;
        for (auto& entry : model_) renamed[ids[i++]] = std::move(entry.second);
        model_ = std::move(renamed);
        cache_ = std::move(fresh);
    }

    Cache make_empty_like() const {
        if constexpr (kind == kvcache::layout_kind::paged)
            return Cache(layers, cache_.page_count(), cache_.page_size(), cache_.prefix_caching());
        else if constexpr (kind == kvcache::layout_kind::sliding_window)
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

    // Keeps a random subset of one sequence's rows, in one layer or all: sinks
    // kept or not, sometimes nothing; a bad list must change nothing.
    void compact() {
        if constexpr (kind == kvcache::layout_kind::paged) {
            if (model_.empty()) return;
            const kvcache::sequence_id id = any_id();
            auto& s = model_[id];
            const int length = s.length();
            std::vector<std::vector<int>> kept(layers);
            std::vector<int> visible(layers);
            for (int l = 0; l < layers; ++l) {
                visible[l] = length - static_cast<int>(s.dropped[l].size());
                const int sinks = pick(0, 2), density = pick(1, 4);
                for (int i = 0; i < visible[l]; ++i)
                    if (i < sinks || pick(1, 4) <= density - 1) kept[l].push_back(i);
            }
            const bool one_layer = pick(0, 2) == 0;
            const int layer = pick(0, layers - 1);
            auto call = [&](const std::vector<std::vector<int>>& lists) {
                if (one_layer) cache_.compact(id, layer, lists[layer]);
                else cache_.compact(id, lists);
            };
            const int bad = pick(0, 9);
            const int victim = one_layer ? layer : pick(0, layers - 1);
            if (bad == 0) {  // an index past the layer's visible rows
                auto lists = kept;
                lists[victim].push_back(visible[victim] + pick(0, 2));
                const std::string before = accounting();
                expect_failure(kvcache::error_code::out_of_range, [&] { call(lists); });
                CHECK(accounting() == before);
                return;
            }
            if (bad == 1 && kept[victim].size() >= 2) {  // not ascending
                auto lists = kept;
                std::swap(lists[victim][0], lists[victim][1]);
                const std::string before = accounting();
                expect_failure(kvcache::error_code::invalid_argument, [&] { call(lists); });
                CHECK(accounting() == before);
                return;
            }
            const std::string before = accounting();
            try {
                call(kept);
            } catch (const kvcache::error& e) {
                INFO("step ", step_, ": ", std::string(e.what()));
                // Only a copy on write of a shared page may lack a free page.
                REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
                CHECK(accounting() == before);
                ++failures_seen;
                return;
            }
            for (int l = 0; l < layers; ++l) {
                if (one_layer && l != layer) continue;
                std::vector<int> positions;
                for (int p = 0; p < length; ++p)
                    if (!s.dropped[l].count(p)) positions.push_back(p);
                std::set<int> keep;
                for (int i : kept[l]) keep.insert(positions[std::size_t(i)]);
                for (int p : positions)
                    if (!keep.count(p)) s.dropped[l].insert(p);
            }
            ++compactions;
        }
    }

    // swap_out then swap_in of one sequence: every row comes back, a swapped
    // sequence cannot be attended to, and a refused swap changes nothing.
    void swap_round_trip() {
        if constexpr (kind == kvcache::layout_kind::paged) {
            if (model_.empty() || cache_.host_tier_pages() == 0) return;
            const kvcache::sequence_id id = any_id();
            const std::string before = accounting();
            try {
                cache_.swap_out(id);
            } catch (const kvcache::error& e) {
                INFO("step ", step_, ": ", std::string(e.what()));
                REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);  // the tier is full
                CHECK(accounting() == before);
                ++failures_seen;
                return;
            }
            REQUIRE(cache_.swapped_out(id));
            expect_failure(kvcache::error_code::invalid_argument, [&] { (void)cache_.view(0, {id}); });
            cache_.swap_in(id);  // the pages it freed are still free: nothing ran in between
            REQUIRE_FALSE(cache_.swapped_out(id));
            ++swaps;
        }
    }

    // The pool's and tiers' bookkeeping and every page table, without save()
    // (which refuses sequences whose layers keep different positions).
    std::string accounting() const {
        std::ostringstream out;
        if constexpr (kind == kvcache::layout_kind::paged) {
            const auto st = cache_.statistics();
            out << st.pages_used << "," << st.pages_free << "," << st.pages_cached << "," << st.pages_evictable << ","
                << st.evictions << "," << st.copies << "," << st.host_pages_used << "," << st.host_pages_cached << ","
                << st.sequences_swapped_out << "," << st.pages_released_by_compaction;
            for (auto id : cache_.sequences()) {
                out << "|" << id << ":" << cache_.length(id);
                for (int p : cache_.pages(id)) out << ";" << p << "x" << cache_.page_references(p);
            }
        }
        return out.str();
    }

public:
    int compactions = 0;
    int swaps = 0;

    /// Removes every sequence; the pool must then hold no page for anyone.
    void release_everything() {
        for (const auto& entry : model_) cache_.remove_sequence(entry.first);
        model_.clear();
        if constexpr (kind == kvcache::layout_kind::paged) {
            const auto st = cache_.statistics();
            CHECK(st.pages_used == 0);
            // Cached prefix pages nobody references are evictable: free for the asking.
            CHECK(st.pages_free + st.pages_evictable == cache_.page_count());
            CHECK(st.host_pages_used == 0);
        }
    }

private:
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
        bool thrown = false;
        try {
            f();
        } catch (const kvcache::error& e) {
            INFO(std::string(e.what()));
            CHECK(e.code() == code);
            thrown = true;
        }
        REQUIRE(thrown);
        ++failures_seen;
    }

    // --- the comparison -------------------------------------------------------
    void check_all() {
        INFO("step ", step_);
        std::vector<kvcache::sequence_id> ids;
        for (const auto& entry : model_) ids.push_back(entry.first);
        REQUIRE(cache_.sequences() == ids);
        if constexpr (kind == kvcache::layout_kind::paged) {
            // A sequence holds the pages its most-keeping layer's rows fill, no more:
            // compaction and truncation give the rest back.
            const int ps = cache_.page_size();
            for (const auto& entry : model_)
                if (static_cast<int>(cache_.pages(entry.first).size()) != (entry.second.stored_rows() + ps - 1) / ps)
                    FAIL("sequence ", entry.first, " holds ", cache_.pages(entry.first).size(), " pages for ",
                         entry.second.stored_rows(), " stored rows at step ", step_);
        }
        for (int l = 0; l < layers; ++l) {
            const auto view = cache_.view(l, ids);
            if (view.sequence_count() != static_cast<int>(ids.size())) FAIL("sequence count at step ", step_);
            for (int b = 0; b < static_cast<int>(ids.size()); ++b) {
                const auto& s = model_.at(ids[b]);
                const int length = s.length();
                if (view.length(b) != length || cache_.length(ids[b]) != length)
                    FAIL("length ", view.length(b), " != model's ", length, " at step ", step_);
                std::vector<int> expected;
                for (int p = 0; p < length; ++p)
                    if (present(length, p) && !s.dropped[l].count(p)) expected.push_back(p);
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
                                FAIL("mismatch at step ", step_, " sequence ", ids[b], " layer ", l, " head ", h,
                                     " position ", p);
                        }
                        at += r.count;
                    }
                }
            }
        }
    }

    Cache cache_;
    std::mt19937 random_;
    bool prefix_mode_;
    int sinks_, ring_, max_chunk_, capacity_, slots_;
    int step_ = 0;
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
    std::uint64_t hits = 0, evictions = 0, copies = 0, released = 0;
    int refusals = 0, compactions = 0, swaps = 0;
    for (int i = 0; i < seeds; ++i) {
        for (bool prefix : {false, true}) {
            for (int page_size : {1, 3, 4}) {
                const std::uint32_t seed = seed_for(i) + 2 + page_size;
                INFO("seed ", seed, " prefix ", prefix, " page_size ", page_size);
                // A small pool, so the pool runs dry and eviction happens.
                kvcache::paged_cache<Element, heads> cache(layers, 150 / page_size, page_size, prefix);
                // A host tier smaller than the pool, so a long sequence cannot swap out.
                cache.attach_host_tier(60 / page_size);
                model_run<kvcache::paged_cache<Element, heads>> run(std::move(cache), seed, prefix);
                run.run(steps / 2);
                CHECK(run.operations == steps / 2);
                const auto stats = run.cache().statistics();
                compactions += run.compactions;
                swaps += run.swaps;
                released += stats.pages_released_by_compaction;
                run.release_everything();
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
    CHECK(compactions > 0);
    CHECK(released > 0);
    CHECK(swaps > 0);
    MESSAGE("paged runs: ", hits, " prefix page hits, ", evictions, " evictions, ", copies, " copies on write, ",
            refusals, " refused operations, ", compactions, " compactions releasing ", released, " pages, ", swaps,
            " swap round trips");
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
