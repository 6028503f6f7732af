// The eviction-policy layer: every expected row set below is worked out by
// hand from the scores written next to it.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kvcache/core/float8.hpp"
#include "kvcache/layout/contiguous_view.hpp"
#include "kvcache/policy.hpp"

using namespace kvcache;

namespace {

using rows_t = std::vector<int>;

/// The message of the kvcache::error run() throws ("no error" when none).
template <class Run>
std::string message_of(Run&& run) {
    try {
        run();
    } catch (const kvcache::error& e) {
        return e.what();
    }
    return "no error";
}

bool mentions(const std::string& message, const std::string& part) {
    INFO(message);
    return message.find(part) != std::string::npos;
}

selection_options options_for(eviction_policy policy, int sinks, int recent) {
    selection_options options;
    options.policy = policy;
    options.sinks = sinks;
    options.recent = recent;
    return options;
}

row_scores one_head(const std::vector<float>& scores) { return {scores, 1, int(scores.size())}; }

}  // namespace

TEST_CASE("policies: names round-trip, and which need scores") {
    for (const char* name : {"none", "streaming", "h2o", "snapkv", "tova", "knorm", "random"})
        CHECK(std::string(to_string(parse_eviction_policy(name))) == name);
    CHECK(mentions(message_of([] { parse_eviction_policy("lru"); }), "eviction policy 'lru' is unknown"));
    CHECK(needs_scores(eviction_policy::h2o));
    CHECK(needs_scores(eviction_policy::knorm));
    CHECK_FALSE(needs_scores(eviction_policy::streaming));
    CHECK_FALSE(needs_scores(eviction_policy::random));
}

TEST_CASE("policies: each selects what its definition selects on hand-made scores") {
    // h2o, one head, rows 0..9, sink 0 and recent 8, 9 kept; the middle's two
    // highest are rows 4 and 6 (7 each).
    const std::vector<float> heavy = {9, 1, 5, 0, 7, 3, 7, 0, 0, 0};
    CHECK(select_rows(options_for(eviction_policy::h2o, 1, 2), 5, 10, one_head(heavy)) == rows_t{0, 4, 6, 8, 9});
    // Budget 4: one of the tied rows 4 and 6; the more recent, 6, wins.
    CHECK(select_rows(options_for(eviction_policy::h2o, 1, 2), 4, 10, one_head(heavy)) == rows_t{0, 6, 8, 9});
    // tova ranks the latest query's scores the same way.
    CHECK(select_rows(options_for(eviction_policy::tova, 1, 2), 5, 10, one_head(heavy)) == rows_t{0, 4, 6, 8, 9});

    // Two KV heads, summed: middle rows 1..4 score 5, 0, 4, 4.
    const std::vector<float> two = {0, 5, 0, 0, 0, 0, /* head 1 */ 0, 0, 0, 4, 4, 0};
    const row_scores heads{two, 2, 6};
    CHECK(select_rows(options_for(eviction_policy::h2o, 1, 1), 3, 6, heads) == rows_t{0, 1, 5});
    CHECK(select_rows(options_for(eviction_policy::h2o, 1, 1), 4, 6, heads) == rows_t{0, 1, 4, 5});  // 4 beats 3 (tie)

    // snapkv, pool 3: scores 0 0 0 9 0 0 1 0 pool to 0 0 9 9 9 1 1 1; no sink,
    // recent 7; two of the middle: rows 2, 3, 4 tie at 9, the most recent two win.
    const std::vector<float> spike = {0, 0, 0, 9, 0, 0, 1, 0};
    selection_options snap = options_for(eviction_policy::snapkv, 0, 1);
    snap.pool = 3;
    CHECK(select_rows(snap, 3, 8, one_head(spike)) == rows_t{3, 4, 7});
    CHECK(select_rows(options_for(eviction_policy::h2o, 0, 1), 3, 8, one_head(spike)) == rows_t{3, 6, 7});  // unpooled
    snap.pool = 1;  // a pool of one row is h2o's ranking
    CHECK(select_rows(snap, 3, 8, one_head(spike)) == rows_t{3, 6, 7});

    // knorm: norms 1 5 2 0.5 3 1, sink 0 and recent 5 kept; the lowest middle norm is row 3.
    const std::vector<float> norms = {1, 5, 2, 0.5f, 3, 1};
    CHECK(select_rows(options_for(eviction_policy::knorm, 1, 1), 3, 6, one_head(norms)) == rows_t{0, 3, 5});
    CHECK(select_rows(options_for(eviction_policy::knorm, 1, 1), 4, 6, one_head(norms)) == rows_t{0, 2, 3, 5});

    // streaming: sinks 0, 1; then the most recent budget - sinks rows.
    CHECK(select_rows(options_for(eviction_policy::streaming, 2, 3), 7, 10) == rows_t{0, 1, 5, 6, 7, 8, 9});
    // none keeps everything; any policy keeps everything at or under budget.
    CHECK(select_rows(options_for(eviction_policy::none, 1, 1), 3, 5).size() == 5);
    CHECK(select_rows(options_for(eviction_policy::h2o, 1, 2), 10, 10, one_head(heavy)).size() == 10);
    CHECK(select_rows(options_for(eviction_policy::h2o, 1, 2), 12, 10, one_head(heavy)).size() == 10);
}

