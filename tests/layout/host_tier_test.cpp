// The paged cache's host tier: swap_out/swap_in move a sequence's pages to
// host memory and back; shared pages are held once in either tier; refused
// operations change nothing; and a randomised run of every operation against
// a model of what each sequence holds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iterator>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cache_test_support.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/paged_cache.hpp"

namespace {

using heads = kvcache::head_config<2, 1, 8>;
using cache_type = kvcache::paged_cache<float, heads>;
constexpr int page = 4, layers = 2;
constexpr int row = heads::kv_heads() * heads::head_dim;

std::vector<float> rows_of(const std::vector<std::int32_t>& tokens, int first, int layer, bool is_value) {
    return test_support::token_rows(tokens, first, layer, is_value, row);
}

/// Writes the rows of `tokens` (rows_of) from position `first` on, in every layer.
/// @tparam Cache a paged_cache of these heads, in any memory policy
template <class Cache>
void write_tokens(Cache& cache, kvcache::sequence_id id, const std::vector<std::int32_t>& tokens, int first) {
    for (int l = 0; l < layers; ++l) {
        const auto keys = rows_of(tokens, first, l, false), values = rows_of(tokens, first, l, true);
        cache.write(id, l, first, keys, values, static_cast<int>(tokens.size()));
    }
}

/// Appends tokens to every layer (reserved with the token ids, for the prefix cache).
/// @tparam Cache a paged_cache of these heads, in any memory policy
template <class Cache>
void append_tokens(Cache& cache, kvcache::sequence_id id, const std::vector<std::int32_t>& tokens) {
    write_tokens(cache, id, tokens, cache.begin_append(id, static_cast<int>(tokens.size()), tokens));
}

/// Every row of every layer of a sequence equals what its tokens give.
/// @tparam Cache a paged_cache of these heads, in any memory policy
template <class Cache>
void check_rows(const Cache& cache, kvcache::sequence_id id, const std::vector<std::int32_t>& tokens) {
    REQUIRE(cache.length(id) == static_cast<int>(tokens.size()));
    const int n = cache.length(id);
    for (int l = 0; l < layers; ++l) {
        std::vector<float> keys(std::size_t(n) * row), values(keys.size());
        cache.read(id, l, 0, n, keys, values);
        INFO("sequence " << id << ", layer " << l);
        CHECK(keys == rows_of(tokens, 0, l, false));
        CHECK(values == rows_of(tokens, 0, l, true));
    }
}

std::vector<std::int32_t> tokens_from(int first, int n) {
    std::vector<std::int32_t> out(n);
    for (int i = 0; i < n; ++i) out[i] = first + i;
    return out;
}

}  // namespace

TEST_CASE("swap_out frees the pool, refuses attention, and swap_in restores every row") {
    cache_type cache(layers, 8, page);
    cache.attach_host_tier(6);
    const auto a = cache.add_sequence(), b = cache.add_sequence();
    const auto ta = tokens_from(10, 10), tb = tokens_from(50, 7);
    append_tokens(cache, a, ta);
    append_tokens(cache, b, tb);
    const int used = cache.statistics().pages_used;
    cache.swap_out(a);
    CHECK(cache.swapped_out(a));
    const auto out = cache.statistics();
    CHECK(out.pages_used == used - 3);
    CHECK(out.host_pages_used == 3);
    CHECK(out.pages_swapped_out == 3);
    CHECK(out.bytes_swapped_out == std::size_t(3) * layers * 2 * page * row * sizeof(float));
    CHECK(out.sequences_swapped_out == 1);
    // The swapped sequence cannot be attended to, written or extended; the message says what to do.
    CHECK_THROWS_WITH_AS(cache.view(0, {b, a}),
                         doctest::Contains("cannot attend to sequence 0: it is swapped out to the host tier (swap_in(0) first)"),
                         kvcache::error);
    CHECK_THROWS_AS((void)cache.plan({a}, {1}), kvcache::error);
    CHECK_THROWS_AS(cache.begin_append(a, 1), kvcache::error);
    CHECK_THROWS_AS(cache.truncate(a, 2), kvcache::error);
    CHECK_THROWS_AS(cache.swap_out(a), kvcache::error);
    CHECK_THROWS_WITH_AS(cache.swap_in(b), doctest::Contains("cannot swap in sequence 1: it is not swapped out"), kvcache::error);
    CHECK(cache.length(a) == 10);
    check_rows(cache, a, ta);  // read() serves a swapped sequence from the tier
    check_rows(cache, b, tb);
    // Another sequence takes the freed pages; a comes back to other pages.
    const auto c = cache.add_sequence();
    const auto tc = tokens_from(90, 12);
    append_tokens(cache, c, tc);
    cache.swap_in(a);
    CHECK(!cache.swapped_out(a));
    CHECK(cache.statistics().host_pages_used == 0);
    check_rows(cache, a, ta);
    check_rows(cache, c, tc);
    const auto view = cache.view(0, {a});
    CHECK(view.key(0, 0, 9) == view.keys + std::int64_t(cache.pages(a)[2]) * cache.page_elements() + 1 * 8);
    append_tokens(cache, a, tokens_from(200, 2));  // it grows again after coming back
    auto extended = ta;
    for (auto t : tokens_from(200, 2)) extended.push_back(t);
    check_rows(cache, a, extended);
}

TEST_CASE("pages shared by forks are held once in the host tier and come back shared") {
    cache_type cache(layers, 8, page, false);
    cache.attach_host_tier(8);
    const auto parent = cache.add_sequence();
    const auto tokens = tokens_from(1, 3 * page);
    append_tokens(cache, parent, tokens);
    const auto child = cache.fork(parent);
    cache.swap_out(parent);
    CHECK(cache.statistics().pages_used == 3);  // the child still holds them
    cache.swap_out(child);
    auto st = cache.statistics();
    CHECK(st.host_pages_used == 3);
    CHECK(st.pages_swapped_out == 3);  // the child's pages were the parent's copies
    CHECK(st.swap_copies_avoided == 3);
    CHECK(st.pages_used == 0);
    cache.swap_in(child);
    cache.swap_in(parent);
    st = cache.statistics();
    CHECK(st.pages_used == 3);
    CHECK(st.pages_swapped_in == 3);
    CHECK(st.host_pages_used == 0);
    for (int i = 0; i < 3; ++i) {
        CHECK(cache.pages(parent)[i] == cache.pages(child)[i]);
        CHECK(cache.page_references(cache.pages(parent)[i]) == 2);
    }
    // A write after coming back still copies on write: the two stay independent.
    append_tokens(cache, child, tokens_from(300, 1));
    check_rows(cache, parent, tokens);
    // A swapped sequence forks in the tier.
    cache.swap_out(parent);
    const auto grandchild = cache.fork(parent);
    CHECK(cache.swapped_out(grandchild));
    CHECK(cache.statistics().host_pages_used == 3);
    cache.swap_in(grandchild);
    check_rows(cache, grandchild, tokens);
    cache.remove_sequence(parent);  // removing a swapped sequence gives its host pages back
    CHECK(cache.statistics().host_pages_used == 0);
}

TEST_CASE("a page still cached in the pool comes back without a copy; one written since does not") {
    cache_type cache(layers, 8, page, false);
    cache.attach_host_tier(4);
    const auto a = cache.add_sequence();
    const auto ta = tokens_from(7, 6);  // one full page and a half-full one
    append_tokens(cache, a, ta);
    const auto twin = cache.fork(a);  // holds a's pages while a is out
    cache.swap_out(a);
    cache.swap_in(a);
    auto st = cache.statistics();
    CHECK(st.pages_swapped_in == 0);
    CHECK(st.swap_copies_avoided == 2);
    // The fork writes into the shared half page (copy on write: a's stays), then a goes out and back.
    cache.truncate(twin, 5);
    append_tokens(cache, twin, tokens_from(400, 1));
    cache.swap_out(a);
    cache.remove_sequence(twin);
    cache.swap_in(a);
    check_rows(cache, a, ta);
    // a writes into its own half page after a swap round trip (a kernel's write, which the
    // owner sees only as the plan's reservation): the tier's copy is stale and must not be
    // reused when a goes out again.
    cache.swap_out(a);
    const auto other = cache.fork(a);  // keeps the host pages alive
    cache.swap_in(a);
    cache.truncate(a, 5);
    const auto ta2 = [&] {
        auto t = std::vector<std::int32_t>(ta.begin(), ta.begin() + 5);
        t.push_back(999);
        return t;
    }();
    {  // the new token's rows come through a plan and the append kernel, as in a decode step
        const auto plan = cache.plan({a}, {1});
        const std::vector<int> offsets = {0, 1};
        for (int l = 0; l < layers; ++l) {
            const auto keys = rows_of({999}, 5, l, false), values = rows_of({999}, 5, l, true);
            kvcache::reference_backend{}.append(kvcache::append_params(plan.view(l), keys, values, offsets));
        }
    }
    cache.swap_out(a);
    cache.swap_in(a);
    check_rows(cache, a, ta2);
    cache.swap_in(other);
    check_rows(cache, other, ta);
}

