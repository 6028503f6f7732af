// paged_cache::compact as an owner operation: the pages it releases, pages
// shared with forks, prefix hits and the prefix cache left as they were, the
// prefix index never offered moved rows, refusals that change nothing,
// truncate, swap and save/load of compacted sequences, and a randomised run
// mixing compaction with append, fork, prefix hits, truncate, swap and
// save/load against a model of what every layer of every sequence stores.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
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
using kvcache::sequence_id;
constexpr int page = 4, layers = 2;
constexpr int row = heads::kv_heads() * heads::head_dim;

std::vector<float> rows_of(const std::vector<std::int32_t>& tokens, int first, int layer, bool is_value) {
    return test_support::token_rows(tokens, first, layer, is_value, row);
}

std::vector<std::int32_t> tokens_from(int first, int n) {
    std::vector<std::int32_t> out(n);
    for (int i = 0; i < n; ++i) out[i] = first + i;
    return out;
}

/// What one sequence stores by the model: its length, and per layer the
/// (position, token) of each stored row in order.
struct model_sequence {
    int length = 0;
    std::vector<std::vector<std::pair<int, std::int32_t>>> layer{std::size_t(layers)};

    void append(const std::vector<std::int32_t>& tokens) {
        for (auto& l : layer)
            for (std::size_t t = 0; t < tokens.size(); ++t) l.push_back({length + int(t), tokens[t]});
        length += int(tokens.size());
    }
    void keep(int l, const std::vector<int>& kept) {
        std::vector<std::pair<int, std::int32_t>> out;
        for (int i : kept) out.push_back(layer[std::size_t(l)][std::size_t(i)]);
        layer[std::size_t(l)] = out;
    }
    void truncate(int n) {
        for (auto& l : layer)
            l.erase(std::remove_if(l.begin(), l.end(), [&](const auto& r) { return r.first >= n; }), l.end());
        length = n;
    }
};

/// Appends tokens to every layer (layer 0 reserves, with the token ids for the prefix cache).
void append_tokens(cache_type& cache, sequence_id id, const std::vector<std::int32_t>& tokens) {
    const int first = cache.begin_append(id, static_cast<int>(tokens.size()), tokens);
    for (int l = 0; l < layers; ++l) {
        const auto keys = rows_of(tokens, first, l, false), values = rows_of(tokens, first, l, true);
        cache.write(id, l, first, keys, values, static_cast<int>(tokens.size()));
    }
}

/// Every layer of the sequence stores exactly the model's positions and rows.
void check_sequence(const cache_type& cache, sequence_id id, const model_sequence& m) {
    INFO("sequence " << id);
    REQUIRE(cache.length(id) == m.length);
    for (int l = 0; l < layers; ++l) {
        INFO("layer " << l);
        const auto& want = m.layer[std::size_t(l)];
        std::vector<int> positions;
        for (const auto& r : want) positions.push_back(r.first);
        REQUIRE(cache.present_positions(id, l) == positions);
        for (const auto& r : want) {
            std::vector<float> k(row), v(row);
            cache.read(id, l, r.first, 1, k, v);
            CHECK(k == rows_of({r.second}, r.first, l, false));
            CHECK(v == rows_of({r.second}, r.first, l, true));
        }
    }
}

/// Everything observable of a cache that may hold compacted sequences:
/// positions and rows of every layer, page tables and references, counters.
std::string snapshot(const cache_type& cache) {
    std::ostringstream out;
    for (auto id : cache.sequences()) {
        out << id << ":" << cache.length(id) << (cache.swapped_out(id) ? "s" : "r");
        for (int l = 0; l < layers; ++l) {
            const auto positions = cache.present_positions(id, l);
            out << "[";
            for (int p : positions) {
                std::vector<float> k(row), v(row);
                cache.read(id, l, p, 1, k, v);
                out << p << "=" << k[0] << "/" << v[row - 1] << ",";
            }
            out << "]";
        }
        for (int p : cache.pages(id)) out << ";" << p << "x" << cache.page_references(p);
        out << "|";
    }
    const auto s = cache.statistics();
    out << s.pages_used << "," << s.pages_free << "," << s.pages_cached << "," << s.pages_evictable << ","
        << s.evictions << "," << s.copies << "," << s.pages_released_by_compaction << "," << s.rows_moved_by_compaction
        << "," << s.host_pages_used << "," << s.prefix_hit_pages;
    return out.str();
}

}  // namespace