TEST_CASE("policies: every policy keeps exactly the budget, ascending, with the sinks and the recent window") {
    const int rows = 50, sinks = 3, recent = 6, budget = 20;
    std::vector<float> scores(2 * 64);
    for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = float((i * 37) % 11) + 0.5f;
    const row_scores two_heads{scores, 2, 64};
    for (const eviction_policy policy : {eviction_policy::streaming, eviction_policy::h2o, eviction_policy::snapkv,
                                         eviction_policy::tova, eviction_policy::knorm, eviction_policy::random}) {
        INFO(to_string(policy));
        const rows_t kept = select_rows(options_for(policy, sinks, recent), budget, rows, two_heads);
        REQUIRE(kept.size() == std::size_t(budget));
        for (std::size_t j = 1; j < kept.size(); ++j) CHECK(kept[j] > kept[j - 1]);
        for (int i = 0; i < sinks; ++i) CHECK(kept[std::size_t(i)] == i);
        for (int i = 0; i < recent; ++i) CHECK(kept[kept.size() - 1 - std::size_t(i)] == rows - 1 - i);
    }
}

TEST_CASE("policies: random is a function of its seed and reaches every middle row") {
    selection_options random = options_for(eviction_policy::random, 1, 1);
    random.seed = 42;
    const rows_t first = select_rows(random, 5, 30);
    CHECK(select_rows(random, 5, 30) == first);
    std::set<int> reached;
    bool differs = false;
    for (std::uint64_t seed = 0; seed < 200; ++seed) {
        random.seed = seed;
        const rows_t kept = select_rows(random, 5, 30);
        differs |= kept != first;
        reached.insert(kept.begin(), kept.end());
    }
    CHECK(differs);
    CHECK(reached.size() == 30);  // rows 1..28 each chosen for some seed, with sink 0 and recent 29
}

TEST_CASE("policies: bad inputs are refused with the value named") {
    const std::vector<float> scores(10, 1.0f);
    CHECK(mentions(message_of([&] { select_rows(options_for(eviction_policy::h2o, 4, 2), 5, 10, one_head(scores)); }),
                   "eviction budget 5 is below sinks 4 + recent 2 = 6"));
    CHECK(mentions(message_of([] { select_rows(options_for(eviction_policy::h2o, 1, 1), 5, 10); }),
                   "eviction policy h2o needs accumulated attention (score_accumulator) but no scores were given"));
    CHECK(mentions(message_of([] { select_rows(options_for(eviction_policy::snapkv, 1, 1), 5, 10); }),
                   "eviction policy snapkv needs"));
    CHECK(mentions(message_of([] { select_rows(options_for(eviction_policy::knorm, 1, 1), 5, 10); }),
                   "eviction policy knorm needs key norms"));
    CHECK(mentions(message_of([&] { select_rows(options_for(eviction_policy::tova, 1, 1), 5, 12, one_head(scores)); }),
                   "row_scores.stride = 10 is below the 12 rows"));
    CHECK(mentions(message_of([&] { select_rows(options_for(eviction_policy::tova, 1, 1), 5, 10, row_scores{scores, 2, 10}); }),
                   "row_scores holds 10 values but kv_heads 2 x stride 10 = 20"));
    selection_options even = options_for(eviction_policy::snapkv, 1, 1);
    even.pool = 4;
    CHECK(mentions(message_of([&] { select_rows(even, 5, 10, one_head(scores)); }), "selection pool = 4 must be odd"));
    std::vector<float> nan = scores;
    nan[3] = std::numeric_limits<float>::quiet_NaN();
    CHECK(mentions(message_of([&] { select_rows(options_for(eviction_policy::h2o, 1, 1), 5, 10, one_head(nan)); }),
                   "score of row 3 of KV head 0 is nan"));
    CHECK(mentions(message_of([] { eviction_budget::of_ratio(0.0); }), "eviction budget ratio 0 is outside (0, 1]"));
    CHECK(mentions(message_of([] { eviction_budget::of_ratio(1.5); }), "eviction budget ratio 1.5 is outside (0, 1]"));
    CHECK(mentions(message_of([] { eviction_budget::of_tokens(0); }), "eviction budget of 0 tokens must be positive"));
    CHECK(mentions(message_of([] { eviction_budget{0, 2.0}.resolve(10); }), "eviction budget ratio 2 is outside (0, 1]"));
    CHECK(mentions(message_of([] { pyramid_budgets(4, 10, 11); }), "pyramid smallest budget 11 exceeds the average budget 10"));
    CHECK(mentions(message_of([] { pyramid_budgets(0, 10, 4); }), "layers = 0 must be positive"));
}