TEST_CASE("a tier or a pool too small refuses with nothing changed") {
    cache_type cache(layers, 6, page);
    const auto a = cache.add_sequence();
    append_tokens(cache, a, tokens_from(3, 9));  // 3 pages
    CHECK_THROWS_WITH_AS(cache.swap_out(a),
                         doctest::Contains("cannot swap out sequence 0: the cache has no host tier (attach_host_tier(pages) first)"),
                         kvcache::error);
    cache.attach_host_tier(2);
    const std::string before = test_support::snapshot(cache);
    CHECK_THROWS_WITH_AS(cache.swap_out(a), doctest::Contains("swapping out sequence 0 needs 3 host-tier pages; 2 of 2 are free"),
                         kvcache::error);
    CHECK(test_support::snapshot(cache) == before);
    CHECK(!cache.swapped_out(a));
    cache.attach_host_tier(3);
    cache.swap_out(a);
    CHECK_THROWS_AS(cache.attach_host_tier(8), kvcache::error);  // a is in the tier
    const auto b = cache.add_sequence();
    // b takes the 4 free pages; a's two full pages stay cached in the pool (published when it
    // went out), so coming back needs only its third page copied, and none is left.
    append_tokens(cache, b, tokens_from(70, 4 * page));
    const std::string swapped = test_support::snapshot(cache);
    try {
        cache.swap_in(a);
        FAIL("swap_in should not fit");
    } catch (const kvcache::error& e) {
        CHECK(e.code() == kvcache::error_code::capacity_exceeded);
        INFO(std::string(e.what()));
        CHECK(std::string(e.what()).find("swapping in sequence 0 needs 1 pages; the pool of 6 has 0 free and 0 evictable") !=
              std::string::npos);
    }
    CHECK(test_support::snapshot(cache) == swapped);
    CHECK(cache.swapped_out(a));
    cache.remove_sequence(b);
    const auto copied_before = cache.statistics().pages_swapped_in;
    cache.swap_in(a);
    CHECK(cache.statistics().pages_swapped_in == copied_before + 1);  // the cached two came back as they were
    check_rows(cache, a, tokens_from(3, 9));
}

namespace {
std::string fresh_directory(const std::string& name);

/// The cache's snapshot and every page file of its disk tier (name and
/// contents), so a refused call is seen to have written or deleted no file.
std::string tier_snapshot(const cache_type& cache, const std::string& directory) {
    std::ostringstream out;
    out << test_support::snapshot(cache) << "|files";
    std::map<std::string, std::string> files;  // sorted: the directory's order is not
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
        std::ifstream in(entry.path(), std::ios::binary);
        files[entry.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    for (const auto& file : files) out << ";" << file.first << ":" << std::hash<std::string>{}(file.second);
    return out.str();
}
std::filesystem::path page_file(const std::string& directory, const std::vector<std::int32_t>& tokens, int index);
int files_in(const std::string& directory);
}  // namespace

TEST_CASE("randomised: swap, fork, prefix hits, truncate and removal against a model of every sequence") {
    std::uint64_t host_hits = 0, disk_writes = 0;
    for (const unsigned seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
        INFO("seed " << seed);
        std::mt19937 random(seed);
        const auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(random); };
        cache_type cache(layers, 14, page, true);
        cache.attach_host_tier(10);
        const std::string directory = fresh_directory("random_" + std::to_string(seed));
        cache.attach_disk_tier(directory, 6);
        std::map<kvcache::sequence_id, std::vector<std::int32_t>> model;
        const std::vector<std::vector<std::int32_t>> prompts = {tokens_from(1000, 9), tokens_from(2000, 5),
                                                                tokens_from(1000, 4)};
        int refused = 0, swaps = 0;
        for (int step = 0; step < 400; ++step) {
            std::vector<kvcache::sequence_id> ids;
            for (const auto& entry : model) ids.push_back(entry.first);
            const auto any = [&] { return ids[pick(int(ids.size()))]; };
            const int op = ids.empty() ? 0 : pick(8);
            const std::string before = tier_snapshot(cache, directory);
            try {
                if (op == 0) {  // a new request, sharing a cached prompt prefix when one matches
                    const auto id = cache.add_sequence();
                    model[id] = {};
                    auto tokens = prompts[pick(3)];
                    const int matched = cache.match_prefix(id, tokens);
                    model[id].assign(tokens.begin(), tokens.begin() + matched);
                    tokens.erase(tokens.begin(), tokens.begin() + matched);
                    try {
                        append_tokens(cache, id, tokens);
                    } catch (const kvcache::error&) {
                        cache.remove_sequence(id);  // the request does not fit: drop it
                        model.erase(id);
                        throw;
                    }
                    model[id].insert(model[id].end(), tokens.begin(), tokens.end());
                } else if (op == 1 || op == 2) {  // a decode or prefill step
                    const auto id = any();
                    if (cache.swapped_out(id)) continue;
                    const auto tokens = tokens_from(3000 + step * 8, 1 + pick(5));
                    if (op == 1) {
                        append_tokens(cache, id, tokens);
                    } else {  // through a plan and the append kernel: the owner sees only the reservation
                        const auto plan = cache.plan_with_tokens({id}, {tokens});
                        const std::vector<int> offsets = {0, int(tokens.size())};
                        const int first = plan.first_new_position(0);
                        for (int l = 0; l < layers; ++l) {
                            const auto keys = rows_of(tokens, first, l, false), values = rows_of(tokens, first, l, true);
                            kvcache::reference_backend{}.append(kvcache::append_params(plan.view(l), keys, values, offsets));
                        }
                    }
                    model[id].insert(model[id].end(), tokens.begin(), tokens.end());
                } else if (op == 3) {
                    const auto id = any();
                    if (cache.swapped_out(id)) {
                        cache.swap_in(id);
                    } else {
                        cache.swap_out(id);
                    }
                    ++swaps;
                } else if (op == 4) {
                    const auto id = any();
                    model[cache.fork(id)] = model[id];
                } else if (op == 5) {
                    const auto id = any();
                    if (cache.swapped_out(id)) continue;
                    const int length = pick(int(model[id].size()) + 1);
                    cache.truncate(id, length);
                    model[id].resize(length);
                } else if (op == 6) {
                    const auto id = any();
                    cache.remove_sequence(id);
                    model.erase(id);
                } else {  // swap in what fits, each call all or nothing
                    for (auto id : ids) {
                        if (!cache.swapped_out(id)) continue;
                        const std::string untouched = tier_snapshot(cache, directory);
                        try {
                            cache.swap_in(id);
                            ++swaps;
                        } catch (const kvcache::error& e) {
                            REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
                            CHECK(tier_snapshot(cache, directory) == untouched);
                            ++refused;
                        }
                    }
                }
            } catch (const kvcache::error& e) {
                ++refused;
                REQUIRE(e.code() == kvcache::error_code::capacity_exceeded);
                // Only a fresh request is dropped; anything else left the cache as it was.
                INFO("step " << step << ", operation " << op << ": " << std::string(e.what()));
                if (op != 0) CHECK(tier_snapshot(cache, directory) == before);
            }
            for (const auto& entry : model) check_rows(cache, entry.first, entry.second);
            const auto st = cache.statistics();
            REQUIRE(st.host_pages_used <= st.host_pages_total);
            REQUIRE(st.pages_used + st.pages_free + st.pages_evictable == st.pages_total);
            // A tier is asked only for what the one above missed; each lookup there is a hit, a miss,
            // or a find left there for lack of room.
            REQUIRE(st.host_prefix_hit_pages + st.host_prefix_miss_pages <= st.pool_prefix_miss_pages);
            REQUIRE(st.disk_prefix_hit_pages + st.disk_prefix_miss_pages <= st.host_prefix_miss_pages);
        }
        CHECK(swaps > 20);
        CHECK(refused > 0);  // the pool and the tier ran out at times
        const auto run = cache.statistics();
        CHECK(run.pages_spilled > 0);  // evicted prefix pages went to the tier
        host_hits += run.host_prefix_hit_pages;
        disk_writes += run.pages_written_to_disk;
        // Everything back, then everything removed: both tiers are empty again.
        for (auto& entry : model)
            if (cache.swapped_out(entry.first)) {
                try {
                    cache.swap_in(entry.first);
                } catch (const kvcache::error&) {
                }
            }
        for (auto& entry : model) cache.remove_sequence(entry.first);
        const auto st = cache.statistics();
        CHECK(st.host_pages_used == 0);
        CHECK(st.pages_used == 0);
    }
    CHECK(host_hits > 0);    // some later requests found their prefix in the tier
    CHECK(disk_writes > 0);  // and the tier overflowed to disk at times
}

