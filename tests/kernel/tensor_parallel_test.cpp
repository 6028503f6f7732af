// Tensor-parallel shards: the head split's rules worked out by hand, and
// attention over T shard caches, their outputs placed side by side, against
// the unsharded cache on every layout and storage type.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvcache/kvcache.hpp"
#include "support/attention_harness.hpp"

namespace {

using namespace kvcache;

TEST_CASE("shard_heads splits the KV heads evenly, or replicates them past the KV head count") {
    SUBCASE("32q/8kv over 2 ranks: rank 1 holds KV heads 4..7 and their query heads 16..31") {
        const head_shard s = shard_heads({32, 8, 128}, 1, 2);
        CHECK(s.shard == head_shape{16, 4, 128});
        CHECK(s.first_query_head == 16);
        CHECK(s.first_kv_head == 4);
        CHECK(s.kv_replicas == 1);
        CHECK(s.to_string() == "rank 1 of 2: 16q/4kv/d128 of 32q/8kv/d128");
    }
    SUBCASE("32q/8kv over 8 ranks: one KV head and its group of 4 each") {
        const head_shard s = shard_heads({32, 8, 128}, 5, 8);
        CHECK(s.shard == head_shape{4, 1, 128});
        CHECK(s.first_query_head == 20);
        CHECK(s.first_kv_head == 5);
    }
    SUBCASE("32q/8kv over 16 ranks: each KV head on two ranks, half its group each") {
        const head_shard s = shard_heads({32, 8, 128}, 5, 16);
        CHECK(s.shard == head_shape{2, 1, 128});
        CHECK(s.first_query_head == 10);  // query heads 10, 11: group of KV head 10 / 4 = 2
        CHECK(s.first_kv_head == 2);
        CHECK(s.kv_replicas == 2);
    }
    SUBCASE("multi-query 8q/1kv over 4 ranks: the one KV head everywhere") {
        for (int r = 0; r < 4; ++r) {
            const head_shard s = shard_heads({8, 1, 64}, r, 4);
            CHECK(s.shard == head_shape{2, 1, 64});
            CHECK(s.first_query_head == 2 * r);
            CHECK(s.first_kv_head == 0);
            CHECK(s.kv_replicas == 4);
        }
    }
    SUBCASE("one rank is the model") {
        const head_shard s = shard_heads({28, 4, 128}, 0, 1);
        CHECK(s.shard == s.model);
    }
    SUBCASE("the runtime configuration of a shard keeps layout and element type") {
        const runtime_configuration model{layout_kind::sliding_window, element_kind::bf16, {32, 8, 128}};
        const runtime_configuration shard = shard_of(model, 3, 4);
        CHECK(shard.layout == layout_kind::sliding_window);
        CHECK(shard.element == element_kind::bf16);
        CHECK(shard.heads == head_shape{8, 2, 128});
    }
    SUBCASE("the compiled form agrees") {
        CHECK(shape_of<shard_heads_t<head_config<32, 8, 128>, 2>>() == head_shape{16, 4, 128});
        CHECK(shape_of<shard_heads_t<head_config<32, 8, 128>, 16>>() == head_shape{2, 1, 128});
        CHECK(shape_of<shard_heads_t<head_config<28, 4, 128>, 4>>() == head_shape{7, 1, 128});
    }
}

TEST_CASE("shard_heads refuses a group size that does not divide what must be divided") {
    const auto message = [](const head_shape& model, int rank, int ranks) {
        try {
            shard_heads(model, rank, ranks);
        } catch (const error& e) {
            CHECK(e.code() == error_code::invalid_argument);
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK(message({32, 8, 128}, 0, 3) ==
          "kvcache: invalid_argument: query_heads = 32 of 32q/8kv/d128 is not divisible by 3 tensor-parallel ranks");
    CHECK(message({24, 6, 128}, 0, 4) ==
          "kvcache: invalid_argument: kv_heads = 6 of 24q/6kv/d128 is not divisible by 4 tensor-parallel ranks");
    CHECK(message({48, 6, 64}, 0, 8) ==
          "kvcache: invalid_argument: tensor-parallel ranks = 8 exceed kv_heads = 6 of 48q/6kv/d64 but are not a "
          "multiple of it (each KV head must be replicated on the same number of ranks)");
    CHECK(message({32, 8, 128}, 2, 2) == "kvcache: invalid_argument: rank = 2 is outside [0, 2) for 2 tensor-parallel ranks");
    CHECK(message({32, 8, 128}, -1, 2) == "kvcache: invalid_argument: rank = -1 is outside [0, 2) for 2 tensor-parallel ranks");
    CHECK(message({32, 8, 128}, 0, 0) == "kvcache: invalid_argument: tensor-parallel ranks = 0 must be at least 1");
    CHECK(message({32, 6, 128}, 0, 2).find("not a multiple of kv_heads") != std::string::npos);  // the model itself
}

TEST_CASE("shard row helpers check sizes and name the buffer") {
    const head_shard s = shard_heads({8, 2, 16}, 1, 2);
    std::vector<float> model(3 * 2 * 16), shard(2 * 1 * 16);  // 3 tokens in, room for 2
    CHECK_THROWS_WITH_AS(shard_kv_rows(s, model, shard),
                         "kvcache: invalid_argument: out holds 32 elements but 3 tokens x (heads x head_dim) 16 = 48 "
                         "are needed",
                         error);
    std::vector<float> ragged(2 * 16 + 5);
    CHECK_THROWS_WITH_AS(shard_kv_rows(s, ragged, shard),
                         "kvcache: invalid_argument: model_rows holds 37 elements, not a whole number of tokens of 2 "
                         "heads x head_dim 16",
                         error);
    // The slices themselves: token t, head h of the model holds 100 t + h.
    std::vector<float> rows(3 * 8 * 16);
    for (int t = 0; t < 3; ++t)
        for (int h = 0; h < 8; ++h)
            for (int d = 0; d < 16; ++d) rows[(t * 8 + h) * 16 + d] = float(100 * t + h);
    std::vector<float> queries(3 * 4 * 16);
    shard_query_rows(s, rows, queries);
    CHECK(queries[0] == 4.0f);               // token 0, shard head 0 = model head 4
    CHECK(queries[(2 * 4 + 3) * 16] == 207.0f);  // token 2, shard head 3 = model head 7
    std::vector<float> placed(3 * 8 * 16, -1.0f);
    place_shard_outputs(s, queries, placed);
    CHECK(placed[(1 * 8 + 5) * 16 + 7] == 105.0f);
    CHECK(placed[(1 * 8 + 3) * 16 + 7] == -1.0f);  // rank 0's head, untouched
}

// --- attention over shards against the unsharded cache -----------------------

using model_heads = head_config<8, 2, 32>;  // GQA group 4, compiled
using shard_counts = dynamic_heads<32>;     // what a rank built from a runtime shape uses
constexpr int head_dim = 32;

/// A cache of every layout over the model's heads or a shard's.
template <class Element, class Heads>
struct any_cache {
    std::unique_ptr<paged_cache<Element, Heads>> paged;
    std::unique_ptr<dynamic_cache<Element, Heads>> contiguous;
    std::unique_ptr<sliding_window_cache<Element, Heads>> window;

    any_cache(layout_kind kind, const Heads& heads) {
        if (kind == layout_kind::paged) paged = std::make_unique<paged_cache<Element, Heads>>(heads, 1, 24, 8);
        if (kind == layout_kind::contiguous) contiguous = std::make_unique<dynamic_cache<Element, Heads>>(heads, 1, 2, 16);
        if (kind == layout_kind::sliding_window)
            window = std::make_unique<sliding_window_cache<Element, Heads>>(heads, 1, 2, 16, 4, 40);
        visit([](auto& cache) {
            if constexpr (is_scaled_element_v<Element>) cache.set_scales(0, kv_scales{0.5f, 0.25f});
        });
    }
    template <class Function>
    void visit(Function&& function) {
        if (paged) function(*paged);
        if (contiguous) function(*contiguous);
        if (window) function(*window);
    }
};

/// One step on a cache: append the step's K/V, then prefill (or decode when
/// every sequence has one new token); returns the outputs.
template <class Cache, class Backend>
std::vector<float> attend(Cache& cache, const Backend& backend, const std::vector<sequence_id>& batch,
                          const std::vector<int>& new_tokens, const std::vector<float>& keys,
                          const std::vector<float>& values, const std::vector<float>& queries,
                          const attention_options& options) {
    const auto plan = cache.plan(batch, new_tokens);
    const auto view = plan.view(0);
    backend.append(append_params(view, keys, values, plan.new_token_offsets()));
    std::vector<float> outputs(queries.size());
    if (plan.total_new_tokens() == plan.size()) {
        decode_params call(view, queries, outputs);
        call.options = options;
        backend.decode(call);
    } else {
        prefill_params call(view, queries, plan.new_token_offsets(), outputs);
        call.options = options;
        backend.prefill(call);
    }
    return outputs;
}

/// Prompts of 37 and 20 tokens, then four batched decode steps, on the model's
/// cache and on `ranks` shard caches fed the shard's slices of the same K/V and
/// queries; each step's placed shard outputs must match the model's. The
/// reference's (double per head, rounded once) must be equal to the bit; the
/// CPU backend's within FP32 accumulation error.
template <class Element>
void check_shards(layout_kind kind, int ranks) {
    const head_shape model = shape_of<model_heads>();
    INFO(to_string(kind) << " " << element_traits<Element>::name << " cache over " << ranks << " ranks");
    attention_options options;
    if (kind != layout_kind::sliding_window) {  // the sliding-window cache masks by its own window
        options.window = 12;
        options.sinks = 2;
    }
    options.logits_soft_cap = 8.0f;

    const reference_backend reference;
    const cpu_backend cpu;
    any_cache<Element, model_heads> whole_ref(kind, model_heads{}), whole_cpu(kind, model_heads{});
    std::vector<head_shard> shards;
    std::vector<std::unique_ptr<any_cache<Element, shard_counts>>> ref_shards, cpu_shards;
    for (int r = 0; r < ranks; ++r) {
        shards.push_back(shard_heads(model, r, ranks));
        const shard_counts counts(shards.back().shard);
        ref_shards.push_back(std::make_unique<any_cache<Element, shard_counts>>(kind, counts));
        cpu_shards.push_back(std::make_unique<any_cache<Element, shard_counts>>(kind, counts));
    }
    // Every cache adds its two sequences in the same order, so the ids agree.
    std::vector<sequence_id> batch;
    whole_ref.visit([&](auto& c) { batch = {c.add_sequence(), c.add_sequence()}; });
    whole_cpu.visit([&](auto& c) { c.add_sequence(), c.add_sequence(); });
    for (int r = 0; r < ranks; ++r) {
        ref_shards[r]->visit([&](auto& c) { c.add_sequence(), c.add_sequence(); });
        cpu_shards[r]->visit([&](auto& c) { c.add_sequence(), c.add_sequence(); });
    }

    unsigned seed = 7;
    const std::vector<std::vector<int>> steps = {{37, 20}, {1, 1}, {1, 1}, {1, 1}, {1, 1}};
    for (std::size_t step = 0; step < steps.size(); ++step) {
        const int tokens = steps[step][0] + steps[step][1];
        const auto keys = kvcache_test::random_rows<float>(std::size_t(tokens) * model.kv_heads * head_dim, 1.0f, seed++);
        const auto values = kvcache_test::random_rows<float>(keys.size(), 1.0f, seed++);
        const auto queries =
            kvcache_test::random_rows<float>(std::size_t(tokens) * model.query_heads * head_dim, 2.0f, seed++);
        std::vector<float> expected_ref, expected_cpu;
        whole_ref.visit([&](auto& c) { expected_ref = attend(c, reference, batch, steps[step], keys, values, queries, options); });
        whole_cpu.visit([&](auto& c) { expected_cpu = attend(c, cpu, batch, steps[step], keys, values, queries, options); });

        std::vector<float> placed_ref(expected_ref.size(), 1e9f), placed_cpu(expected_cpu.size(), 1e9f);
        for (int r = 0; r < ranks; ++r) {
            const head_shard& s = shards[r];
            std::vector<float> shard_keys(std::size_t(tokens) * s.shard.kv_heads * head_dim), shard_values(shard_keys.size());
            std::vector<float> shard_queries(std::size_t(tokens) * s.shard.query_heads * head_dim);
            shard_kv_rows(s, keys, shard_keys);
            shard_kv_rows(s, values, shard_values);
            shard_query_rows(s, queries, shard_queries);
            ref_shards[r]->visit([&](auto& c) {
                place_shard_outputs(s, attend(c, reference, batch, steps[step], shard_keys, shard_values, shard_queries, options), placed_ref);
            });
            cpu_shards[r]->visit([&](auto& c) {
                place_shard_outputs(s, attend(c, cpu, batch, steps[step], shard_keys, shard_values, shard_queries, options), placed_cpu);
            });
        }
        INFO("step " << step);
        CHECK(placed_ref == expected_ref);
        double worst = 0;
        for (std::size_t i = 0; i < expected_cpu.size(); ++i)
            worst = std::max(worst, double(std::fabs(placed_cpu[i] - expected_cpu[i])));
        CHECK(worst <= 2e-5);  // outputs are convex combinations of values in [-1, 1] (scaled by 0.25 for fp8)
        double reference_gap = 0;
        for (std::size_t i = 0; i < expected_cpu.size(); ++i)
            reference_gap = std::max(reference_gap, double(std::fabs(placed_cpu[i] - expected_ref[i])));
        CHECK(reference_gap <= 2e-5);
    }
}

template <class Element>
void check_every_layout() {
    for (const layout_kind kind : {layout_kind::contiguous, layout_kind::paged, layout_kind::sliding_window})
        for (const int ranks : {1, 2, 4, 8})  // 4 and 8 ranks exceed the model's 2 KV heads: replicated
            check_shards<Element>(kind, ranks);
}

TEST_CASE("attention over tensor-parallel shards, placed side by side, equals the unsharded attention: fp32") {
    check_every_layout<float>();
}
TEST_CASE("attention over tensor-parallel shards equals the unsharded attention: fp16") { check_every_layout<half>(); }
TEST_CASE("attention over tensor-parallel shards equals the unsharded attention: bf16") { check_every_layout<bfloat16>(); }
TEST_CASE("attention over tensor-parallel shards equals the unsharded attention: fp8 e4m3") {
    check_every_layout<float8_e4m3>();
}

TEST_CASE("a shard compiled with shard_heads_t runs as the dynamic one does") {
    using compiled = shard_heads_t<model_heads, 2>;  // head_config<4, 1, 32>
    const head_shard s = shard_heads<model_heads>(1, 2);
    REQUIRE(shape_of<compiled>() == s.shard);
    paged_cache<float, model_heads> whole(1, 8, 8);
    paged_cache<float, compiled> shard(1, 8, 8);
    const std::vector<sequence_id> batch = {whole.add_sequence()};
    shard.add_sequence();
    const int tokens = 11;
    const auto keys = kvcache_test::random_rows<float>(std::size_t(tokens) * 2 * head_dim, 1.0f, 3);
    const auto values = kvcache_test::random_rows<float>(keys.size(), 1.0f, 4);
    const auto queries = kvcache_test::random_rows<float>(std::size_t(tokens) * 8 * head_dim, 2.0f, 5);
    std::vector<float> shard_keys(keys.size() / 2), shard_values(keys.size() / 2), shard_queries(queries.size() / 2);
    shard_kv_rows(s, keys, shard_keys);
    shard_kv_rows(s, values, shard_values);
    shard_query_rows(s, queries, shard_queries);
    const reference_backend reference;
    const auto expected = attend(whole, reference, batch, {tokens}, keys, values, queries, {});
    std::vector<float> placed(expected.size(), 0.0f);
    place_shard_outputs(s, attend(shard, reference, batch, {tokens}, shard_keys, shard_values, shard_queries, {}), placed);
    for (int t = 0; t < tokens; ++t)  // rank 1's heads (4..7) of every token
        for (int i = 4 * head_dim; i < 8 * head_dim; ++i)
            CHECK(placed[std::size_t(t) * 8 * head_dim + i] == expected[std::size_t(t) * 8 * head_dim + i]);
}

}  // namespace
