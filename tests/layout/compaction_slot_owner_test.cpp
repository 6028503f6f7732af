// compact() on the slot owners: static_cache/dynamic_cache move kept rows to
// the front of the slot at their true positions (as paged_cache does with
// pages); the rows, positions and view after a compaction against lists
// written out by hand, appends after it, refusals that change nothing, and
// fork, truncate, growth and save/load of compacted sequences.
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cache_test_support.hpp"
#include "kvcache/cache/contiguous_cache.hpp"

namespace {

using heads = kvcache::head_config<2, 1, 8>;
using kvcache::sequence_id;
constexpr int layers = 2;
constexpr int row = heads::kv_heads() * heads::head_dim;

/// The rows of position p: a fixed function of (token 100 + p, p, layer).
std::vector<float> rows_at(int p, int layer, bool is_value, int n = 1) {
    std::vector<std::int32_t> tokens;
    for (int t = 0; t < n; ++t) tokens.push_back(100 + p + t);
    return test_support::token_rows(tokens, p, layer, is_value, row);
}

/// Appends n tokens (every layer) after the sequence's end.
template <class Cache>
void append_rows(Cache& cache, sequence_id id, int n) {
    const int first = cache.length(id);
    for (int l = 0; l < layers; ++l) {
        const std::vector<float> keys = rows_at(first, l, false, n), values = rows_at(first, l, true, n);
        cache.append(id, l, keys, values, n);
    }
}

/// Each layer stores exactly `positions[l]`, each with its own rows.
template <class Cache>
void check_layers(const Cache& cache, sequence_id id, const std::vector<std::vector<int>>& positions) {
    for (int l = 0; l < layers; ++l) {
        INFO("sequence " << id << " layer " << l);
        REQUIRE(cache.present_positions(id, l) == positions[std::size_t(l)]);
        CHECK(cache.visible_count(id, l) == int(positions[std::size_t(l)].size()));
        for (int p : positions[std::size_t(l)]) {
            std::vector<float> k(row), v(row);
            cache.read(id, l, p, 1, k, v);
            CHECK(k == rows_at(p, l, false));
            CHECK(v == rows_at(p, l, true));
        }
    }
}

/// Rows, lengths and stored positions of every sequence.
template <class Cache>
std::string snapshot(const Cache& cache) {
    std::ostringstream out;
    for (auto id : cache.sequences()) {
        out << id << ":" << cache.length(id);
        for (int l = 0; l < layers; ++l) {
            out << "[";
            for (int p : cache.present_positions(id, l)) {
                std::vector<float> k(row), v(row);
                cache.read(id, l, p, 1, k, v);
                out << p << "=" << k[0] << "/" << v[row - 1] << ",";
            }
            out << "]";
        }
        out << "|";
    }
    out << cache.bytes_used() << "," << cache.rows_moved_by_compaction();
    return out.str();
}

std::vector<int> range(int first, int last) {
    std::vector<int> out;
    for (int p = first; p < last; ++p) out.push_back(p);
    return out;
}

std::vector<int> joined(std::vector<int> a, const std::vector<int>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

}  // namespace

TEST_CASE("contiguous: compaction keeps the chosen rows at their positions, and the slot takes later tokens") {
    kvcache::static_cache<float, heads> cache(layers, 2, 12);
    const auto a = cache.add_sequence(), b = cache.add_sequence();
    append_rows(cache, a, 10);
    append_rows(cache, b, 6);
    const std::string b_before = [&] {
        std::vector<float> k(6 * row), v(6 * row);
        cache.read(b, 1, 0, 6, k, v);
        return std::string(reinterpret_cast<const char*>(k.data()), k.size() * sizeof(float));
    }();

    cache.compact(a, {{0, 1, 4, 5, 9}, {2, 3, 9}});
    CHECK(cache.compacted(a));
    CHECK_FALSE(cache.compacted(b));
    CHECK(cache.length(a) == 10);  // the next token's position
    check_layers(cache, a, {{0, 1, 4, 5, 9}, {2, 3, 9}});
    check_layers(cache, b, {range(0, 6), range(0, 6)});
    CHECK(cache.rows_moved_by_compaction() == 2 + 1 + 3);  // layer 0: 4,5 then 9; layer 1: 2,3,9
    CHECK(cache.bytes_used() == std::size_t(5 + 3 + 2 * 6) * 2 * row * sizeof(float));

    // The view presents the kept rows at their positions, in runs that stop
    // where positions stop being consecutive.
    auto view = cache.view(0, {b, a});
    CHECK(view.visible_count(0) == 6);
    CHECK(view.visible_count(1) == 5);
    const std::vector<int> kept0 = {0, 1, 4, 5, 9};
    for (int i = 0; i < 5; ++i) {
        CHECK(view.visible_position(1, i) == kept0[std::size_t(i)]);
        const float* k = view.key(1, 0, kept0[std::size_t(i)]);
        CHECK(std::vector<float>(k, k + row) == rows_at(kept0[std::size_t(i)], 0, false));
    }
    CHECK(view.run(1, 0, 0).count == 2);
    CHECK(view.run(1, 0, 2).first_position == 4);
    CHECK(view.run(1, 0, 2).count == 2);
    CHECK(view.run(1, 0, 4).count == 1);
    CHECK(view.run(0, 0, 0).count == 6);  // b is whole: one run

    // A dropped position is not there to read or write.
    std::vector<float> k(row), v(row);
    CHECK_THROWS_WITH_AS(cache.read(a, 0, 2, 1, k, v), doctest::Contains("position 2 is not stored"), kvcache::error);
    CHECK_THROWS_AS(cache.write(a, 1, 4, k, v, 1), kvcache::error);

    // Appends land after each layer's kept rows: the slot of 12 rows now
    // holds positions up to 16 in layer 0 (5 + 7 rows).
    append_rows(cache, a, 7);
    CHECK(cache.length(a) == 17);
    check_layers(cache, a, {joined(kept0, range(10, 17)), joined({2, 3, 9}, range(10, 17))});
    CHECK_THROWS_WITH_AS(append_rows(cache, a, 1), doctest::Contains("12 rows stored"), kvcache::error);

    // A second compaction indexes the rows stored now.
    cache.compact(a, 0, {1, 3, 5, 11});
    check_layers(cache, a, {{1, 5, 10, 16}, joined({2, 3, 9}, range(10, 17))});
    std::vector<float> kb(6 * row), vb(6 * row);
    cache.read(b, 1, 0, 6, kb, vb);
    CHECK(std::string(reinterpret_cast<const char*>(kb.data()), kb.size() * sizeof(float)) == b_before);
}

TEST_CASE("contiguous: every refused compaction names the bad value and changes nothing") {
    kvcache::dynamic_cache<float, heads> cache(layers, 2, 16);
    const auto a = cache.add_sequence();
    append_rows(cache, a, 10);
    cache.compact(a, 1, {0, 2, 4, 6, 8});
    const std::string before = snapshot(cache);
    const auto refused = [&](kvcache::error_code code, const std::vector<std::string>& words, auto&& call) {
        try {
            call();
            FAIL("not refused");
        } catch (const kvcache::error& e) {
            CHECK(e.code() == code);
            for (const auto& w : words) CHECK_MESSAGE(std::string(e.what()).find(w) != std::string::npos, e.what());
        }
        CHECK(snapshot(cache) == before);
    };
    refused(kvcache::error_code::not_found, {"999"}, [&] { cache.compact(999, 0, {0}); });
    refused(kvcache::error_code::out_of_range, {"layer 2"}, [&] { cache.compact(a, 2, {0}); });
    refused(kvcache::error_code::out_of_range, {"kept[1] = 10", "[0, 10)"}, [&] { cache.compact(a, 0, {0, 10}); });
    refused(kvcache::error_code::out_of_range, {"kept[0] = -1"}, [&] { cache.compact(a, 0, {-1}); });
    refused(kvcache::error_code::out_of_range, {"layer 1", "kept[2] = 5", "[0, 5)"}, [&] { cache.compact(a, 1, {0, 1, 5}); });
    refused(kvcache::error_code::invalid_argument, {"kept[1] = 3", "ascend"}, [&] { cache.compact(a, 0, {3, 3}); });
    refused(kvcache::error_code::invalid_argument, {"kept[2] = 1"}, [&] { cache.compact(a, 0, {0, 4, 1}); });
    refused(kvcache::error_code::invalid_argument, {"1 lists", "2 layers"}, [&] { cache.compact(a, {{0, 1}}); });
    // All or nothing: layer 0's good list is not applied when layer 1's is bad.
    refused(kvcache::error_code::invalid_argument, {"layer 1"}, [&] { cache.compact(a, {{0, 1}, {4, 3}}); });
    // Saving needs one set of positions for every layer.
    std::ostringstream out;
    refused(kvcache::error_code::invalid_argument, {"different positions"}, [&] { cache.save(out); });
}

TEST_CASE("contiguous: fork, truncate, growth and save/load of compacted sequences") {
    kvcache::dynamic_cache<float, heads> cache(layers, 1, 8);
    const auto a = cache.add_sequence();
    append_rows(cache, a, 8);
    cache.compact(a, {{0, 3, 5, 7}, {0, 3, 5, 7}});
    append_rows(cache, a, 2);  // positions 8, 9 in rows 4, 5
    const std::vector<int> kept = {0, 3, 5, 7, 8, 9};
    check_layers(cache, a, {kept, kept});

    // The fork (a new slot: the cache grows, copying a's stored rows) has the
    // same rows and positions; compacting it leaves a as it was.
    const auto f = cache.fork(a);
    CHECK(cache.slot_count() == 2);
    check_layers(cache, a, {kept, kept});
    check_layers(cache, f, {kept, kept});
    cache.compact(f, 0, {1, 2});
    check_layers(cache, f, {{3, 5}, kept});
    check_layers(cache, a, {kept, kept});

    // Save and load: the same positions come back compacted, in every layer.
    std::stringstream file;
    cache.save(file, {a});
    kvcache::static_cache<float, heads> other(layers, 1, 6);  // 6 stored rows fit, 10 positions would not
    const auto loaded = other.load(file);
    REQUIRE(loaded.size() == 1);
    CHECK(other.length(loaded[0]) == 10);
    CHECK(other.compacted(loaded[0]));
    check_layers(other, loaded[0], {kept, kept});
    CHECK(other.bytes_used() == std::size_t(2 * 6) * 2 * row * sizeof(float));

    // Truncate drops the rows of positions at or past the new length; the
    // next append lands there.
    cache.truncate(a, 6);
    check_layers(cache, a, {{0, 3, 5}, {0, 3, 5}});
    append_rows(cache, a, 2);
    check_layers(cache, a, {{0, 3, 5, 6, 7}, {0, 3, 5, 6, 7}});
    // Truncating below every dropped position makes the sequence whole again.
    cache.truncate(a, 1);
    CHECK_FALSE(cache.compacted(a));
    append_rows(cache, a, 3);
    check_layers(cache, a, {range(0, 4), range(0, 4)});
}

#include "kvcache/cache/sliding_window_cache.hpp"

namespace {

/// The runs of a view entry tile its visible rows exactly: each run's
/// positions are the visible positions in order, and its rows are theirs.
template <class View>
void check_runs(const View& view, int seq, int layer) {
    int v = 0;
    const int n = view.visible_count(seq);
    while (v < n) {
        const auto r = view.run(seq, 0, v);
        REQUIRE(r.count >= 1);
        REQUIRE(r.first_visible == v);
        for (int c = 0; c < r.count; ++c) {
            INFO("visible " << v + c);
            REQUIRE(v + c < n);
            const int p = view.visible_position(seq, v + c);
            CHECK(p == r.first_position + c);
            CHECK(std::vector<float>(r.keys + c * r.stride, r.keys + c * r.stride + row) == rows_at(p, layer, false));
        }
        v += r.count;
    }
    CHECK(v == n);
}

}  // namespace

TEST_CASE("sliding window: compaction hides the rows not kept where they are, and the ring moves on") {
    // 2 sinks, window 6, max_chunk 2: ring of 7 rows.
    kvcache::sliding_window_cache<float, heads> cache(layers, 2, 6, 2, 2);
    const auto a = cache.add_sequence(), b = cache.add_sequence();
    for (int i = 0; i < 6; ++i) append_rows(cache, a, 2);  // length 12: sinks 0, 1 and ring 5..11
    append_rows(cache, b, 2);
    check_layers(cache, a, {joined({0, 1}, range(5, 12)), joined({0, 1}, range(5, 12))});

    // Visible indices over what the layer holds now: 0 -> p0, 1 -> p1, 2 -> p5, ...
    cache.compact(a, {{0, 2, 3, 6, 8}, {1, 2, 3, 4, 5, 6, 7, 8}});
    CHECK(cache.compacted(a));
    CHECK(cache.length(a) == 12);
    check_layers(cache, a, {{0, 5, 6, 9, 11}, {1, 5, 6, 7, 8, 9, 10, 11}});
    CHECK(cache.bytes_used() == std::size_t(5 + 8 + 2 * 2) * 2 * row * sizeof(float));
    std::vector<float> k(row), v(row);
    CHECK_THROWS_WITH_AS(cache.read(a, 0, 7, 1, k, v), doctest::Contains("position 7 is not stored"), kvcache::error);
    CHECK_THROWS_WITH_AS(cache.write(a, 1, 0, k, v, 1), doctest::Contains("position 0 is not stored"), kvcache::error);

    for (int l = 0; l < layers; ++l) {
        const auto view = cache.view(l, {b, a});
        const auto want = cache.present_positions(a, l);
        REQUIRE(view.visible_count(1) == int(want.size()));
        for (int i = 0; i < view.visible_count(1); ++i) CHECK(view.visible_position(1, i) == want[std::size_t(i)]);
        check_runs(view, 1, l);
        check_runs(view, 0, l);
    }

    // Appends: position 12 and 13 overwrite the rows of 5 and 6 (kept in
    // layer 0), which leave the ring as they would have anyway.
    append_rows(cache, a, 2);
    check_layers(cache, a, {{0, 9, 11, 12, 13}, {1, 7, 8, 9, 10, 11, 12, 13}});
    // A second compaction counts the rows held now.
    cache.compact(a, 0, {0, 2, 4});
    check_layers(cache, a, {{0, 11, 13}, {1, 7, 8, 9, 10, 11, 12, 13}});
    // Once the ring has passed every hole of the ring, only the sink holes stay.
    for (int i = 0; i < 4; ++i) append_rows(cache, a, 2);  // length 22: ring 15..21
    check_layers(cache, a, {joined({0}, range(15, 22)), joined({1}, range(15, 22))});
    for (int l = 0; l < layers; ++l) check_runs(cache.view(l, {a}), 0, l);
}

TEST_CASE("sliding window: refused compactions change nothing; fork and save/load keep the holes") {
    kvcache::sliding_window_cache<float, heads> cache(layers, 3, 4, 1, 1);  // ring of 4
    const auto a = cache.add_sequence();
    for (int i = 0; i < 8; ++i) append_rows(cache, a, 1);  // sink 0, ring 4..7
    const std::string before = [&] {
        std::ostringstream out;
        cache.save(out);
        return out.str();
    }();
    const auto unchanged = [&] {
        std::ostringstream out;
        cache.save(out);
        CHECK(out.str() == before);
        CHECK_FALSE(cache.compacted(a));
    };
    const auto refused = [&](kvcache::error_code code, const std::string& words, auto&& call) {
        try {
            call();
            FAIL("not refused");
        } catch (const kvcache::error& e) {
            CHECK(e.code() == code);
            CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, e.what());
        }
        unchanged();
    };
    refused(kvcache::error_code::not_found, "999", [&] { cache.compact(999, 0, {0}); });
    refused(kvcache::error_code::out_of_range, "layer -1", [&] { cache.compact(a, -1, {0}); });
    refused(kvcache::error_code::out_of_range, "kept[1] = 5 is outside its visible rows [0, 5)",
            [&] { cache.compact(a, 0, {0, 5}); });
    refused(kvcache::error_code::invalid_argument, "kept[1] = 2 does not ascend", [&] { cache.compact(a, 0, {2, 2}); });
    refused(kvcache::error_code::invalid_argument, "3 lists", [&] { cache.compact(a, {{0}, {0}, {0}}); });
    refused(kvcache::error_code::invalid_argument, "layer 1", [&] { cache.compact(a, {{0, 1}, {1, 0}}); });

    // Keeping every row is no compaction.
    cache.compact(a, 0, {0, 1, 2, 3, 4});
    unchanged();

    cache.compact(a, {{0, 2, 4}, {0, 2, 4}});  // positions 0, 5, 7
    const auto f = cache.fork(a);
    check_layers(cache, f, {{0, 5, 7}, {0, 5, 7}});
    std::stringstream file;
    cache.save(file, {a});
    kvcache::sliding_window_cache<float, heads> other(layers, 1, 4, 1, 1);
    const auto loaded = other.load(file);
    REQUIRE(loaded.size() == 1);
    CHECK(other.compacted(loaded[0]));
    check_layers(other, loaded[0], {{0, 5, 7}, {0, 5, 7}});
    append_rows(other, loaded[0], 1);  // position 8 overwrites 4, a hole
    check_layers(other, loaded[0], {{0, 5, 7, 8}, {0, 5, 7, 8}});
    // Layers that differ cannot be saved as one record.
    cache.compact(a, 1, {0});
    std::ostringstream out;
    CHECK_THROWS_WITH_AS(cache.save(out), doctest::Contains("different positions"), kvcache::error);
}
