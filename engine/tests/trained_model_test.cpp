// The model trained by tools/train_model/train.py and shipped in models/: loaded by the
// engine and evaluated through the cached decode path (evaluation.hpp), its held-out
// perplexity and recall answers agree with what PyTorch recorded at the end of training
// (results.json beside the weights): an oracle independent of the engine.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_paths.hpp"

#include "kvcache_engine/checkpoint_loader.hpp"
#include "kvcache_engine/evaluation.hpp"
#include "kvcache_engine/evaluation_data.hpp"

using namespace kvcache::examples;

namespace {

/// The shipped model (models/handbook-byte-llama; CTest sets KVCACHE_TRAINED_MODEL_DIR).
const std::string& model_dir() {
    static const std::string dir = kvcache_test::directory_from_environment("KVCACHE_TRAINED_MODEL_DIR");
    return dir;
}

// The shipped model's head shape only: each configuration instantiates the whole cached path.
using trained_configurations = configurations_for<kvcache::head_config<8, 2, 32>>;

// Prefixes keep the test to seconds; PyTorch recorded every window and query, so any
// prefix is checked against its own figures.
constexpr int heldout_windows = 6;
constexpr int recall_texts = 16;

// PyTorch computed in float32 on the same F16 weights; the engine computes in float with
// other summation orders. Its logits on this model differ from a double-precision reference
// by at most 2.5e-6 (example_06_llama_trained_matches_reference prints the figure), so a
// token's negative log-likelihood moves by at most about 5e-6 against either; 1e-4 nats per
// token leaves a factor of twenty, and a wrong weight, rotation or cache read moves it by
// tenths of a nat.
constexpr double nats_per_token_tolerance = 1e-4;
// A query whose PyTorch top-1 minus top-2 logit gap (recorded to 1e-5) is at least this
// wide cannot flip under logit differences of a few 1e-6; narrower ones may, and are not
// compared.
constexpr double decisive_margin = 1e-4;

nlohmann::json recorded() { return nlohmann::json::parse(read_file_bytes(model_dir() + "/results.json")); }

llama_model load_model(thread_pool& pool) {
    return llama_model(load_checkpoint(model_dir(), read_model_config(model_dir())), pool);
}

}  // namespace

TEST_CASE("the trained model's held-out perplexity through the cache matches PyTorch's") {
    const nlohmann::json sample = recorded()["heldout_sample"];
    const int window_bytes = sample["window_bytes"].get<int>();
    const std::vector<double> torch_nats = sample["window_nats"].get<std::vector<double>>();
    thread_pool pool(1);
    llama_model model = load_model(pool);
    const int bos = 256;
    const auto windows =
        byte_windows(read_file_bytes(model_dir() + "/" + sample["file"].get<std::string>()), window_bytes, bos,
                     heldout_windows);
    REQUIRE(windows.size() == static_cast<std::size_t>(heldout_windows));
    REQUIRE(torch_nats.size() >= windows.size());

    for (auto layout : {kvcache::layout_kind::paged, kvcache::layout_kind::contiguous}) {
        CAPTURE(std::string(kvcache::to_string(layout)));
        cache_options cache;
        cache.layout = layout;
        const perplexity_result engine = evaluate_perplexity<trained_configurations>(model, windows, cache);
        REQUIRE(engine.sequence_nats.size() == windows.size());
        CHECK(engine.predicted_tokens == std::int64_t(heldout_windows) * window_bytes);
        double torch_total = 0, largest = 0;
        for (std::size_t w = 0; w < windows.size(); ++w) {
            CAPTURE(w);
            const double difference = std::fabs(engine.sequence_nats[w] - torch_nats[w]) / window_bytes;
            CHECK(difference <= nats_per_token_tolerance);
            largest = std::max(largest, difference);
            torch_total += torch_nats[w];
        }
        const double torch_bits = torch_total / double(engine.predicted_tokens) / std::log(2.0);
        MESSAGE("held-out bits/byte over ", heldout_windows, " windows: engine ", engine.bits_per_token(),
                ", PyTorch ", torch_bits, "; largest difference of a window ", largest, " nats per token");
        CHECK(std::fabs(engine.bits_per_token() - torch_bits) <= nats_per_token_tolerance / std::log(2.0));
    }
}

