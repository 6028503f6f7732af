// The engine's eviction plumbing (kvcache_engine/compression.hpp): budgets per layer, what each
// policy asks the kernels for and keeps between compactions, and the library's errors for bad
// input. The figures are worked out by hand from the definitions in docs/kernels.md.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kvcache_engine/compression.hpp"

using namespace kvcache;
using namespace kvcache::examples;

namespace {

std::string message_of(const compression_options& options) {
    try {
        options.validate();
    } catch (const kvcache::error& e) {
        return e.what();
    }
    return "";
}

compression_options with(eviction_policy policy, eviction_budget budget) {
    compression_options options;
    options.policy = policy;
    options.budget = budget;
    return options;
}

}  // namespace

TEST_CASE("bad budgets are refused with the library's messages naming the value") {
    CHECK(message_of(with(eviction_policy::h2o, eviction_budget::of_tokens(6))).find(
              "eviction budget 6 is below sinks 4 + recent 8 = 12") != std::string::npos);
    eviction_budget bad_ratio;
    bad_ratio.ratio = 1.5;
    CHECK(message_of(with(eviction_policy::h2o, bad_ratio)).find("eviction budget ratio 1.5 is outside (0, 1]") !=
          std::string::npos);
    compression_options negative = with(eviction_policy::tova, eviction_budget::of_tokens(20));
    negative.compress_every = -1;
    CHECK(message_of(negative).find("compress_every = -1 is negative") != std::string::npos);
    CHECK(message_of(with(eviction_policy::tova, eviction_budget::of_tokens(12))).empty());
}

TEST_CASE("layer budgets: tokens, a ratio of the length raised to sinks + recent, pyramid") {
    CHECK(with(eviction_policy::h2o, eviction_budget::of_tokens(20)).layer_budgets(4, 100) ==
          std::vector<int>{20, 20, 20, 20});
    CHECK(with(eviction_policy::h2o, eviction_budget::of_ratio(0.25)).layer_budgets(2, 100) == std::vector<int>{25, 25});
    // 5% of 100 is 5, below the 12 rows sinks and recent always keep.
    CHECK(with(eviction_policy::h2o, eviction_budget::of_ratio(0.05)).layer_budgets(2, 100) == std::vector<int>{12, 12});
    compression_options pyramid = with(eviction_policy::snapkv, eviction_budget::of_tokens(24));
    pyramid.pyramid = true;
    // Smallest max(12, 24 / 2) = 12; spread 2 x (24 - 12) = 24 over 3 steps: 36, 28, 20, 12 (sum 96 = 4 x 24).
    CHECK(pyramid.layer_budgets(4, 100) == std::vector<int>{36, 28, 20, 12});
}

TEST_CASE("what each policy asks the kernels for") {
    const compression_options snapkv = with(eviction_policy::snapkv, eviction_budget::of_tokens(20));
    CHECK(policy_scores(snapkv, 2, 1).wanted());
    CHECK(policy_scores(snapkv, 2, 1).prefill_queries(100) == 16);
    CHECK(policy_scores(snapkv, 2, 1).prefill_queries(5) == 5);
    CHECK(policy_scores(with(eviction_policy::tova, eviction_budget::of_tokens(20)), 2, 1).prefill_queries(100) == 1);
    CHECK(policy_scores(with(eviction_policy::h2o, eviction_budget::of_tokens(20)), 2, 1).prefill_queries(100) == 0);
    for (eviction_policy p : {eviction_policy::knorm, eviction_policy::streaming, eviction_policy::random})
        CHECK_FALSE(policy_scores(with(p, eviction_budget::of_tokens(20)), 2, 1).wanted());
}

TEST_CASE("h2o sums every step and carries the kept rows' sums; tova keeps the latest step") {
    const std::vector<float> first{0.5f, 0.25f, 0.25f}, second{0.125f, 0.5f, 0.25f, 0.125f};
    policy_scores h2o(with(eviction_policy::h2o, eviction_budget::of_tokens(20)), 1, 1);
    h2o.record(0, first, 3, 3, true);
    h2o.record(0, second, 4, 4, false);
    row_scores s = h2o.of(0);
    REQUIRE(s.stride == 4);
    CHECK(std::vector<float>(s.values.begin(), s.values.end()) == std::vector<float>{0.625f, 0.75f, 0.5f, 0.125f});
    h2o.kept(0, {1, 3});
    s = h2o.of(0);
    REQUIRE(s.stride == 2);
    CHECK(std::vector<float>(s.values.begin(), s.values.end()) == std::vector<float>{0.75f, 0.125f});

    policy_scores tova(with(eviction_policy::tova, eviction_budget::of_tokens(20)), 1, 1);
    tova.record(0, first, 3, 3, true);
    tova.record(0, second, 4, 4, false);
    s = tova.of(0);
    CHECK(std::vector<float>(s.values.begin(), s.values.end()) == second);
    tova.kept(0, {0, 1});
    CHECK(tova.of(0).values.empty());  // the next step's scores start again
}

TEST_CASE("a policy whose scores were not produced is refused by select_rows, naming what it needs") {
    const compression_options options = with(eviction_policy::h2o, eviction_budget::of_tokens(12));
    policy_scores nothing(options, 2, 2);
    try {
        select_rows(options.selection(0, 0), 12, 30, nothing.of(0));
        FAIL("select_rows accepted h2o without scores");
    } catch (const kvcache::error& e) {
        CHECK(std::string(e.what()).find("eviction policy h2o needs accumulated attention (score_accumulator) but no "
                                         "scores were given") != std::string::npos);
    }
}

TEST_CASE("the schedule: after a prefill, then every N decode passes") {
    compaction_schedule every_3(3);
    CHECK(every_3.due_after(true));
    every_3.compacted();
    CHECK_FALSE(every_3.due_after(false));
    CHECK_FALSE(every_3.due_after(false));
    CHECK(every_3.due_after(false));
    CHECK(every_3.due_after(false));  // not compacted (within budget): due until it runs
    every_3.compacted();
    CHECK(every_3.count() == 2);
    compaction_schedule prefill_only(0);
    CHECK_FALSE(prefill_only.due_after(false));
    CHECK(prefill_only.due_after(true));
}