TEST_CASE("cached prefix pages the pool evicts spill to the host tier, and a match brings them back") {
    for (const bool with_tier : {false, true}) {
        INFO((with_tier ? "with a host tier" : "without a host tier (evicted pages are lost)"));
        cache_type cache(layers, 6, page, true);
        if (with_tier) cache.attach_host_tier(4);
        const auto prompt = tokens_from(500, 3 * page + 1);  // three full pages and one more token
        const auto a = cache.add_sequence();
        append_tokens(cache, a, prompt);
        cache.remove_sequence(a);  // its three full pages stay cached in the pool
        CHECK(cache.statistics().pages_evictable == 3);
        const auto b = cache.add_sequence();
        append_tokens(cache, b, tokens_from(900, 6 * page));  // every page: the cached ones are evicted
        const auto st = cache.statistics();
        CHECK(st.evictions == 3);
        CHECK(st.pages_spilled == (with_tier ? 3u : 0u));
        CHECK(st.host_pages_cached == (with_tier ? 3 : 0));
        CHECK(st.host_pages_used == 0);  // spilled pages are not held by anyone
        cache.remove_sequence(b);
        const auto c = cache.add_sequence();
        const std::vector<std::int32_t> lookup(prompt.begin(), prompt.end() - 1);
        const int matched = cache.match_prefix(c, lookup);
        CHECK(matched == (with_tier ? 3 * page : 0));
        if (!with_tier) continue;
        CHECK(cache.statistics().host_prefix_hit_pages == 3);
        const std::vector<std::int32_t> rest(prompt.begin() + matched, prompt.end());
        append_tokens(cache, c, rest);
        check_rows(cache, c, prompt);  // the rows came back from the tier
        // The pages are cached in the pool again: another request shares them without the tier.
        const auto d = cache.add_sequence();
        CHECK(cache.match_prefix(d, lookup) == 3 * page);
        CHECK(cache.statistics().host_prefix_hit_pages == 3);
        CHECK(cache.pages(d)[0] == cache.pages(c)[0]);
        // Bytes moved and hits per tier: three pages each way, then three hits the pool served itself.
        const auto moved = cache.statistics();
        const std::size_t page_bytes = cache.page_bytes();
        CHECK(moved.bytes_spilled == moved.pages_spilled * page_bytes);  // b's pages spilled too as c's came back
        CHECK(moved.bytes_brought_back_from_host == 3 * page_bytes);
        CHECK(moved.pool_prefix_hit_pages == 3);
        CHECK(moved.prefix_hit_pages == 6);
        CHECK(moved.host_bytes_total == 4 * page_bytes);
        CHECK(moved.host_bytes_cached == std::size_t(moved.host_pages_cached) * page_bytes);
    }
}

TEST_CASE("with every host-tier page held by swapped sequences, an evicted prefix page goes to disk, not away") {
    const std::string directory = fresh_directory("held_tier");
    cache_type cache(layers, 3, page, true);
    cache.attach_host_tier(2);
    cache.attach_disk_tier(directory, 4);
    const auto swapped = cache.add_sequence();
    const auto swapped_tokens = tokens_from(10, 2 * page);
    append_tokens(cache, swapped, swapped_tokens);
    cache.swap_out(swapped);  // both host-tier pages held
    cache.clear_prefix_cache();  // the pool's cached copies of the swapped pages go: only the prompt's page stays
    REQUIRE(cache.statistics().host_pages_used == 2);
    const auto prompt = tokens_from(300, page);
    const auto a = cache.add_sequence();
    append_tokens(cache, a, prompt);
    cache.remove_sequence(a);  // its page stays cached in the pool
    REQUIRE(cache.statistics().pages_evictable == 1);
    const auto b = cache.add_sequence();
    append_tokens(cache, b, tokens_from(700, 3 * page));  // the whole pool: the cached page is evicted
    const auto st = cache.statistics();
    CHECK(st.evictions == 1);
    CHECK(st.pages_spilled == 0);  // the host tier had no page to give
    CHECK(st.pages_written_to_disk == 1);
    CHECK(files_in(directory) == 1);
    CHECK(std::filesystem::exists(page_file(directory, prompt, 0)));
    cache.remove_sequence(b);
    const auto c = cache.add_sequence();
    CHECK(cache.match_prefix(c, prompt) == page);
    CHECK(cache.statistics().disk_prefix_hit_pages == 1);
    check_rows(cache, c, prompt);
    cache.swap_in(swapped);
    check_rows(cache, swapped, swapped_tokens);
}

TEST_CASE("a page file that cannot be written evicts nothing from the disk tier") {
    // A pool of one page, a host tier of one, a disk tier of one: each one-page
    // prompt cached in turn pushes the one before it to the host tier and the
    // one before that to disk (as in the LRU case below).
    const std::string directory = fresh_directory("failed_write");
    cache_type cache(layers, 1, page, true);
    cache.attach_host_tier(1);
    cache.attach_disk_tier(directory, 1);
    std::vector<std::vector<std::int32_t>> prompts;
    for (int p = 0; p < 4; ++p) prompts.push_back(tokens_from(100 * (p + 1), page));
    const auto cache_prompt = [&](int p) {
        const auto id = cache.add_sequence();
        append_tokens(cache, id, prompts[p]);
        cache.remove_sequence(id);
    };
    for (int p = 0; p < 3; ++p) cache_prompt(p);
    REQUIRE(std::filesystem::exists(page_file(directory, prompts[0], 0)));
    // A directory where prompt 1's file is written first makes its write fail.
    const auto blocker = page_file(directory, prompts[1], 0).string() + ".partial";
    std::filesystem::create_directory(blocker);
    cache_prompt(3);  // prompt 2 to the host tier, prompt 1 to disk: refused
    const auto st = cache.statistics();
    CHECK(st.disk_write_failures == 1);
    CHECK(st.pages_written_to_disk == 1);
    CHECK(st.disk_pages_used == 1);
    CHECK(std::filesystem::exists(page_file(directory, prompts[0], 0)));  // the full tier kept its page
    CHECK(!std::filesystem::exists(page_file(directory, prompts[1], 0)));
    std::filesystem::remove(blocker);
    const auto a = cache.add_sequence();
    CHECK(cache.match_prefix(a, prompts[0]) == page);
    CHECK(cache.statistics().disk_prefix_hit_pages == 1);
    check_rows(cache, a, prompts[0]);
}

TEST_CASE("a swap out may take the tier's spilled pages, least recently spilled first") {
    cache_type cache(layers, 4, page, true);
    cache.attach_host_tier(4);
    const auto a = cache.add_sequence();
    append_tokens(cache, a, tokens_from(10, 2 * page + 1));
    cache.remove_sequence(a);  // two cached full pages
    const auto b = cache.add_sequence();
    append_tokens(cache, b, tokens_from(40, 4 * page));  // evicts and spills both
    REQUIRE(cache.statistics().host_pages_cached == 2);
    cache.swap_out(b);  // needs all four host pages: two free, two holding spilled pages
    const auto st = cache.statistics();
    CHECK(st.host_pages_used == 4);
    CHECK(st.host_pages_cached == 0);
    cache.swap_in(b);
    check_rows(cache, b, tokens_from(40, 4 * page));
}

namespace {
/// A fresh, empty directory for a disk tier under the system's temporary directory.
std::string fresh_directory(const std::string& name) {
    const auto path = std::filesystem::temp_directory_path() / ("kvcache_host_tier_test_" + name);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    return path.string();
}

/// Caches `pages_each` pages of three prompts one after the other in a pool
/// of 4 pages, so each evicts the previous one's pages (spilled down the tiers).
std::vector<std::vector<std::int32_t>> fill_through_tiers(cache_type& cache) {
    std::vector<std::vector<std::int32_t>> prompts;
    for (int p = 0; p < 3; ++p) {
        prompts.push_back(tokens_from(1000 * (p + 1), 4 * page));
        const auto id = cache.add_sequence();
        append_tokens(cache, id, prompts.back());
        cache.remove_sequence(id);
    }
    return prompts;
}

/// The disk tier's file for page `index` of tokens (named by its chained hash).
std::filesystem::path page_file(const std::string& directory, const std::vector<std::int32_t>& tokens, int index) {
    std::uint64_t hash = kvcache::detail::root_hash;
    for (int i = 0; i <= index; ++i) hash = kvcache::detail::chain_hash(hash, tokens.data() + std::size_t(i) * page, page);
    char name[40];
    std::snprintf(name, sizeof name, "page-%016llx.kvcache", static_cast<unsigned long long>(hash));
    return std::filesystem::path(directory) / name;
}

/// Regular files in a directory.
int files_in(const std::string& directory) {
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(directory)) files += entry.is_regular_file();
    return files;
}

