// Prefix sharing shown on small, hand-checked cases: k common full pages are
// held once with reference count 2, a write after a fork copies exactly one
// page, and unreferenced cached pages are evicted least recently used first.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "cache_test_support.hpp"
#include "kvcache/cache.hpp"

namespace {

using heads = kvcache::head_config<2, 1, 8>;
constexpr int page = 4;

std::vector<std::int32_t> prompt(int n, int first = 100) {
    std::vector<std::int32_t> out(n);
    std::iota(out.begin(), out.end(), first);
    return out;
}

/// Appends tokens with their rows to layer 0 (the cache has one layer).
template <class Cache>
void append_tokens(Cache& cache, kvcache::sequence_id id, const std::vector<std::int32_t>& tokens, int salt) {
    const int n = static_cast<int>(tokens.size());
    const auto k = test_support::rows<typename Cache::element_type, heads>(n, salt);
    const auto v = test_support::rows<typename Cache::element_type, heads>(n, salt + 1);
    cache.append(id, k, v, tokens);
}

}  // namespace

TEST_CASE_TEMPLATE("two sequences with a common prefix of k full pages hold them once", Element, float, kvcache::half) {
    kvcache::paged_cache<Element, heads> cache(1, 32, page);
    const int k = 3;
    // First request: a system prompt of k full pages plus 2 tokens of its own.
    const auto system = prompt(k * page);
    auto first_tokens = system;
    first_tokens.push_back(7);
    first_tokens.push_back(8);
    const auto a = cache.add_sequence();
    append_tokens(cache, a, first_tokens, 1);
    cache.publish(a);  // rows written: its full pages may now be shared
    CHECK(cache.statistics().pages_cached == k);

    // Second request: same system prompt, another question.
    auto second_tokens = system;
    second_tokens.push_back(9);
    const auto b = cache.add_sequence();
    CHECK(cache.match_prefix(b, second_tokens) == k * page);
    CHECK(cache.length(b) == k * page);
    for (int i = 0; i < k; ++i) {
        CHECK(cache.pages(b)[i] == cache.pages(a)[i]);
        CHECK(cache.page_references(cache.pages(a)[i]) == 2);
    }
    // a: k + 1 pages, b: the same k: k + 1 pages in use, not 2k + 1.
    CHECK(cache.statistics().pages_used == k + 1);
    CHECK(cache.statistics().prefix_hit_pages == std::uint64_t(k));
    CHECK(cache.statistics().hit_rate() == doctest::Approx(1.0));
    // b sees a's rows for the shared prefix.
    std::vector<Element> ka(k * page * 8), va(ka.size()), kb(ka.size()), vb(ka.size());
    cache.read(a, 0, 0, k * page, ka, va);
    cache.read(b, 0, 0, k * page, kb, vb);
    CHECK(std::equal(ka.begin(), ka.end(), kb.begin(), [](Element x, Element y) { return float(x) == float(y); }));

    // A third request that differs inside page 2 shares pages 0 and 1 only.
    auto third_tokens = system;
    third_tokens[2 * page + 1] = -5;
    const auto c = cache.add_sequence();
    CHECK(cache.match_prefix(c, third_tokens) == 2 * page);
    CHECK(cache.page_references(cache.pages(a)[0]) == 3);
    CHECK(cache.page_references(cache.pages(a)[2]) == 2);
    CHECK(cache.statistics().prefix_queried_pages == std::uint64_t(2 * k));
    CHECK(cache.statistics().hit_rate() == doctest::Approx(5.0 / 6.0));
}

TEST_CASE_TEMPLATE("a write after a fork copies exactly one page", Element, float, kvcache::half) {
    kvcache::paged_cache<Element, heads> cache(1, 16, page, false);
    const auto parent = cache.add_sequence();
    append_tokens(cache, parent, prompt(3 * page + 2), 1);  // 4 pages, the last half full
    const auto child = cache.fork(parent);
    for (int p : cache.pages(parent)) CHECK(cache.page_references(p) == 2);
    const auto before = cache.statistics();
    CHECK(before.pages_used == 4);
    std::vector<Element> parent_keys(14 * 8), parent_values(parent_keys.size());
    cache.read(parent, 0, 0, 14, parent_keys, parent_values);

    append_tokens(cache, child, prompt(1, 500), 9);  // into the shared half-full page
    const auto after = cache.statistics();
    CHECK(after.copies == before.copies + 1);
    CHECK(after.pages_used == before.pages_used + 1);
    for (int i = 0; i < 3; ++i) CHECK(cache.pages(child)[i] == cache.pages(parent)[i]);
    CHECK(cache.pages(child)[3] != cache.pages(parent)[3]);
    CHECK(cache.page_references(cache.pages(parent)[3]) == 1);
    // The parent's rows are untouched; the child kept the copied ones.
    std::vector<Element> keys(14 * 8), values(keys.size());
    cache.read(parent, 0, 0, 14, keys, values);
    CHECK(std::equal(keys.begin(), keys.end(), parent_keys.begin(), [](Element x, Element y) { return float(x) == float(y); }));
    cache.read(child, 0, 0, 14, keys, values);
    CHECK(std::equal(keys.begin(), keys.end(), parent_keys.begin(), [](Element x, Element y) { return float(x) == float(y); }));
    // A second write into the now private page copies nothing.
    append_tokens(cache, child, prompt(1, 600), 11);
    CHECK(cache.statistics().copies == before.copies + 1);
}