TEST_CASE("budgets: tokens and ratios resolve; pyramid budgets decrease and sum to the uniform total") {
    CHECK(eviction_budget::of_tokens(5).resolve(3) == 3);
    CHECK(eviction_budget::of_tokens(5).resolve(8) == 5);
    CHECK(eviction_budget::of_ratio(0.5).resolve(10) == 5);
    CHECK(eviction_budget::of_ratio(0.25).resolve(10) == 3);  // ceil(2.5)
    CHECK(eviction_budget::of_ratio(1.0).resolve(7) == 7);
    CHECK(uniform_budgets(3, 7) == rows_t{7, 7, 7});
    // 4 layers, average 10, smallest 4: 4 + floor(12 (3 - l) / 3) = 16, 12, 8, 4 (sum 40).
    CHECK(pyramid_budgets(4, 10, 4) == rows_t{16, 12, 8, 4});
    // smallest 5: 5 + floor(10 (3 - l) / 3) = 15, 11, 8, 5 (sum 39); the one row left goes to layer 0.
    CHECK(pyramid_budgets(4, 10, 5) == rows_t{16, 11, 8, 5});
    CHECK(pyramid_budgets(1, 9, 2) == rows_t{9});
    CHECK(pyramid_budgets(5, 8, 8) == rows_t{8, 8, 8, 8, 8});
    for (int layers = 1; layers <= 40; layers += 3)
        for (int smallest = 1; smallest <= 30; smallest += 7) {
            const rows_t budgets = pyramid_budgets(layers, 30, smallest);
            long total = 0;
            for (std::size_t l = 0; l < budgets.size(); ++l) {
                total += budgets[l];
                if (l > 0) CHECK(budgets[l] <= budgets[l - 1]);
            }
            CHECK(total == 30L * layers);
            CHECK(budgets.back() >= smallest);
        }
}