TEST_CASE("compaction releases the pages past the rows of the layer that keeps the most, and counts them") {
    cache_type cache(layers, 16, page, false);
    const auto a = cache.add_sequence();
    model_sequence m;
    const auto tokens = tokens_from(100, 32);
    append_tokens(cache, a, tokens);
    m.append(tokens);
    const auto before = cache.statistics();
    REQUIRE(before.pages_used == 8);
    REQUIRE(cache.pages(a).size() == 8u);

    // Layer 0 keeps 10 rows (3 pages), layer 1 keeps 6: the shared page table
    // keeps 3 pages (layer 1's rows fill 2 of them), the other 5 are freed.
    const std::vector<int> keep0 = {0, 1, 2, 3, 9, 14, 15, 29, 30, 31}, keep1 = {0, 1, 20, 21, 30, 31};
    cache.compact(a, {keep0, keep1});
    m.keep(0, keep0);
    m.keep(1, keep1);
    check_sequence(cache, a, m);
    const auto after = cache.statistics();
    CHECK(cache.pages(a).size() == 3u);
    CHECK(after.pages_used == 3);
    CHECK(after.pages_free == before.pages_free + 5);
    CHECK(after.pages_released_by_compaction == 5u);
    CHECK(after.bytes_used == before.bytes_used / 8 * 3);
    CHECK(cache.bytes_used() == after.bytes_used);
    CHECK(cache.length(a) == 32);

    // Per layer: layer 0 alone down to 2 rows; layer 1's 6 rows still need 2 pages.
    cache.compact(a, 0, {0, 9});
    m.keep(0, {0, 9});
    check_sequence(cache, a, m);
    CHECK(cache.pages(a).size() == 2u);
    CHECK(cache.statistics().pages_released_by_compaction == 6u);

    // Appends land after each layer's own kept rows, at the next true positions.
    const auto more = tokens_from(500, 3);
    append_tokens(cache, a, more);
    m.append(more);
    check_sequence(cache, a, m);
    CHECK(cache.length(a) == 35);
    CHECK(cache.pages(a).size() == 3u);  // layer 1: 6 + 3 rows
}

TEST_CASE("a fork and the prefix cache keep their rows: compaction copies shared pages before moving rows into them") {
    cache_type cache(layers, 24, page, true);
    const auto a = cache.add_sequence();
    const auto tokens = tokens_from(10, 17);
    append_tokens(cache, a, tokens);
    cache.publish(a);  // its 4 full pages enter the prefix index
    model_sequence original;
    original.append(tokens);
    const auto f = cache.fork(a);
    const std::vector<int> fork_pages = cache.pages(f);
    const auto copies = cache.statistics().copies;

    model_sequence m = original;
    const std::vector<int> keep = {0, 1, 6, 7, 8, 12, 16};
    cache.compact(a, {keep, keep});
    m.keep(0, keep);
    m.keep(1, keep);
    check_sequence(cache, a, m);
    check_sequence(cache, f, original);  // the fork still reads its original rows
    CHECK(cache.pages(f) == fork_pages);
    // Pages 0 and 1 of a received moved rows: both were shared, so both were copied.
    CHECK(cache.statistics().copies == copies + 2);
    CHECK(cache.pages(a)[0] != fork_pages[0]);
    CHECK(cache.pages(a)[1] != fork_pages[1]);

    // A new request with the same prompt matches the cached pages, which still
    // hold the original rows.
    const auto c = cache.add_sequence();
    CHECK(cache.match_prefix(c, tokens) == 16);
    model_sequence mc;
    mc.append(std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 16));
    check_sequence(cache, c, mc);
}

TEST_CASE("a compacted sequence's moved pages are never published under its token ids") {
    cache_type cache(layers, 24, page, true);
    const auto a = cache.add_sequence();
    const auto tokens = tokens_from(40, 16);
    append_tokens(cache, a, tokens);  // nothing published yet: pages are offered at the next step
    model_sequence m;
    m.append(tokens);
    const std::vector<int> keep = {0, 1, 2, 3, 5, 9, 10, 15};  // page 0 unchanged, page 1 receives moved rows
    cache.compact(a, {keep, keep});
    m.keep(0, keep);
    m.keep(1, keep);
    const auto more = tokens_from(900, 9);
    append_tokens(cache, a, more);  // would publish every full page of an uncompacted sequence
    m.append(more);
    check_sequence(cache, a, m);
    cache.remove_sequence(a);  // publishes what may be published
    CHECK(cache.statistics().pages_cached == 1);  // page 0 only: its rows are still tokens 40..43 at 0..3

    const auto b = cache.add_sequence();
    CHECK(cache.match_prefix(b, tokens) == page);
    model_sequence mb;
    mb.append(std::vector<std::int32_t>(tokens.begin(), tokens.begin() + page));
    check_sequence(cache, b, mb);
}