TEST_CASE("unreferenced cached pages are evicted least recently used first") {
    kvcache::paged_cache<float, heads> cache(1, 4, page);
    const auto old_prompt = prompt(page, 100), new_prompt = prompt(page, 200);
    const auto a = cache.add_sequence();
    append_tokens(cache, a, old_prompt, 1);
    const auto b = cache.add_sequence();
    append_tokens(cache, b, new_prompt, 2);
    cache.remove_sequence(a);  // released first: least recently used
    cache.remove_sequence(b);
    CHECK(cache.statistics().pages_evictable == 2);
    CHECK(cache.statistics().pages_free == 2);
    // Three pages of other data: two free pages, then one eviction, which must take a's page.
    const auto c = cache.add_sequence();
    append_tokens(cache, c, prompt(3 * page, 300), 3);
    CHECK(cache.statistics().evictions == 1);
    const auto probe_old = cache.add_sequence();
    CHECK(cache.match_prefix(probe_old, old_prompt) == 0);
    const auto probe_new = cache.add_sequence();
    CHECK(cache.match_prefix(probe_new, new_prompt) == page);
}

TEST_CASE("eviction takes a finished chain from its end, so its first pages still match") {
    // A chain of n full pages, finished (every page unreferenced and cached),
    // then k pages of other data in a pool with no free page left: k pages of
    // the chain go, and they must be the last k, since matching walks from the
    // first page and a chain cut at its head can never match again.
    const int n = 6;
    kvcache::paged_cache<float, heads> cache(1, n, page);
    const auto chain = prompt(n * page, 100);
    const auto a = cache.add_sequence();
    append_tokens(cache, a, chain, 1);
    cache.remove_sequence(a);
    REQUIRE(cache.statistics().pages_evictable == n);
    REQUIRE(cache.statistics().pages_free == 0);
    for (int k = 1; k < n; ++k) {
        const auto other = cache.add_sequence();
        append_tokens(cache, other, prompt(page, 1000 * k), 2 + k);  // one page: one eviction
        CHECK(cache.statistics().evictions == std::uint64_t(k));
        const auto probe = cache.add_sequence();
        CHECK(cache.match_prefix(probe, chain) == (n - k) * page);
        cache.remove_sequence(probe);
        // The other page stays referenced, so the next round must evict from the chain again.
    }
}

TEST_CASE("between chains, the least recently used leaf goes first") {
    kvcache::paged_cache<float, heads> cache(1, 4, page);
    const auto older = prompt(2 * page, 100), newer = prompt(2 * page, 500);
    const auto a = cache.add_sequence();
    append_tokens(cache, a, older, 1);
    const auto b = cache.add_sequence();
    append_tokens(cache, b, newer, 2);
    cache.remove_sequence(a);  // its pages released first
    cache.remove_sequence(b);
    const auto c = cache.add_sequence();
    append_tokens(cache, c, prompt(page, 900), 3);  // one eviction: the older chain's second page
    const auto probe_old = cache.add_sequence();
    CHECK(cache.match_prefix(probe_old, older) == page);
    const auto probe_new = cache.add_sequence();
    CHECK(cache.match_prefix(probe_new, newer) == 2 * page);
}

namespace {
/// Host memory whose stream is a number and whose copies are recorded:
/// shows which stream a cache orders each copy on (CUDA streams here).
struct recording_memory : test_support::numbered_stream_memory {
    struct copy {
        bool ordered;  ///< copy_within_async (on a stream) rather than copy_within
        int stream;    ///< the stream of an ordered copy
    };
    static std::vector<copy>& copies() {
        static std::vector<copy> recorded;
        return recorded;
    }
    static void copy_within(void* destination, const void* source, std::size_t bytes) {
        copies().push_back({false, 0});
        kvcache::host_memory::copy_within(destination, source, bytes);
    }
    static void copy_within_async(void* destination, const void* source, std::size_t bytes, stream_type stream) {
        copies().push_back({true, stream});
        kvcache::host_memory::copy_within(destination, source, bytes);
    }
};
}  // namespace

TEST_CASE("a plan's copy on write is ordered on the plan's stream; begin_append's is done on return") {
    kvcache::paged_cache<float, heads, recording_memory> cache(2, 16, page, false);
    const auto parent = cache.add_sequence();
    cache.begin_append(parent, page + 1);  // two pages, the second one row full
    const auto child = cache.fork(parent);
    auto& copies = recording_memory::copies();
    copies.clear();
    const auto plan = cache.plan({child}, {1}, 7);  // writes into the shared partial page
    REQUIRE(copies.size() == 4);                     // its key and value planes in both layers
    for (const auto& c : copies) {
        CHECK(c.ordered);
        CHECK(c.stream == 7);
    }
    CHECK(cache.pages(child)[1] != cache.pages(parent)[1]);
    CHECK(plan.new_tokens(0) == 1);
    // With token ids (the prefix cache's plan) the same.
    const auto second = cache.fork(parent);
    copies.clear();
    (void)cache.plan_with_tokens({second}, {{42}}, 9);
    REQUIRE(copies.size() == 4);
    for (const auto& c : copies) CHECK((c.ordered && c.stream == 9));
    // Outside a plan there is no stream: the copy is done when the call returns.
    const auto third = cache.fork(parent);
    copies.clear();
    cache.begin_append(third, 1);
    REQUIRE(copies.size() == 4);
    for (const auto& c : copies) CHECK(!c.ordered);
}