/// Appends n positions whose token ids the cache is not told: their pages are
/// never published, so removing the sequence frees them (a filler that makes
/// the pool evict its cached pages).
void append_anonymous(cache_type& cache, kvcache::sequence_id id, int n) {
    write_tokens(cache, id, tokens_from(90000, n), cache.begin_append(id, n));
}

/// Rows [0, n) of every layer of a sequence equal what tokens give there.
void check_first_rows(const cache_type& cache, kvcache::sequence_id id, const std::vector<std::int32_t>& tokens, int n) {
    if (n == 0) return;
    const std::vector<std::int32_t> prefix(tokens.begin(), tokens.begin() + n);
    for (int l = 0; l < layers; ++l) {
        std::vector<float> keys(std::size_t(n) * row), values(keys.size());
        cache.read(id, l, 0, n, keys, values);
        INFO("sequence " << id << ", layer " << l << ", rows [0, " << n << ")");
        CHECK(keys == rows_of(prefix, 0, l, false));
        CHECK(values == rows_of(prefix, 0, l, true));
    }
}
}  // namespace

TEST_CASE("the host tier's evicted spilled pages go to disk files, and a match reads them back") {
    const std::string directory = fresh_directory("disk");
    {
        cache_type cache(layers, 4, page, true);
        cache.attach_host_tier(4);
        CHECK_THROWS_AS(cache_type(layers, 4, page).attach_disk_tier(directory, 4), kvcache::error);  // no host tier
        CHECK_THROWS_WITH_AS(cache.attach_disk_tier(directory + "/missing", 4),
                             doctest::Contains("is not a writable directory (it must exist)"), kvcache::error);
        cache.attach_disk_tier(directory, 8);
        const auto prompts = fill_through_tiers(cache);  // prompt 0: disk, prompt 1: host, prompt 2: pool
        auto st = cache.statistics();
        CHECK(st.pages_written_to_disk == 4);
        CHECK(st.disk_pages_used == 4);
        CHECK(st.bytes_written_to_disk > 0);
        int files = 0;
        for (const auto& entry : std::filesystem::directory_iterator(directory)) files += entry.is_regular_file();
        CHECK(files == 4);
        const auto a = cache.add_sequence();
        const std::vector<std::int32_t> lookup(prompts[0].begin(), prompts[0].end() - 1);
        CHECK(cache.match_prefix(a, lookup) == 3 * page);  // all but the last page (never matched: its last token)
        st = cache.statistics();
        CHECK(st.disk_prefix_hit_pages == 3);
        append_tokens(cache, a, {prompts[0].begin() + 3 * page, prompts[0].end()});
        check_rows(cache, a, prompts[0]);
        cache.remove_sequence(a);
    }
    int left = 0;  // the tier's files go with it
    for (const auto& entry : std::filesystem::directory_iterator(directory)) left += entry.is_regular_file();
    CHECK(left == 0);
}

TEST_CASE("a damaged or missing page file is a miss, never wrong rows") {
    // One byte of the rows flipped; the file cut short; bytes appended after
    // the checksum; the record claiming one position more than a page.
    for (const std::string damage : {"flipped", "truncated", "appended", "longer"}) {
        INFO("page file " << damage);
        const std::string directory = fresh_directory("damaged-" + damage);
        cache_type cache(layers, 4, page, true);
        cache.attach_host_tier(4);
        cache.attach_disk_tier(directory, 8);
        const auto prompts = fill_through_tiers(cache);
        int files = 0;
        for (const auto& entry : std::filesystem::directory_iterator(directory)) files += entry.is_regular_file();
        REQUIRE(files == 4);
        // Damage the file of prompt 0's second page (named by its chained hash): flip one byte of its rows.
        const std::uint64_t first = kvcache::detail::chain_hash(kvcache::detail::root_hash, prompts[0].data(), page);
        const std::uint64_t second = kvcache::detail::chain_hash(first, prompts[0].data() + page, page);
        char name[40];
        std::snprintf(name, sizeof name, "page-%016llx.kvcache", static_cast<unsigned long long>(second));
        const auto path = std::filesystem::path(directory) / name;
        REQUIRE(std::filesystem::exists(path));
        const auto st0 = cache.statistics();
        const auto size = std::filesystem::file_size(path);
        if (damage == "truncated") {
            std::filesystem::resize_file(path, size - 9);
        } else if (damage == "appended") {
            std::ofstream(path, std::ios::binary | std::ios::app) << "abc";
        } else {
            // The byte in the middle of the rows, or the record's count of present
            // positions (after the 52-byte header and the record's length).
            const auto at = static_cast<std::streamoff>(damage == "flipped" ? size / 2 : 56);
            std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
            char byte = 0;
            f.seekg(at);
            f.read(&byte, 1);
            byte = static_cast<char>(damage == "flipped" ? byte ^ 0x40 : byte + 1);
            f.seekp(at);
            f.write(&byte, 1);
        }
        const auto a = cache.add_sequence();
        const std::vector<std::int32_t> lookup(prompts[0].begin(), prompts[0].end() - 1);
        const int matched = cache.match_prefix(a, lookup);
        const auto st = cache.statistics();
        CHECK(matched == page);  // the first page read back, the match ends at the damaged second
        CHECK(st.disk_pages_refused == st0.disk_pages_refused + 1);
        CHECK(st.disk_prefix_hit_pages == std::uint64_t(matched / page));
        // Pages 0 and 1 were asked of the pool and the host tier, neither held them;
        // the disk refused page 1 (a miss), and page 2 was never looked up.
        CHECK(st.pool_prefix_miss_pages == st0.pool_prefix_miss_pages + 2);
        CHECK(st.host_prefix_miss_pages == st0.host_prefix_miss_pages + 2);
        CHECK(st.disk_prefix_miss_pages == st0.disk_prefix_miss_pages + 1);
        const std::vector<std::int32_t> rest(prompts[0].begin() + matched, prompts[0].end());
        append_tokens(cache, a, rest);  // the rest is recomputed
        check_rows(cache, a, prompts[0]);
    }
    // A page file deleted behind the cache's back: the next test case.
}

TEST_CASE("a page file deleted behind the cache's back ends the match before that page") {
    for (const int missing : {0, 1, 2}) {
        INFO("the file of page " << missing << " of prompt 0 deleted");
        const std::string directory = fresh_directory("deleted_" + std::to_string(missing));
        cache_type cache(layers, 4, page, true);
        cache.attach_host_tier(4);
        cache.attach_disk_tier(directory, 8);
        // Prompt 0's four pages live on disk only: the pool holds prompt 2, the host tier prompt 1.
        const auto prompts = fill_through_tiers(cache);
        const auto st0 = cache.statistics();
        REQUIRE(st0.disk_pages_used == 4);
        REQUIRE(files_in(directory) == 4);
        REQUIRE(st0.disk_pages_refused == 0);
        const auto path = page_file(directory, prompts[0], missing);
        REQUIRE(std::filesystem::remove(path));
        const std::vector<std::int32_t> lookup(prompts[0].begin(), prompts[0].end() - 1);  // three full pages
        const auto a = cache.add_sequence();
        const int matched = cache.match_prefix(a, lookup);
        const auto st = cache.statistics();
        CHECK(matched == missing * page);  // the pages before the missing one, read from their files
        CHECK(st.disk_pages_refused == st0.disk_pages_refused + 1);
        CHECK(st.disk_prefix_hit_pages == st0.disk_prefix_hit_pages + std::uint64_t(missing));
        CHECK(st.disk_prefix_miss_pages == st0.disk_prefix_miss_pages + 1);
        // Every page up to the missing one was asked of the pool and the host tier, neither held it.
        CHECK(st.pool_prefix_miss_pages == st0.pool_prefix_miss_pages + std::uint64_t(missing) + 1);
        CHECK(st.host_prefix_miss_pages == st0.host_prefix_miss_pages + std::uint64_t(missing) + 1);
        CHECK((st.bytes_read_from_disk > st0.bytes_read_from_disk) == (missing > 0));
        CHECK(!std::filesystem::exists(path));
        check_first_rows(cache, a, prompts[0], matched);  // what was matched holds the rows written
        append_tokens(cache, a, {prompts[0].begin() + matched, prompts[0].end()});  // the rest is recomputed
        check_rows(cache, a, prompts[0]);
    }
}

