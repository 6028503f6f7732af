// paged_cache::clear_prefix_cache(): the pages kept only for prefix reuse
// (evictable in the pool, spilled nobody holds in the host tier, files of the
// disk tier) are dropped and can no longer be matched; what sequences hold,
// forked, matched or swapped out, keeps its rows bit for bit and its sharing.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cache_test_support.hpp"
#include "kvcache/cache/paged_cache.hpp"

namespace {

using heads = kvcache::head_config<2, 1, 8>;
using cache_type = kvcache::paged_cache<float, heads>;
constexpr int page = 4, layers = 2;
constexpr int row = heads::kv_heads() * heads::head_dim;

std::vector<std::int32_t> tokens_from(int first, int n) {
    std::vector<std::int32_t> out(n);
    for (int i = 0; i < n; ++i) out[i] = first + i;
    return out;
}

/// Appends tokens to every layer, recording their ids for the prefix cache.
void append_tokens(cache_type& cache, kvcache::sequence_id id, const std::vector<std::int32_t>& tokens) {
    const int first = cache.begin_append(id, static_cast<int>(tokens.size()), tokens);
    for (int l = 0; l < layers; ++l) {
        const auto keys = test_support::token_rows(tokens, first, l, false, row);
        const auto values = test_support::token_rows(tokens, first, l, true, row);
        cache.write(id, l, first, keys, values, static_cast<int>(tokens.size()));
    }
}

/// Every byte of every row of every layer of a sequence.
std::vector<unsigned char> row_bytes(const cache_type& cache, kvcache::sequence_id id) {
    const int n = cache.length(id);
    std::vector<unsigned char> out;
    for (int l = 0; l < layers; ++l) {
        std::vector<float> keys(std::size_t(n) * row), values(keys.size());
        cache.read(id, l, 0, n, keys, values);
        const std::size_t at = out.size(), bytes = keys.size() * sizeof(float);
        out.resize(at + 2 * bytes);
        std::memcpy(out.data() + at, keys.data(), bytes);
        std::memcpy(out.data() + at + bytes, values.data(), bytes);
    }
    return out;
}

/// Page files in a directory.
int files_in(const std::string& directory) {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(directory)) n += entry.is_regular_file();
    return n;
}

/// The prompt less its last token: what an engine offers match_prefix.
std::vector<std::int32_t> lookup_of(const std::vector<std::int32_t>& prompt) {
    return {prompt.begin(), prompt.end() - 1};
}

}  // namespace

TEST_CASE("clear_prefix_cache frees the evictable pages, and a later identical prompt no longer hits") {
    cache_type cache(layers, 16, page, true);
    const auto kept_prompt = tokens_from(100, 3 * page + 2), gone_prompt = tokens_from(500, 3 * page + 1);
    const auto a = cache.add_sequence();  // stays: its pages are held
    append_tokens(cache, a, kept_prompt);
    cache.publish(a);  // its full pages are indexed and held
    const auto b = cache.add_sequence();  // finishes: its 3 full pages stay cached, unreferenced
    append_tokens(cache, b, gone_prompt);
    cache.remove_sequence(b);
    auto st = cache.statistics();
    REQUIRE(st.pages_used == 4);
    REQUIRE(st.pages_evictable == 3);
    REQUIRE(st.pages_free == 16 - 4 - 3);
    const auto before = row_bytes(cache, a);

    const kvcache::cleared_prefix_pages cleared = cache.clear_prefix_cache();
    CHECK(cleared.pool == 3);
    CHECK(cleared.host == 0);
    CHECK(cleared.disk == 0);
    st = cache.statistics();
    CHECK(st.pages_free == 16 - 4);  // every page no sequence holds is free now
    CHECK(st.pages_evictable == 0);
    CHECK(st.pages_used == 4);
    CHECK(st.evictions == 0);  // clearing is not eviction
    CHECK(row_bytes(cache, a) == before);

    // The finished prompt is gone; the held one still matches (its pages are live).
    const auto c = cache.add_sequence();
    CHECK(cache.match_prefix(c, lookup_of(gone_prompt)) == 0);
    const auto d = cache.add_sequence();
    REQUIRE(cache.match_prefix(d, lookup_of(kept_prompt)) == 3 * page);
    CHECK(cache.pages(d)[0] == cache.pages(a)[0]);
    CHECK(cache.statistics().prefix_hit_pages == 3);

    // Clearing again frees nothing; a freed page serves new rows as any free page.
    CHECK(cache.clear_prefix_cache().pool == 0);
    append_tokens(cache, c, gone_prompt);
    CHECK(row_bytes(cache, a) == before);
    static_assert(noexcept(cache.clear_prefix_cache()), "clear_prefix_cache cannot fail");
}