TEST_CASE("key norms: the L2 norm of each visible key row, through an fp8 cache's key scale") {
    using heads = head_config<2, 2, 8>;
    const int capacity = 4;
    const std::vector<int> lengths = {3, 1}, slots = {0, 1};
    auto check = [&](auto element, float scale) {
        using Element = decltype(element);
        std::vector<Element> keys(2 * 2 * capacity * 8, from_float<Element>(0.0f)), values(keys.size());
        auto view = contiguous_view<Element, heads>::packed(keys.data(), values.data(), lengths.data(), slots.data(), 2, capacity);
        view.scales.key = scale;
        // Sequence 0, head 1: rows (3, 4), (0, 0), (1, 1, 1, 1); sequence 1, head 0: (2).
        Element* row = view.key(0, 1, 0);
        row[0] = from_float<Element>(3.0f);
        row[1] = from_float<Element>(4.0f);
        for (int d = 0; d < 4; ++d) view.key(0, 1, 2)[d] = from_float<Element>(1.0f);
        view.key(1, 0, 0)[5] = from_float<Element>(2.0f);
        std::vector<float> norms(2 * 2 * 5, 7.0f);
        key_norms(view, span<float>(norms), 5);
        const std::vector<float> expected = {0, 0, 0, 0, 0, /* seq 0 head 1 */ 5 * scale, 0, 2 * scale, 0, 0,
                                             /* seq 1 head 0 */ 2 * scale, 0, 0, 0, 0, /* seq 1 head 1 */ 0, 0, 0, 0, 0};
        for (std::size_t i = 0; i < norms.size(); ++i) CHECK(norms[i] == doctest::Approx(expected[i]).epsilon(1e-6));
        CHECK(mentions(message_of([&] { key_norms(view, span<float>(norms.data(), 8), 2); }),
                       "batch entry 0 has 3 visible rows but the key_norms stride is 2"));
        CHECK(mentions(message_of([&] { key_norms(view, span<float>(norms.data(), 19), 5); }),
                       "norms holds 19 entries but 2 sequences x 2 kv_heads x stride 5 = 20"));
    };
    check(float{}, 1.0f);
    check(float8_e4m3{}, 2.0f);  // 1, 2, 3, 4 are exact in e4m3
}

TEST_CASE("score accumulator: sums steps, grows with the rows, and follows a compaction") {
    score_accumulator sums(2, 2);
    // Layer 1: a step over 3 rows, then one over 4 (stride 5).
    const std::vector<float> first = {1, 2, 3, 0, 0, /* head 1 */ 4, 5, 6, 0, 0};
    const std::vector<float> second = {1, 1, 1, 1, 0, /* head 1 */ 0, 0, 0, 2, 0};
    sums.add(1, first, 5, 3);
    sums.add(1, second, 5, 4);
    CHECK(sums.rows(1) == 4);
    CHECK(sums.rows(0) == 0);
    const std::vector<float> expected = {2, 3, 4, 1, /* head 1 */ 4, 5, 6, 2};
    CHECK(std::vector<float>(sums.scores(1).begin(), sums.scores(1).end()) == expected);
    // Keeping rows 0, 2, 3 keeps their sums, for both heads.
    const std::vector<int> kept = {0, 2, 3};
    sums.keep(1, kept);
    CHECK(sums.rows(1) == 3);
    CHECK(std::vector<float>(sums.scores(1).begin(), sums.scores(1).end()) == std::vector<float>{2, 4, 1, 4, 6, 2});
    // A later step adds into the compacted rows and a new one.
    sums.add(1, second, 5, 4);
    CHECK(std::vector<float>(sums.scores(1).begin(), sums.scores(1).end()) == std::vector<float>{3, 5, 2, 1, 4, 6, 2, 2});
    // Wrong input: nothing changes.
    const std::vector<float> before(sums.scores(1).begin(), sums.scores(1).end());
    const std::vector<int> past = {0, 4}, descending = {2, 1}, row_zero = {0};
    CHECK(mentions(message_of([&] { sums.keep(1, past); }), "kept[1] = 4 is outside the 4 rows of layer 1"));
    CHECK(mentions(message_of([&] { sums.keep(1, descending); }), "kept[1] = 1 does not ascend from kept[0] = 2"));
    CHECK(mentions(message_of([&] { sums.add(1, first, 5, 3); }), "rows = 3 is below the 4 rows layer 1 holds"));
    CHECK(mentions(message_of([&] { sums.add(1, first, 4, 4); }), "scores hold 10 values but kv_heads 2 x stride 4 = 8"));
    CHECK(mentions(message_of([&] { sums.add(2, first, 5, 3); }), "score_accumulator layer 2 is outside [0, 2)"));
    // keep() of every layer checks all first: layer 0 holds no rows, so row 0 is refused and layer 1 stays.
    CHECK(mentions(message_of([&] { sums.keep(row_zero); }), "kept[0] = 0 is outside the 0 rows of layer 0"));
    CHECK(std::vector<float>(sums.scores(1).begin(), sums.scores(1).end()) == before);
    // With h2o: the accumulated sums of a layer rank its rows.
    const row_scores accumulated{sums.scores(1), 2, sums.rows(1)};  // head sums 5, 11, 4, 3
    CHECK(select_rows(options_for(eviction_policy::h2o, 1, 1), 3, 4, accumulated) == rows_t{0, 1, 3});
}