TEST_CASE("the disk tier keeps at most its capacity in files and deletes the least recently used one") {
    // A pool of one page and a host tier of one: each one-page prompt cached in
    // turn pushes the one before it to the host tier and the one before that to disk.
    const std::string directory = fresh_directory("disk_lru");
    cache_type cache(layers, 1, page, true);
    cache.attach_host_tier(1);
    cache.attach_disk_tier(directory, 3);
    std::vector<std::vector<std::int32_t>> prompts;
    for (int p = 0; p < 8; ++p) {
        INFO("after prompt " << p);
        prompts.push_back(tokens_from(100 * (p + 1), page));
        const auto id = cache.add_sequence();
        append_tokens(cache, id, prompts.back());
        cache.remove_sequence(id);
        const int expected = std::min(std::max(p - 1, 0), 3);
        CHECK(files_in(directory) == expected);
        CHECK(cache.statistics().disk_pages_used == expected);
    }
    CHECK(cache.statistics().pages_written_to_disk == 6);  // prompts 0..5
    // Nothing was read back, so the files of the three stored first went first.
    for (int p = 0; p < 6; ++p) {
        INFO("prompt " << p);
        CHECK(std::filesystem::exists(page_file(directory, prompts[p], 0)) == (p >= 3));
    }
    // Reading prompt 3 back makes it the most recently used file. Bringing it
    // into the pool evicts prompt 7 to the host tier, which pushes prompt 6 to
    // disk: the full tier deletes prompt 4's file, the least recently used.
    const auto a = cache.add_sequence();
    CHECK(cache.match_prefix(a, prompts[3]) == page);
    CHECK(cache.statistics().disk_prefix_hit_pages == 1);
    check_rows(cache, a, prompts[3]);
    CHECK(cache.statistics().pages_written_to_disk == 7);
    CHECK(files_in(directory) == 3);
    CHECK(cache.statistics().disk_pages_used == 3);
    CHECK(std::filesystem::exists(page_file(directory, prompts[3], 0)));
    CHECK(!std::filesystem::exists(page_file(directory, prompts[4], 0)));
    CHECK(std::filesystem::exists(page_file(directory, prompts[5], 0)));
    CHECK(std::filesystem::exists(page_file(directory, prompts[6], 0)));
}

TEST_CASE("the host tier evicts its spilled prefix pages least recently used first") {
    cache_type cache(layers, 3, page, true);
    cache.attach_host_tier(2);
    const auto x = tokens_from(100, page), y = tokens_from(200, page), z = tokens_from(300, page);
    for (const auto& prompt : {x, y}) {
        const auto id = cache.add_sequence();
        append_tokens(cache, id, prompt);
        cache.remove_sequence(id);
    }
    const auto filler = cache.add_sequence();
    append_anonymous(cache, filler, 3 * page);  // evicts x, then y: both spilled, x first
    cache.remove_sequence(filler);              // its pages go back to the free list
    REQUIRE(cache.statistics().host_pages_cached == 2);
    REQUIRE(cache.statistics().pages_free == 3);
    // A match brings x back from the tier (into a free page: nothing is evicted),
    // which makes x the tier's most recently used page.
    const auto mx = cache.add_sequence();
    CHECK(cache.match_prefix(mx, x) == page);
    CHECK(cache.statistics().host_prefix_hit_pages == 1);
    CHECK(cache.statistics().pages_spilled == 2);
    // z spills into the full tier: y, spilled after x but used before it, goes.
    const auto iz = cache.add_sequence();
    append_tokens(cache, iz, z);
    cache.remove_sequence(iz);
    const auto filler2 = cache.add_sequence();
    append_anonymous(cache, filler2, 2 * page);  // a free page, then z evicted (x is held)
    cache.remove_sequence(filler2);
    CHECK(cache.statistics().pages_spilled == 3);
    CHECK(cache.statistics().host_pages_cached == 2);
    // x is still in the tier: evicting its pool copy spills nothing new.
    cache.remove_sequence(mx);
    const auto filler3 = cache.add_sequence();
    append_anonymous(cache, filler3, 3 * page);
    cache.remove_sequence(filler3);
    CHECK(cache.statistics().pages_spilled == 3);
    const auto before = cache.statistics();
    const auto qy = cache.add_sequence(), qx = cache.add_sequence(), qz = cache.add_sequence();
    CHECK(cache.match_prefix(qy, y) == 0);  // y is gone from every tier
    CHECK(cache.statistics().host_prefix_miss_pages == before.host_prefix_miss_pages + 1);
    CHECK(cache.match_prefix(qx, x) == page);
    CHECK(cache.match_prefix(qz, z) == page);
    CHECK(cache.statistics().host_prefix_hit_pages == before.host_prefix_hit_pages + 2);
    check_rows(cache, qx, x);
    check_rows(cache, qz, z);
}

TEST_CASE("pages two prefix hits share are copied to the host tier once and come back shared") {
    cache_type cache(layers, 8, page, true);
    cache.attach_host_tier(8);
    const auto prompt = tokens_from(600, 2 * page);
    {
        const auto a = cache.add_sequence();
        append_tokens(cache, a, prompt);
        cache.remove_sequence(a);  // two cached pages
    }
    const auto s1 = cache.add_sequence(), s2 = cache.add_sequence();
    const auto tail1 = tokens_from(700, 2), tail2 = tokens_from(800, 3);
    REQUIRE(cache.match_prefix(s1, prompt) == 2 * page);
    REQUIRE(cache.match_prefix(s2, prompt) == 2 * page);
    append_tokens(cache, s1, tail1);
    append_tokens(cache, s2, tail2);
    auto whole1 = prompt, whole2 = prompt;
    whole1.insert(whole1.end(), tail1.begin(), tail1.end());
    whole2.insert(whole2.end(), tail2.begin(), tail2.end());
    REQUIRE(cache.pages(s1)[0] == cache.pages(s2)[0]);
    REQUIRE(cache.pages(s1)[1] == cache.pages(s2)[1]);
    REQUIRE(cache.statistics().pages_used == 4);  // two shared, one each of their own
    cache.swap_out(s1);
    auto st = cache.statistics();
    CHECK(st.pages_swapped_out == 3);
    CHECK(st.host_pages_used == 3);
    cache.swap_out(s2);
    st = cache.statistics();
    CHECK(st.pages_swapped_out == 4);     // s2's shared pages were s1's copies
    CHECK(st.swap_copies_avoided == 2);
    CHECK(st.host_pages_used == 4);       // the distinct pages: two shared, two of their own
    CHECK(st.pages_used == 0);
    std::uint64_t copied_in = 0;
    SUBCASE("the pool still caches the shared pages: they come back without a copy") {
        cache.swap_in(s1);
        cache.swap_in(s2);
        copied_in = 2;  // the two own pages
    }
    SUBCASE("the pool reused the shared pages meanwhile: they are copied back once") {
        const auto filler = cache.add_sequence();
        append_anonymous(cache, filler, 8 * page);  // every pool page: the two cached ones evicted
        cache.remove_sequence(filler);
        CHECK(cache.statistics().pages_free == 8);
        cache.swap_in(s1);
        cache.swap_in(s2);
        copied_in = 4;  // s1's three, then s2's own page: its shared two are s1's again
    }
    st = cache.statistics();
    CHECK(st.pages_swapped_in == copied_in);
    CHECK(st.host_pages_used == 0);
    CHECK(st.pages_used == 4);
    for (int i = 0; i < 2; ++i) {
        INFO("page " << i);
        CHECK(cache.pages(s1)[i] == cache.pages(s2)[i]);
        CHECK(cache.page_references(cache.pages(s1)[i]) == 2);
    }
    CHECK(cache.pages(s1)[2] != cache.pages(s2)[2]);
    check_rows(cache, s1, whole1);
    check_rows(cache, s2, whole2);
}