TEST_CASE("clear_prefix_cache leaves forks and copy on write as they were") {
    cache_type cache(layers, 16, page, true);
    const auto prompt = tokens_from(100, 2 * page + 2);
    const auto a = cache.add_sequence();
    append_tokens(cache, a, prompt);
    cache.publish(a);
    const auto f = cache.fork(a);
    const auto other = cache.add_sequence();  // one evictable page to clear
    append_tokens(cache, other, tokens_from(900, page));
    cache.remove_sequence(other);
    const std::vector<int> pages = cache.pages(a);
    std::vector<int> references;
    for (int p : pages) references.push_back(cache.page_references(p));
    const auto rows_a = row_bytes(cache, a);
    const std::uint64_t copies = cache.statistics().copies;

    CHECK(cache.clear_prefix_cache().pool == 1);
    CHECK(cache.pages(a) == pages);
    CHECK(cache.pages(f) == pages);
    for (std::size_t i = 0; i < pages.size(); ++i) CHECK(cache.page_references(pages[i]) == references[i]);

    // A write by the fork into the shared half-full last page copies exactly
    // that page; the parent keeps its rows.
    append_tokens(cache, f, {7});
    CHECK(cache.statistics().copies == copies + 1);
    CHECK(cache.pages(f)[2] != pages[2]);
    CHECK(cache.pages(f)[0] == pages[0]);
    CHECK(row_bytes(cache, a) == rows_a);
    // A write into a full page that is still indexed (held by a) still copies it.
    const std::vector<float> key(row, 3.0f), value(row, 4.0f);
    cache.write(f, 0, 1, key, value, 1);
    CHECK(cache.statistics().copies == copies + 2);
    CHECK(row_bytes(cache, a) == rows_a);
}

TEST_CASE("clear_prefix_cache empties the host and disk tiers of prefix pages, not of swapped sequences") {
    const auto directory = std::filesystem::temp_directory_path() / "kvcache_prefix_clear_test";
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory);
    cache_type cache(layers, 6, page, true);
    cache.attach_host_tier(6);
    cache.attach_disk_tier(directory.string(), 8);

    // A swapped-out sequence in the host tier that must survive.
    const auto held_prompt = tokens_from(50, page + 1);
    const auto held = cache.add_sequence();
    append_tokens(cache, held, held_prompt);
    const auto held_rows = row_bytes(cache, held);
    cache.swap_out(held);
    // Three finished prompts of 4 pages each through a pool of 6 pages: the
    // older ones spill to the host tier and then to disk.
    std::vector<std::vector<std::int32_t>> prompts;
    for (int p = 0; p < 3; ++p) {
        prompts.push_back(tokens_from(1000 * (p + 1), 4 * page));
        const auto id = cache.add_sequence();
        append_tokens(cache, id, prompts.back());
        cache.remove_sequence(id);
    }
    auto st = cache.statistics();
    REQUIRE(st.pages_evictable > 0);
    REQUIRE(st.host_pages_cached > 0);
    REQUIRE(st.disk_pages_used > 0);
    REQUIRE(files_in(directory.string()) == st.disk_pages_used);
    const int pool = st.pages_evictable, host = st.host_pages_cached, disk = st.disk_pages_used;
    const int host_used = st.host_pages_used;

    const kvcache::cleared_prefix_pages cleared = cache.clear_prefix_cache();
    CHECK(cleared.pool == pool);
    CHECK(cleared.host == host);
    CHECK(cleared.disk == disk);
    st = cache.statistics();
    CHECK(st.pages_free == 6);
    CHECK(st.host_pages_cached == 0);
    CHECK(st.host_pages_used == host_used);  // the swapped sequence's pages
    CHECK(st.disk_pages_used == 0);
    CHECK(files_in(directory.string()) == 0);

    // No tier serves any of the prompts now.
    for (const auto& prompt : prompts) {
        const auto id = cache.add_sequence();
        CHECK(cache.match_prefix(id, lookup_of(prompt)) == 0);
        cache.remove_sequence(id);
    }
    CHECK(cache.statistics().host_prefix_hit_pages == 0);
    CHECK(cache.statistics().disk_prefix_hit_pages == 0);

    // The swapped sequence reads and comes back bit for bit.
    CHECK(row_bytes(cache, held) == held_rows);
    cache.swap_in(held);
    CHECK(row_bytes(cache, held) == held_rows);
    std::filesystem::remove_all(directory);
}