TEST_CASE("the trained model answers the shipped recall queries as PyTorch recorded") {
    const nlohmann::json set = recorded()["recall_set"];
    const std::vector<bool> torch_correct = set["correct"].get<std::vector<bool>>();
    const std::vector<double> margins = set["margins"].get<std::vector<double>>();
    const std::vector<std::vector<int>> torch_predicted = set["predicted"].get<std::vector<std::vector<int>>>();
    std::vector<recall_item> items = read_recall_set(model_dir() + "/" + set["file"].get<std::string>());
    REQUIRE(items.size() >= static_cast<std::size_t>(recall_texts));
    items.resize(recall_texts);
    thread_pool pool(1);
    llama_model model = load_model(pool);

    const recall_result engine = evaluate_recall<trained_configurations>(model, items);
    REQUIRE(engine.correct.size() <= torch_correct.size());
    REQUIRE(engine.predicted.size() == engine.correct.size());
    int compared = 0, torch_right = 0;
    for (std::size_t q = 0; q < engine.correct.size(); ++q) {
        torch_right += torch_correct[q];
        if (margins[q] < decisive_margin) continue;
        CAPTURE(q);
        // The same argmax bytes, right or wrong: a check that holds whatever the accuracy.
        CHECK(engine.predicted[q] == torch_predicted[q]);
        CHECK(engine.correct[q] == torch_correct[q]);
        ++compared;
    }
    const double torch_accuracy = double(torch_right) / double(engine.correct.size());
    MESSAGE("recall accuracy over ", engine.correct.size(), " queries: engine ", engine.accuracy(), ", PyTorch ",
            torch_accuracy, " (", compared, " compared, the rest within ", decisive_margin, " of a tie)");
    CHECK(compared * 10 >= static_cast<int>(engine.correct.size()) * 9);
    CHECK(std::fabs(engine.accuracy() - torch_accuracy) <=
          double(engine.correct.size() - compared) / double(engine.correct.size()) + 1e-12);
}

// Issue 15's third trigger: a pool too small for the whole generation finishes when the
// policy also compacts whenever the pool runs short, and refuses without it. The oracle
// for the tokens is the same streaming policy compacting after every pass in a pool
// large enough for everything: a threshold no pass can meet makes the short pool
// compact after every pass too, so the two runs hold the same rows at every step.
TEST_CASE("compaction when the pool runs short lets a small pool finish the generation") {
    using heads = kvcache::head_config<8, 2, 32>;
    using owner = kvcache::paged_cache<float, heads>;
    thread_pool pool(1);
    llama_model model = load_model(pool);
    const int layers = model.config().num_layers;
    const std::string text = read_file_bytes(model_dir() + "/" + recorded()["heldout_sample"]["file"].get<std::string>());
    std::vector<int> prompt = {256};
    for (int i = 0; i < 47; ++i) prompt.push_back(static_cast<unsigned char>(text[std::size_t(i)]));
    const int new_tokens = 40, page = 4;
    // 48 + 40 rows need 22 pages; the budget of 24 rows needs 6, and 14 leave room for the prompt.
    const int small_pool = 14;

    compression_options streaming;
    streaming.policy = kvcache::eviction_policy::streaming;
    streaming.budget = kvcache::eviction_budget::of_tokens(24);
    streaming.compress_every = 0;  // after the prefill only: the decode steps grow past the pool

    SUBCASE("without the trigger the small pool runs out") {
        owner cache(heads{}, layers, small_pool, page, false);
        try {
            (void)detail::generate_in<kvcache_attention>(cache, model, prompt, new_tokens, {}, streaming);
            FAIL("the generation fitted a pool it cannot fit");
        } catch (const kvcache::error& e) {
            CHECK(e.code() == kvcache::error_code::capacity_exceeded);
        }
    }
    SUBCASE("with it the generation finishes, compacting only when the pool is short") {
        compression_options triggered = streaming;
        triggered.compress_when_free_below = 2;
        owner cache(heads{}, layers, small_pool, page, false);
        const cached_generation run = detail::generate_in<kvcache_attention>(cache, model, prompt, new_tokens, {}, triggered);
        CHECK(run.trace.tokens.size() == std::size_t(new_tokens));
        // After the prefill's, each compaction drops 40-odd rows back to 24: a few, not one a step.
        CHECK(run.compactions > 1);
        CHECK(run.compactions < new_tokens / 4);
        MESSAGE("pool of ", small_pool, " pages, trigger below 2 free: ", run.compactions, " compactions");
    }
    SUBCASE("a trigger met after every pass gives the tokens of compacting every step") {
        compression_options always = streaming;
        always.compress_when_free_below = small_pool + 1;
        owner small(heads{}, layers, small_pool, page, false);
        const cached_generation triggered = detail::generate_in<kvcache_attention>(small, model, prompt, new_tokens, {}, always);
        compression_options every_step = streaming;
        every_step.compress_every = 1;
        owner large(heads{}, layers, 64, page, false);
        const cached_generation reference = detail::generate_in<kvcache_attention>(large, model, prompt, new_tokens, {}, every_step);
        CHECK(triggered.trace.tokens == reference.trace.tokens);
        CHECK(triggered.compactions == reference.compactions);
        CHECK(triggered.rows_held == reference.rows_held);
    }
}

TEST_CASE("a negative pool threshold is refused naming the value") {
    compression_options options;
    options.policy = kvcache::eviction_policy::streaming;
    options.budget = kvcache::eviction_budget::of_tokens(24);
    options.compress_when_free_below = -3;
    CHECK_THROWS_WITH_AS(options.validate(), doctest::Contains("compress_when_free_below = -3 is negative"),
                         kvcache::error);
}