TEST_CASE("a layer that keeps a leading run and drops the rest moves nothing, yet its later pages are not published") {
    cache_type cache(layers, 24, page, true);
    const auto a = cache.add_sequence();
    const auto tokens = tokens_from(60, 16);
    append_tokens(cache, a, tokens);
    model_sequence m;
    m.append(tokens);
    cache.compact(a, 1, {0, 1, 2, 3, 4, 5});  // no row moves; layer 1 stores positions 0..5
    m.keep(1, {0, 1, 2, 3, 4, 5});
    const auto more = tokens_from(600, 9);
    append_tokens(cache, a, more);  // layer 1 stores positions 16.. in rows 6.. (page 1 onwards)
    m.append(more);
    check_sequence(cache, a, m);
    cache.remove_sequence(a);
    CHECK(cache.statistics().pages_cached == 1);  // page 0 only: rows 0..3 are positions 0..3 in both layers

    const auto b = cache.add_sequence();
    CHECK(cache.match_prefix(b, tokens) == page);
    model_sequence mb;
    mb.append(std::vector<std::int32_t>(tokens.begin(), tokens.begin() + page));
    check_sequence(cache, b, mb);
}

TEST_CASE("appends after a compaction copy the shared pages they land in, also earlier ones of a shorter layer") {
    cache_type cache(layers, 24, page, true);
    const auto a = cache.add_sequence();
    const auto tokens = tokens_from(70, 16);
    append_tokens(cache, a, tokens);
    cache.publish(a);  // all 4 pages in the prefix index
    model_sequence m;
    m.append(tokens);
    cache.compact(a, 1, {0, 1});  // layer 1 keeps 2 rows; layer 0 all 16: no page is released
    m.keep(1, {0, 1});
    const auto copies = cache.statistics().copies;
    // Through a plan and the append kernel, which write through the view: the
    // reservation alone must have copied what they write into.
    const auto more = tokens_from(800, 1);
    const auto plan = cache.plan_with_tokens({a}, {more});  // layer 0: row 16 (a new page); layer 1: row 2, in cached page 0
    const std::vector<int> offsets = {0, 1};
    for (int l = 0; l < layers; ++l) {
        const auto keys = rows_of(more, 16, l, false), values = rows_of(more, 16, l, true);
        kvcache::reference_backend{}.append(kvcache::append_params(plan.view(l), keys, values, offsets));
    }
    m.append(more);
    check_sequence(cache, a, m);
    CHECK(cache.statistics().copies == copies + 1);

    // The cached page 0 still holds the prompt's rows in every layer.
    const auto b = cache.add_sequence();
    CHECK(cache.match_prefix(b, tokens) == 16);
    model_sequence mb;
    mb.append(tokens);
    check_sequence(cache, b, mb);
}