TEST_CASE("a prefix page missed in a tier is counted there, once per tier asked") {
    // The state fill_through_tiers leaves: prompt 0 in disk files, prompt 1 in the
    // host tier, prompt 2 in the pool. Each subcase starts from it afresh.
    cache_type cache(layers, 4, page, true);
    cache.attach_host_tier(4);
    cache.attach_disk_tier(fresh_directory("misses"), 8);
    const auto prompts = fill_through_tiers(cache);
    const auto st0 = cache.statistics();
    REQUIRE(st0.pool_prefix_miss_pages == 0);  // nothing was looked up yet
    const auto lookup_of = [](const std::vector<std::int32_t>& prompt) {
        return std::vector<std::int32_t>(prompt.begin(), prompt.end() - 1);  // three full pages
    };
    const auto a = cache.add_sequence();
    struct expected {
        std::uint64_t pool, host, disk;
    };
    const auto check_misses = [&](expected e) {
        const auto st = cache.statistics();
        CHECK(st.pool_prefix_miss_pages == e.pool);
        CHECK(st.host_prefix_miss_pages == e.host);
        CHECK(st.disk_prefix_miss_pages == e.disk);
    };
    SUBCASE("pages in the pool miss nowhere") {
        CHECK(cache.match_prefix(a, lookup_of(prompts[2])) == 3 * page);
        check_misses({0, 0, 0});
    }
    SUBCASE("pages in the host tier miss in the pool only") {
        CHECK(cache.match_prefix(a, lookup_of(prompts[1])) == 3 * page);
        check_misses({3, 0, 0});
        CHECK(cache.statistics().host_prefix_hit_pages == 3);
    }
    SUBCASE("pages on disk miss in the pool and the host tier") {
        CHECK(cache.match_prefix(a, lookup_of(prompts[0])) == 3 * page);
        check_misses({3, 3, 0});
        CHECK(cache.statistics().disk_prefix_hit_pages == 3);
    }
    SUBCASE("tokens nobody cached miss in every tier, and the walk stops at the first page") {
        CHECK(cache.match_prefix(a, tokens_from(7000, 3 * page)) == 0);
        check_misses({1, 1, 1});
        CHECK(cache.statistics().prefix_queried_pages == st0.prefix_queried_pages + 3);
    }
    SUBCASE("a chain found in the host tier, then a page found nowhere") {
        auto lookup = prompts[1];  // four pages in the host tier
        const auto more = tokens_from(7000, page + 1);
        lookup.insert(lookup.end(), more.begin(), more.end());  // then a fifth full page and one token
        CHECK(cache.match_prefix(a, lookup) == 4 * page);
        // The four pages coming back take the whole 4-page pool, so the fifth
        // is asked of the pool alone: no lower tier is asked for a page that
        // could not come back.
        check_misses({5, 0, 0});
    }
}

TEST_CASE("a pool with no room reads no page file, and the match ends where a page could not come back") {
    cache_type cache(layers, 4, page, true);
    cache.attach_host_tier(4);
    cache.attach_disk_tier(fresh_directory("no_room"), 8);
    const auto prompts = fill_through_tiers(cache);  // prompt 0: disk, prompt 1: host, prompt 2: pool
    const std::vector<std::int32_t> lookup(prompts[0].begin(), prompts[0].end() - 1);  // three full pages on disk
    const auto holder = cache.add_sequence();
    append_tokens(cache, holder, tokens_from(9000, 4 * page));  // every pool page now referenced
    REQUIRE(cache.statistics().pages_free == 0);
    REQUIRE(cache.statistics().pages_evictable == 0);
    const auto before = cache.statistics();
    const auto a = cache.add_sequence();
    CHECK(cache.match_prefix(a, lookup) == 0);
    auto st = cache.statistics();
    CHECK(st.bytes_read_from_disk == before.bytes_read_from_disk);  // nothing could come back, so nothing was read
    CHECK(st.pool_prefix_miss_pages == before.pool_prefix_miss_pages + 1);  // asked of the pool, which lacked it
    CHECK(st.host_prefix_miss_pages == before.host_prefix_miss_pages);     // and of no tier below
    CHECK(st.disk_prefix_miss_pages == before.disk_prefix_miss_pages);
    // Two pages of room: the match reads and keeps two pages, and asks for no third.
    cache.truncate(holder, 2 * page);
    CHECK(cache.match_prefix(a, lookup) == 2 * page);
    st = cache.statistics();
    CHECK(st.disk_prefix_hit_pages == before.disk_prefix_hit_pages + 2);
    CHECK(st.bytes_read_from_disk > before.bytes_read_from_disk);
    cache.remove_sequence(holder);  // room for the rest, recomputed
    append_tokens(cache, a, {prompts[0].begin() + 2 * page, prompts[0].end()});
    check_rows(cache, a, prompts[0]);
}

TEST_CASE("a tier the cache lacks is never asked, so never misses") {
    const auto unknown = tokens_from(7000, 2 * page);  // two full pages nobody cached
    for (const int tiers : {0, 1}) {
        INFO(tiers << " tiers below the pool");
        cache_type cache(layers, 4, page, true);
        if (tiers > 0) cache.attach_host_tier(4);
        const auto a = cache.add_sequence();
        CHECK(cache.match_prefix(a, unknown) == 0);
        const auto st = cache.statistics();
        CHECK(st.pool_prefix_miss_pages == 1);  // the walk ends at the first page
        CHECK(st.host_prefix_miss_pages == std::uint64_t(tiers));
        CHECK(st.disk_prefix_miss_pages == 0);
    }
    // Without prefix caching nothing is looked up at all, though the pages were offered.
    cache_type plain(layers, 4, page, false);
    plain.attach_host_tier(4);
    const auto b = plain.add_sequence();
    CHECK(plain.match_prefix(b, unknown) == 0);
    const auto st = plain.statistics();
    CHECK(st.prefix_queried_pages == 2);
    CHECK(st.pool_prefix_miss_pages == 0);
    CHECK(st.host_prefix_miss_pages == 0);
}

/// Flips a byte in the middle of a file.
void damage_file(const std::filesystem::path& path) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(std::filesystem::file_size(path) / 2);
    char byte = 0;
    f.seekg(at);
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x40);
    f.seekp(at);
    f.write(&byte, 1);
}

TEST_CASE("page files read ahead of the match count only where the match used them") {
    for (const int threads : {1, 3}) {
        INFO(threads << " read threads");
        const std::string directory = fresh_directory("read_ahead_" + std::to_string(threads));
        {  // two pages of room in the pool for three on disk: two are read and kept
            cache_type cache(layers, 4, page, true);
            cache.attach_host_tier(4);
            CHECK_THROWS_WITH_AS(cache.attach_disk_tier(directory, 8, -1),
                                 doctest::Contains("disk tier read_threads = -1 must not be negative"), kvcache::error);
            CHECK(cache.disk_tier_pages() == 0);  // the refused call attached nothing
            cache.attach_disk_tier(directory, 8, threads);
            CHECK(cache.disk_read_threads() == threads);
            const auto prompts = fill_through_tiers(cache);  // prompt 0: its four pages on disk only
            const std::vector<std::int32_t> lookup(prompts[0].begin(), prompts[0].end() - 1);  // three full pages
            const auto file_bytes = std::filesystem::file_size(page_file(directory, prompts[0], 0));
            const auto holder = cache.add_sequence();
            append_tokens(cache, holder, tokens_from(9000, 2 * page));
            const auto before = cache.statistics();
            const auto a = cache.add_sequence();
            CHECK(cache.match_prefix(a, lookup) == 2 * page);
            const auto st = cache.statistics();
            CHECK(st.disk_prefix_hit_pages == before.disk_prefix_hit_pages + 2);
            CHECK(st.bytes_read_from_disk == before.bytes_read_from_disk + 2 * file_bytes);
            check_first_rows(cache, a, prompts[0], 2 * page);
        }
        {  // pages 1 and 2 damaged: the match refuses page 1 and ends; page 2, read ahead, is neither used nor refused
            cache_type cache(layers, 4, page, true);
            cache.attach_host_tier(4);
            cache.attach_disk_tier(directory, 8, threads);
            const auto prompts = fill_through_tiers(cache);
            const std::vector<std::int32_t> lookup(prompts[0].begin(), prompts[0].end() - 1);
            const auto file_bytes = std::filesystem::file_size(page_file(directory, prompts[0], 0));
            damage_file(page_file(directory, prompts[0], 1));
            damage_file(page_file(directory, prompts[0], 2));
            const auto before = cache.statistics();
            const auto a = cache.add_sequence();
            CHECK(cache.match_prefix(a, lookup) == page);
            const auto st = cache.statistics();
            CHECK(st.disk_prefix_hit_pages == before.disk_prefix_hit_pages + 1);
            CHECK(st.bytes_read_from_disk == before.bytes_read_from_disk + file_bytes);
            CHECK(st.disk_pages_refused == before.disk_pages_refused + 1);
            CHECK(!std::filesystem::exists(page_file(directory, prompts[0], 1)));
            CHECK(std::filesystem::exists(page_file(directory, prompts[0], 2)));
            append_tokens(cache, a, {prompts[0].begin() + page, prompts[0].end()});  // the rest is recomputed
            check_rows(cache, a, prompts[0]);
        }
    }
}

namespace {
/// The header of a float paged cache's page files (pages of `page` tokens).
kvcache::detail::file_header page_file_header(int kv, int dim, int tier_layers) {
    kvcache::detail::file_header header;
    header.layout = kvcache::layout_kind::paged;
    header.element = kvcache::kinds_of<float>();
    header.heads = {2 * kv, kv, dim};
    header.layers = tier_layers;
    header.parameters[0] = page;
    return header;
}
}  // namespace

