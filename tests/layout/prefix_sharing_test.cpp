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