TEST_CASE("every refused compaction names the bad value and changes nothing") {
    cache_type cache(layers, 12, page, true);
    cache.attach_host_tier(8);
    const auto a = cache.add_sequence(), s = cache.add_sequence();
    append_tokens(cache, a, tokens_from(1, 14));
    append_tokens(cache, s, tokens_from(200, 5));
    cache.publish(a);
    cache.compact(a, 1, {0, 2, 5, 7, 13});  // already compacted once: refusals see per-layer state
    cache.swap_out(s);
    const std::string before = snapshot(cache);
    const auto refused = [&](auto&& call, kvcache::error_code code, const std::string& text) {
        try {
            call();
            FAIL("not refused: " << text);
        } catch (const kvcache::error& e) {
            CHECK(e.code() == code);
            CHECK_MESSAGE(std::string(e.what()).find(text) != std::string::npos, e.what());
        }
        CHECK(snapshot(cache) == before);
    };
    using kvcache::error_code;
    refused([&] { cache.compact(999, 0, {0}); }, error_code::not_found, "999");
    refused([&] { cache.compact(a, 2, {0}); }, error_code::out_of_range, "layer 2");
    refused([&] { cache.compact(a, -1, {0}); }, error_code::out_of_range, "layer -1");
    refused([&] { cache.compact(a, 0, {0, 3, 3}); }, error_code::invalid_argument, "kept[2] = 3");
    refused([&] { cache.compact(a, 0, {4, 1}); }, error_code::invalid_argument, "kept[1] = 1");
    refused([&] { cache.compact(a, 0, {0, 14}); }, error_code::out_of_range, "kept[1] = 14");
    refused([&] { cache.compact(a, 0, {-1}); }, error_code::out_of_range, "kept[0] = -1");
    refused([&] { cache.compact(a, 1, {0, 5}); }, error_code::out_of_range, "outside its visible rows [0, 5)");
    refused([&] { cache.compact(s, 0, {0}); }, error_code::invalid_argument, "swapped out");
    // The whole-sequence form: a bad list in any layer changes no layer.
    refused([&] { cache.compact(a, {{0, 1, 9}, {0, 1, 1}}); }, error_code::invalid_argument, "layer 1: kept[2] = 1");
    refused([&] { cache.compact(a, {{0, 1}}); }, error_code::invalid_argument, "1 lists of kept rows for 2 layers");
    // Reading a position compaction dropped is refused too.
    refused(
        [&] {
            std::vector<float> k(row), v(row);
            cache.read(a, 1, 1, 1, k, v);
        },
        error_code::out_of_range, "position 1 is not stored");
    // Copies on write that the pool cannot supply: a fork shares every page of
    // a, and the pool is exhausted first.
    const auto f = cache.fork(a);
    const auto filler = cache.add_sequence();
    append_tokens(cache, filler, tokens_from(700, 4 * (cache.statistics().pages_free + cache.statistics().pages_evictable)));
    const std::string full = snapshot(cache);
    try {
        cache.compact(a, 0, {1, 2});
        FAIL("not refused");
    } catch (const kvcache::error& e) {
        CHECK(e.code() == kvcache::error_code::capacity_exceeded);
    }
    CHECK(snapshot(cache) == full);
    (void)f;
}

TEST_CASE("truncate, swap and save/load of compacted sequences") {
    cache_type cache(layers, 24, page, true);
    cache.attach_host_tier(12);
    const auto a = cache.add_sequence();
    model_sequence m;
    const auto tokens = tokens_from(300, 21);
    append_tokens(cache, a, tokens);
    m.append(tokens);
    const std::vector<int> keep = {0, 1, 4, 5, 6, 11, 17, 19, 20};
    cache.compact(a, {keep, keep});
    m.keep(0, keep);
    m.keep(1, keep);

    // Uniform compaction saves its positions and loads back compacted.
    std::stringstream file;
    cache.save(file, {a});
    const auto loaded = cache.load(file);
    REQUIRE(loaded.size() == 1u);
    check_sequence(cache, loaded[0], m);
    CHECK(cache.compacted(loaded[0]));
    cache.remove_sequence(loaded[0]);

    // Swapped out and back, the rows and positions stay.
    cache.swap_out(a);
    check_sequence(cache, a, m);  // read from the host tier
    cache.swap_in(a);
    check_sequence(cache, a, m);

    // Truncating inside the kept rows: appends continue at the new length.
    cache.truncate(a, 12);
    m.truncate(12);
    check_sequence(cache, a, m);
    const auto more = tokens_from(800, 5);
    append_tokens(cache, a, more);
    m.append(more);
    check_sequence(cache, a, m);
    // Truncating below every dropped position: the sequence is whole again.
    cache.truncate(a, 2);
    m.truncate(2);
    check_sequence(cache, a, m);
    CHECK_FALSE(cache.compacted(a));

    // Layers that keep different positions cannot share one record: refused,
    // nothing written.
    const auto b = cache.add_sequence();
    append_tokens(cache, b, tokens_from(50, 9));
    cache.compact(b, 0, {0, 4, 8});
    std::stringstream refused;
    try {
        cache.save(refused, {b});
        FAIL("not refused");
    } catch (const kvcache::error& e) {
        CHECK(e.code() == kvcache::error_code::invalid_argument);
        CHECK(std::string(e.what()).find("sequence " + std::to_string(b)) != std::string::npos);
    }
    CHECK(refused.str().empty());
}