TEST_CASE("a page file reads back as the file holds it, or head-major as a device pool's page holds it") {
    // A device pool takes page files head-major from its read threads (one
    // copy a plane); a host pool reorders as it copies. Both orders, here
    // where no GPU is needed.
    constexpr int kv = 2, dim = 3, tier_layers = 2;
    kvcache::detail::disk_tier<float> disk(fresh_directory("head_major"), 2, page_file_header(kv, dim, tier_layers));
    const std::vector<std::int32_t> tokens = tokens_from(70, page);
    const std::uint64_t hash = kvcache::detail::chain_hash(kvcache::detail::root_hash, tokens.data(), page);
    const std::size_t plane = std::size_t(page) * kv * dim;
    kvcache::detail::disk_tier<float>::key_rows keys(tier_layers, std::vector<float>(plane));
    kvcache::detail::disk_tier<float>::value_rows values(tier_layers, std::vector<float>(plane));
    for (int l = 0; l < tier_layers; ++l)
        for (std::size_t i = 0; i < plane; ++i) {
            keys[l][i] = float(1000 * l + int(i));
            values[l][i] = -keys[l][i] - 1;
        }
    disk.store(hash, kvcache::detail::root_hash, tokens, keys, values);
    REQUIRE(disk.count() == 1);
    CHECK(!disk.read(hash + 1, kvcache::detail::root_hash, tokens.data(), page, false));  // never stored
    const auto as_file = disk.read(hash, kvcache::detail::root_hash, tokens.data(), page, false);
    const auto head_major = disk.read(hash, kvcache::detail::root_hash, tokens.data(), page, true);
    REQUIRE(as_file);
    REQUIRE(head_major);
    CHECK(as_file->file_bytes > 0);
    CHECK(head_major->file_bytes == as_file->file_bytes);
    for (int l = 0; l < tier_layers; ++l)
        for (int t = 0; t < page; ++t)
            for (int h = 0; h < kv; ++h)
                for (int d = 0; d < dim; ++d) {
                    const std::size_t token_major = (std::size_t(t) * kv + h) * dim + d;
                    const std::size_t in_plane = (std::size_t(h) * page + t) * dim + d;
                    INFO("layer " << l << ", token " << t << ", head " << h << ", element " << d);
                    CHECK(as_file->keys[l * plane + token_major] == keys[l][token_major]);
                    CHECK(as_file->values[l * plane + token_major] == values[l][token_major]);
                    CHECK(head_major->keys[l * plane + in_plane] == keys[l][token_major]);
                    CHECK(head_major->values[l * plane + in_plane] == values[l][token_major]);
                }
    const auto counters = disk.counters();
    CHECK(counters.loaded == 0);  // reads change nothing; note_read records what a caller used
    disk.note_read(hash, true, head_major->file_bytes);
    CHECK(disk.counters().loaded == 1);
    CHECK(disk.counters().bytes_read == head_major->file_bytes);
}

TEST_CASE("inside a write batch page files wait, then are written on threads and indexed in the order stored") {
    constexpr int kv = 1, dim = 2, tier_layers = 1;
    using tier = kvcache::detail::disk_tier<float>;
    const std::size_t plane = std::size_t(page) * kv * dim;
    // Page p: tokens from 10 * p, rows p + i / 100.
    const auto tokens_of = [](int p) { return tokens_from(10 * p, page); };
    const auto hash_of = [&](int p) {
        const auto tokens = tokens_of(p);
        return kvcache::detail::chain_hash(kvcache::detail::root_hash, tokens.data(), page);
    };
    const auto store = [&](tier& disk, int p) {
        tier::key_rows keys(tier_layers, std::vector<float>(plane));
        tier::value_rows values(tier_layers, std::vector<float>(plane));
        for (std::size_t i = 0; i < plane; ++i) {
            keys[0][i] = float(p) + float(i) / 100;
            values[0][i] = -keys[0][i];
        }
        disk.store(hash_of(p), kvcache::detail::root_hash, tokens_of(p), std::move(keys), std::move(values));
    };
    const auto reads_back = [&](const tier& disk, int p) {
        const auto tokens = tokens_of(p);
        const auto image = disk.read(hash_of(p), kvcache::detail::root_hash, tokens.data(), page, false);
        if (!image) return false;
        for (std::size_t i = 0; i < plane; ++i)
            if (image->keys[i] != float(p) + float(i) / 100 || image->values[i] != -image->keys[i]) return false;
        return true;
    };
    for (const int threads : {1, 3}) {
        INFO(threads << " threads");
        {  // a full tier keeps the pages stored last, as one store after another would
            const std::string directory = fresh_directory("batch");
            tier disk(directory, 3, page_file_header(kv, dim, tier_layers));
            {
                const tier::write_batch batch(disk, threads);
                for (int p = 0; p < 5; ++p) store(disk, p);
                store(disk, 4);  // waiting already: one page
                {
                    const tier::write_batch inner(disk, 1);  // nested: its end writes nothing
                    store(disk, 5);
                }
                CHECK(files_in(directory) == 0);
                CHECK(disk.count() == 0);
                CHECK(disk.counters().stored == 0);
                CHECK(!reads_back(disk, 0));
            }
            CHECK(disk.counters().stored == 6);
            CHECK(disk.counters().write_failures == 0);
            CHECK(disk.count() == 3);
            CHECK(files_in(directory) == 3);
            for (int p = 0; p < 6; ++p) {
                INFO("page " << p);
                CHECK(reads_back(disk, p) == (p >= 3));
                CHECK(std::filesystem::exists(page_file(directory, tokens_of(p), 0)) == (p >= 3));
            }
        }
        {  // a batch writes what waits once max_pending_pages do
            const std::string directory = fresh_directory("batch_bound");
            constexpr int bound = static_cast<int>(tier::max_pending_pages);
            tier disk(directory, bound + 8, page_file_header(kv, dim, tier_layers));
            {
                const tier::write_batch batch(disk, threads);
                for (int p = 0; p < bound - 1; ++p) store(disk, p);
                CHECK(files_in(directory) == 0);
                store(disk, bound - 1);
                CHECK(files_in(directory) == bound);
                CHECK(disk.count() == bound);
                store(disk, bound);
                CHECK(disk.count() == bound);
            }
            CHECK(disk.count() == bound + 1);
            for (int p = 0; p <= bound; ++p) CHECK(reads_back(disk, p));
        }
        {  // a full tier writes each new page over the file of the page it evicts
            const std::string directory = fresh_directory("batch_reuse"), links = fresh_directory("batch_reuse_links");
            tier disk(directory, 2, page_file_header(kv, dim, tier_layers));
            const auto bytes_of = [](const std::filesystem::path& path) {
                std::ifstream in(path, std::ios::binary);
                return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
            };
            // A second name for a file shows whether it was written in place.
            const auto link = [&](int p) {
                const auto name = std::filesystem::path(links) / std::to_string(p);
                std::filesystem::create_hard_link(page_file(directory, tokens_of(p), 0), name);
                return name;
            };
            store(disk, 0);
            store(disk, 1);
            const auto first = link(0);
            store(disk, 2);  // evicts page 0
            CHECK(bytes_of(first) == bytes_of(page_file(directory, tokens_of(2), 0)));
            const auto second = link(1), third = link(2);
            {
                const tier::write_batch batch(disk, threads);
                store(disk, 3);  // evicts page 1
                store(disk, 4);  // evicts page 2
            }
            CHECK(files_in(directory) == 2);
            for (int p = 0; p < 5; ++p) CHECK(reads_back(disk, p) == (p >= 3));
            std::vector<std::string> reused{bytes_of(second), bytes_of(third)}, stored{
                bytes_of(page_file(directory, tokens_of(3), 0)), bytes_of(page_file(directory, tokens_of(4), 0))};
            std::sort(reused.begin(), reused.end());
            std::sort(stored.begin(), stored.end());
            CHECK(reused == stored);
            CHECK(disk.counters().stored == 5);
        }
        {  // a page whose file cannot be written is counted and the others are kept
            const std::string directory = fresh_directory("batch_failure");
            tier disk(directory, 8, page_file_header(kv, dim, tier_layers));
            const auto blocker = page_file(directory, tokens_of(1), 0).string() + ".partial";
            std::filesystem::create_directory(blocker);
            {
                const tier::write_batch batch(disk, threads);
                for (int p = 0; p < 3; ++p) store(disk, p);
            }
            CHECK(disk.counters().write_failures == 1);
            CHECK(disk.counters().stored == 2);
            CHECK(disk.count() == 2);
            CHECK(reads_back(disk, 0));
            CHECK(!reads_back(disk, 1));
            CHECK(reads_back(disk, 2));
            std::filesystem::remove(blocker);
        }
    }
}