TEST_CASE("randomised: compaction mixed with append, fork, prefix hits, truncate, swap and save/load") {
    int compactions = 0, refused = 0;
    for (const unsigned seed : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u}) {
        INFO("seed " << seed);
        std::mt19937 random(seed);
        const auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(random); };
        cache_type cache(layers, 20, page, true);
        cache.attach_host_tier(12);
        std::map<sequence_id, model_sequence> model;
        const std::vector<std::vector<std::int32_t>> prompts = {tokens_from(1000, 11), tokens_from(2000, 6),
                                                                tokens_from(1000, 5)};
        /// A random ascending subset of [0, n).
        const auto subset = [&](int n) {
            std::vector<int> out;
            for (int i = 0; i < n; ++i)
                if (pick(3) != 0) out.push_back(i);
            return out;
        };
        for (int step = 0; step < 500; ++step) {
            std::vector<sequence_id> ids;
            for (const auto& entry : model) ids.push_back(entry.first);
            const auto any = [&] { return ids[std::size_t(pick(int(ids.size())))]; };
            const int op = ids.empty() ? 0 : pick(10);
            const std::string before = snapshot(cache);
            try {
                if (op == 0) {  // a new request, sharing a cached prompt prefix when one matches
                    const auto id = cache.add_sequence();
                    model[id] = {};
                    auto tokens = prompts[std::size_t(pick(3))];
                    const int matched = cache.match_prefix(id, tokens);
                    model[id].append(std::vector<std::int32_t>(tokens.begin(), tokens.begin() + matched));
                    tokens.erase(tokens.begin(), tokens.begin() + matched);
                    try {
                        append_tokens(cache, id, tokens);
                    } catch (const kvcache::error&) {
                        cache.remove_sequence(id);
                        model.erase(id);
                        throw;
                    }
                    model[id].append(tokens);
                } else if (op == 1) {
                    const auto id = any();
                    if (cache.swapped_out(id)) continue;
                    const auto tokens = tokens_from(3000 + step * 8, 1 + pick(5));
                    append_tokens(cache, id, tokens);
                    model[id].append(tokens);
                } else if (op == 2 || op == 3) {  // compaction of one layer, or of all
                    const auto id = any();
                    if (cache.swapped_out(id)) continue;
                    if (op == 2) {
                        const int l = pick(layers);
                        const auto kept = subset(cache.visible_count(id, l));
                        cache.compact(id, l, kept);
                        model[id].keep(l, kept);
                    } else {
                        std::vector<std::vector<int>> kept;
                        for (int l = 0; l < layers; ++l) kept.push_back(subset(cache.visible_count(id, l)));
                        cache.compact(id, kept);
                        for (int l = 0; l < layers; ++l) model[id].keep(l, kept[std::size_t(l)]);
                    }
                    ++compactions;
                } else if (op == 4) {
                    const auto id = any();
                    const auto child = cache.fork(id);
                    model[child] = model[id];
                } else if (op == 5) {
                    const auto id = any();
                    if (cache.swapped_out(id)) continue;
                    const int n = pick(cache.length(id) + 1);
                    cache.truncate(id, n);
                    model[id].truncate(n);
                } else if (op == 6) {
                    const auto id = any();
                    if (cache.swapped_out(id)) cache.swap_in(id);
                    else cache.swap_out(id);
                } else if (op == 7) {  // save and load one sequence (refused when its layers disagree)
                    const auto id = any();
                    std::stringstream file;
                    cache.save(file, {id});
                    const auto loaded = cache.load(file);
                    model[loaded.at(0)] = model[id];
                } else {
                    const auto id = any();
                    cache.remove_sequence(id);
                    model.erase(id);
                }
            } catch (const kvcache::error&) {
                ++refused;
                if (op != 0) CHECK(snapshot(cache) == before);  // a refused request's sequence was removed
            }
            for (const auto& entry : model) check_sequence(cache, entry.first, entry.second);
            // The page table holds exactly the pages the fullest layer's rows need.
            for (const auto& entry : model) {
                if (cache.swapped_out(entry.first)) continue;
                std::size_t most = 0;
                for (int l = 0; l < layers; ++l) most = std::max(most, entry.second.layer[std::size_t(l)].size());
                CHECK(cache.pages(entry.first).size() == (most + page - 1) / page);
            }
        }
    }
    CHECK(compactions > 500);
    CHECK(refused > 20);
}