namespace {
/// Host memory whose streams are numbers and whose host-tier events and
/// waits are recorded: shows what a device cache would wait for (CUDA events
/// and streams there) without a GPU.
struct event_memory : test_support::numbered_stream_memory {
    /// The stream of the event's last record; -1: never recorded.
    struct event_type {
        int stream = -1;
    };
    struct call {
        std::string what;  ///< record, wait, order, fill, device (every stream waited for), stream
        int stream;        ///< the stream the call was on (-1: none)
        int event_stream;  ///< for wait and order: the stream the event was last recorded on
    };
    static std::vector<call>& calls() {
        static std::vector<call> recorded;
        return recorded;
    }
    static int count(const std::string& what, int stream, int event_stream) {
        return static_cast<int>(std::count_if(calls().begin(), calls().end(), [&](const call& c) {
            return c.what == what && c.stream == stream && c.event_stream == event_stream;
        }));
    }
    static int count(const std::string& what) {
        return static_cast<int>(
            std::count_if(calls().begin(), calls().end(), [&](const call& c) { return c.what == what; }));
    }
    static void record_event(event_type& event, int stream) {
        event.stream = stream;
        calls().push_back({"record", stream, stream});
    }
    static void wait_event(const event_type& event) { calls().push_back({"wait", -1, event.stream}); }
    static void order_after(int stream, const event_type& event) { calls().push_back({"order", stream, event.stream}); }
    static void synchronize() { calls().push_back({"device", -1, -1}); }
    static void synchronize(int stream) { calls().push_back({"stream", stream, -1}); }
    static void copy_to_host_async(void* destination, const void* source, std::size_t bytes, int stream) {
        calls().push_back({"fill", stream, -1});
        kvcache::host_memory::copy_to_host(destination, source, bytes);
    }
};
}  // namespace

namespace {
using event_cache = kvcache::paged_cache<float, heads, event_memory>;

/// One page of tokens, appended and left cached in the pool.
void cache_prompt(event_cache& cache, const std::vector<std::int32_t>& tokens) {
    const auto id = cache.add_sequence();
    append_tokens(cache, id, tokens);
    cache.remove_sequence(id);
}
}  // namespace

TEST_CASE("a host-tier page's reader waits for the copies that filled it, never for every stream") {
    const std::string directory = fresh_directory("events");
    event_cache cache(layers, 3, page, true);
    cache.attach_host_tier(2);
    cache.attach_disk_tier(directory, 4);
    auto& calls = event_memory::calls();
    const auto first = tokens_from(100, page), second = tokens_from(200, page), third = tokens_from(300, page);

    // A plan on stream 7 evicts the first prompt's page: its spill is filled
    // on stream 7, after whatever filled that host page before, and marked.
    cache_prompt(cache, first);
    calls.clear();
    {
        const auto filler = cache.add_sequence();
        (void)cache.plan({filler}, {3 * page}, 7);
        cache.remove_sequence(filler);
    }
    CHECK(event_memory::count("fill") == 2 * layers);
    CHECK(event_memory::count("order", 7, -1) == 1);
    CHECK(event_memory::count("record", 7, 7) == 1);
    CHECK(event_memory::count("device") == 0);

    // The second prompt spills without a stream (begin_append): a copy done on return.
    cache_prompt(cache, second);
    {
        const auto filler = cache.add_sequence();
        cache.begin_append(filler, 3 * page);
        cache.remove_sequence(filler);
    }
    // The third, on stream 8, takes the tier's least recently spilled page,
    // the first prompt's: it goes to a file once stream 7's copies into it
    // are done, and the new fill waits for them on stream 8, not on the host.
    cache_prompt(cache, third);
    calls.clear();
    {
        const auto filler = cache.add_sequence();
        (void)cache.plan({filler}, {3 * page}, 8);
        cache.remove_sequence(filler);
    }
    CHECK(cache.statistics().pages_written_to_disk == 1);
    CHECK(event_memory::count("wait", -1, 7) == 1);
    CHECK(event_memory::count("order", 8, 7) == 1);
    CHECK(event_memory::count("record", 8, 8) == 1);
    CHECK(event_memory::count("device") == 0);

    // A match on stream 9 brings the third prompt's page back from the host
    // tier: the copy out of it is ordered after stream 8's fill and marked in
    // turn, and the match returns without waiting. The first prompt comes
    // back from its file; without a stream the match waits for its copies.
    calls.clear();
    const auto again = cache.add_sequence();
    CHECK(cache.match_prefix(again, third, 9) == page);
    CHECK(event_memory::count("order", 9, 8) == 1);
    CHECK(event_memory::count("record", 9, 9) == 1);
    CHECK(event_memory::count("stream") == 0);
    CHECK(event_memory::count("device") == 0);
    check_rows(cache, again, third);
    calls.clear();
    const auto from_disk = cache.add_sequence();
    CHECK(cache.match_prefix(from_disk, first) == page);
    CHECK(cache.statistics().disk_prefix_hit_pages == 1);
    CHECK(event_memory::count("stream", 0, -1) == 1);
    check_rows(cache, from_disk, first);
    cache.remove_sequence(again);
    cache.remove_sequence(from_disk);

    // A sequence swapped out on stream 5 is read from the tier after stream
    // 5's copies into its pages, and swapped back in on stream 6 after them.
    const auto swapped = cache.add_sequence();
    const auto swapped_tokens = tokens_from(400, page + 1);
    write_tokens(cache, swapped, swapped_tokens, cache.begin_append(swapped, page + 1));
    cache.clear_prefix_cache();  // no pool twins: both pages are copied
    calls.clear();
    cache.swap_out(swapped, 5);
    CHECK(event_memory::count("record", 5, 5) == 2);
    check_rows(cache, swapped, swapped_tokens);
    CHECK(event_memory::count("wait", -1, 5) == 2 * layers);  // each layer's read waits for both pages
    cache.swap_in(swapped, 6);
    CHECK(event_memory::count("order", 6, 5) == 2);
    CHECK(event_memory::count("record", 6, 6) == 2);
    CHECK(event_memory::count("stream") == 0);  // returned with the copies in flight
    CHECK(event_memory::count("device") == 0);
    check_rows(cache, swapped, swapped_tokens);
    // Swapped out again on stream 11, into the two host pages swap_in just
    // released: the new fills wait, on stream 11, for stream 6's copies out.
    calls.clear();
    cache.swap_out(swapped, 11);
    CHECK(event_memory::count("order", 11, 6) == 2);
    CHECK(event_memory::count("record", 11, 11) == 2);
    cache.swap_in(swapped);  // no stream: waits for its copies
    CHECK(event_memory::count("stream", 0, -1) == 1);
    CHECK(event_memory::count("device") == 0);
    check_rows(cache, swapped, swapped_tokens);
}

TEST_CASE("a pool page written straight to disk waits for its plan's stream, not for every stream") {
    const std::string directory = fresh_directory("straight_to_disk");
    event_cache cache(layers, 3, page, true);
    cache.attach_host_tier(1);
    cache.attach_disk_tier(directory, 4);
    // A swapped sequence holds the tier's only page, so an evicted prefix page goes straight to disk.
    const auto swapped = cache.add_sequence();
    write_tokens(cache, swapped, tokens_from(500, page), cache.begin_append(swapped, page));
    cache.clear_prefix_cache();
    cache.swap_out(swapped);
    const auto first = tokens_from(100, page), second = tokens_from(200, page);

    // A plan on stream 7 evicts the first prompt's page: the rows are read
    // once stream 7's work is done (work on it is ordered after the page's
    // writers: it is about to write the page), without waiting for every stream.
    cache_prompt(cache, first);
    auto& calls = event_memory::calls();
    calls.clear();
    {
        const auto filler = cache.add_sequence();
        (void)cache.plan({filler}, {3 * page}, 7);
        cache.remove_sequence(filler);
    }
    CHECK(cache.statistics().pages_written_to_disk == 1);
    CHECK(event_memory::count("stream", 7, -1) == 1);
    CHECK(event_memory::count("device") == 0);

    // Without a stream any plan's may still be writing the page: every stream is waited for.
    cache_prompt(cache, second);
    calls.clear();
    {
        const auto filler = cache.add_sequence();
        cache.begin_append(filler, 3 * page);
        cache.remove_sequence(filler);
    }
    CHECK(cache.statistics().pages_written_to_disk == 2);
    CHECK(event_memory::count("device") == 1);

    // Both pages come back from their files as they were written.
    for (const auto& tokens : {first, second}) {
        const auto id = cache.add_sequence();
        CHECK(cache.match_prefix(id, tokens) == page);
        check_rows(cache, id, tokens);
        cache.remove_sequence(id);
    }
    CHECK(cache.statistics().disk_prefix_hit_pages == 2);
    cache.swap_in(swapped);
}
