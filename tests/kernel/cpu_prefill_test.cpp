// CPU prefill at explicit query positions (what cascade attention over a
// shared prefix needs) against the reference, on every layout: positions out
// of order, repeated, past the sequence's length, more query tokens than
// keys, inside and outside a window with sinks.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/reference.hpp"
#include "support/attention_harness.hpp"
#include "support/layout_factories.hpp"

using namespace kvcache;
using namespace kvcache_test;

namespace {

/// Query tokens per sequence and their positions for one context case.
struct query_set {
    std::vector<int> offsets{0};
    std::vector<int> positions;
};

/// For each sequence: `tokens[b]` positions drawn from [0, length + 8), so
/// some lie past the last key, in no order and with repeats.
query_set random_positions(const std::vector<int>& lengths, const std::vector<int>& tokens, unsigned seed) {
    std::mt19937 random(seed);
    query_set q;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        std::uniform_int_distribution<int> position(0, lengths[b] + 7);
        for (int t = 0; t < tokens[b]; ++t) q.positions.push_back(position(random));
        q.offsets.push_back(q.offsets.back() + tokens[b]);
    }
    return q;
}

/// The params of a prefill at the query set's positions.
template <class View, class Query>
prefill_params<View, Query> at_positions(const View& view, const std::vector<Query>& queries, const query_set& q,
                                         std::vector<Query>& outputs, std::vector<float>& lse,
                                         const attention_options& options) {
    prefill_params<View, Query> call(view, queries, q.offsets, outputs);
    call.lse = lse;
    call.query_positions = q.positions;
    call.options = options;
    return call;
}

/// cpu_backend's prefill at explicit positions.
template <class View, class Query>
void cpu_prefill_at(const View& view, const std::vector<Query>& queries, const query_set& q, std::vector<Query>& outputs,
                    std::vector<float>& lse, const attention_options& options) {
    cpu_backend{}.prefill(at_positions(view, queries, q, outputs, lse, options));
}

/// The reference's exact results for the same call.
template <class View, class Query>
reference::attention_result exact_at(const View& view, const std::vector<Query>& queries, const query_set& q,
                                     const attention_options& options) {
    std::vector<Query> unused;
    std::vector<float> unused_lse;
    return reference_backend{}.prefill_exact(at_positions(view, queries, q, unused, unused_lse, options));
}

/// Every standard case at random positions: more tokens than one work item
/// holds (16), and for the short case more tokens than the sequence has keys.
template <class Factory, class Element, class Heads>
void check_positions() {
    unsigned seed = 300;
    for (const context_case& c : standard_cases()) {
        auto cache = Factory::template make<Element, Heads>(c, seed++);
        const auto view = cache->view();
        fill_cache(view, seed++);
        std::vector<int> tokens;
        for (int length : c.lengths) tokens.push_back(length < 16 ? 21 : 37);
        const query_set q = random_positions(c.lengths, tokens, seed++);
        const std::size_t rows = q.positions.size() * Heads::query_heads();
        const auto queries = random_rows<Element>(rows * Heads::head_dim, 3.0f, seed++);
        std::vector<Element> outputs(queries.size(), from_float<Element>(99.0f));
        std::vector<float> lse(rows, 99.0f);
        cpu_prefill_at(view, queries, q, outputs, lse, c.options);
        compare(outputs, lse, exact_at(view, queries, q, c.options),
                std::string("explicit positions, ") + Factory::name + ", " + c.name);
    }
}

}  // namespace

TEST_CASE("cpu prefill at explicit query positions matches the reference on every layout") {
    check_positions<scatter_factory, float, head_config<8, 2, 64>>();
    check_positions<scatter_factory, half, head_config<8, 2, 64>>();
    check_positions<scatter_factory, float, head_config<4, 4, 32>>();
    check_positions<scatter_factory, half, head_config<5, 1, 56>>();
    check_positions<contiguous_factory, half, head_config<4, 1, 32>>();
    check_positions<paged_factory, float, head_config<8, 2, 64>>();
    check_positions<paged_factory, half, head_config<8, 2, 64>>();
    check_positions<sliding_window_factory, float, head_config<8, 2, 64>>();
    check_positions<sliding_window_factory, half, head_config<4, 1, 32>>();
}

TEST_CASE("cpu prefill without positions equals explicit positions at the last n tokens, bit for bit") {
    using heads = head_config<8, 2, 64>;
    for (const context_case& c : standard_cases()) {
        auto cache = paged_factory::make<half, heads>(c, 5);
        const auto view = cache->view();
        fill_cache(view, 6);
        query_set q;
        for (std::size_t b = 0; b < c.lengths.size(); ++b) {
            for (int t = 0; t < c.chunk[b]; ++t) q.positions.push_back(c.lengths[b] - c.chunk[b] + t);
            q.offsets.push_back(q.offsets.back() + c.chunk[b]);
        }
        const std::size_t rows = q.positions.size() * heads::query_heads();
        const auto queries = random_rows<float>(rows * heads::head_dim, 3.0f, 7);
        std::vector<float> implicit(queries.size()), implicit_lse(rows), positioned(queries.size()), positioned_lse(rows);
        prefill_params implicit_call(view, queries, q.offsets, implicit);
        implicit_call.lse = implicit_lse;
        implicit_call.options = c.options;
        cpu_backend{}.prefill(implicit_call);
        cpu_prefill_at(view, queries, q, positioned, positioned_lse, c.options);
        INFO(c.name);
        CHECK(implicit == positioned);
        CHECK(implicit_lse == positioned_lse);
    }
}

TEST_CASE("cascade: queries of other requests attend non-causally to one shared prefix sequence") {
    // One prefix of 150 keys in 12-token pages; 70 query tokens of other
    // requests (more than the prefix has keys), all past its end, so each
    // sees the whole prefix. The prefix state merged with a suffix state is
    // what cascade attention does with these results (merge_states).
    using heads = head_config<8, 2, 64>;
    context_case c{"prefix", {150}, 0, 0, 12, {1}, {}};
    auto cache = paged_factory::make<half, heads>(c, 9);
    const auto view = cache->view();
    fill_cache(view, 10);
    query_set q;
    for (int t = 0; t < 70; ++t) q.positions.push_back(150 + (t * 37) % 500);
    q.offsets.push_back(70);
    const std::size_t rows = 70 * heads::query_heads();
    const auto queries = random_rows<float>(rows * heads::head_dim, 3.0f, 11);
    std::vector<float> outputs(queries.size()), lse(rows);
    cpu_prefill_at(view, queries, q, outputs, lse, attention_options{});
    const auto expected = exact_at(view, queries, q, {});
    compare(outputs, lse, expected, "cascade prefix");
    // Past the end every position sees the same keys: the same as all at position 150.
    query_set at_end = q;
    std::fill(at_end.positions.begin(), at_end.positions.end(), 150);
    compare(outputs, lse, exact_at(view, queries, at_end, {}), "cascade prefix, every query at the end");
}

TEST_CASE("cpu prefill at explicit positions: one thread and several agree bit for bit") {
    using heads = head_config<8, 2, 64>;
    context_case c = standard_cases()[3];  // masked: window 40 with 3 sinks applied by visibility()
    auto cache = scatter_factory::make<float, heads>(c, 12);
    const auto view = cache->view();
    fill_cache(view, 13);
    const query_set q = random_positions(c.lengths, {45, 33}, 14);
    const std::size_t rows = q.positions.size() * heads::query_heads();
    const auto queries = random_rows<float>(rows * heads::head_dim, 3.0f, 15);
    std::vector<float> one(queries.size()), one_lse(rows), several(queries.size()), several_lse(rows);
    cpu::set_thread_count(1);
    cpu_prefill_at(view, queries, q, one, one_lse, c.options);
    cpu::set_thread_count(3);
    cpu_prefill_at(view, queries, q, several, several_lse, c.options);
    cpu::set_thread_count(0);
    CHECK(one == several);
    CHECK(one_lse == several_lse);
}

TEST_CASE("explicit query positions: checks name the bad entry") {
    using heads = head_config<4, 2, 16>;
    context_case c{"short", {5}, 0, 0, 16, {1}, {}};
    auto cache = contiguous_factory::make<float, heads>(c, 1);
    const auto view = cache->view();
    const std::vector<float> queries(2 * heads::query_heads() * heads::head_dim);
    std::vector<float> outputs(queries.size());
    const std::vector<int> offsets = {0, 2};
    const std::vector<int> negative = {3, -1}, short_positions = {3};
    auto check = [&](const std::vector<int>& positions) {
        prefill_params call(view, queries, offsets, outputs);
        call.query_positions = positions;
        cpu_backend{}.prefill(call);
    };
    CHECK_THROWS_WITH_AS(check(negative), doctest::Contains("query_positions[1] = -1 of batch entry 0 is negative"),
                         kvcache::error);
    CHECK_THROWS_WITH_AS(check(short_positions), doctest::Contains("query_positions has 1 entries but the batch has 2"),
                         kvcache::error);
    // More query tokens than keys is fine with positions, refused without.
    const std::vector<int> many = {0, 7}, many_positions = {9, 9, 9, 9, 9, 9, 9};
    const std::vector<float> seven(7 * heads::query_heads() * heads::head_dim);
    std::vector<float> seven_outputs(seven.size());
    prefill_params with_positions(view, seven, many, seven_outputs);
    with_positions.query_positions = many_positions;
    CHECK_NOTHROW(cpu_backend{}.prefill(with_positions));
    CHECK_THROWS_AS(cpu_backend{}.prefill(prefill_params(view, seven, many, seven_outputs)), kvcache::error);
}

namespace {

/// Causal prefill of the last `chunk` tokens and the same tokens at shuffled
/// explicit positions, against the reference. Lengths are chosen so the
/// chunk starts inside a key tile (the diagonal tiles are masked in part)
/// and ends inside a query block (the last block is partial).
template <class Factory, class Element, class Heads>
void check_tiling_edges(const context_case& c, unsigned seed) {
    auto cache = Factory::template make<Element, Heads>(c, seed);
    const auto view = cache->view();
    fill_cache(view, seed + 1);
    query_set q;
    for (std::size_t b = 0; b < c.lengths.size(); ++b) {
        for (int t = 0; t < c.chunk[b]; ++t) q.positions.push_back(c.lengths[b] - c.chunk[b] + t);
        q.offsets.push_back(q.offsets.back() + c.chunk[b]);
    }
    const std::size_t rows = q.positions.size() * Heads::query_heads();
    const auto queries = random_rows<Element>(rows * Heads::head_dim, 3.0f, seed + 2);
    std::vector<Element> outputs(queries.size(), from_float<Element>(99.0f));
    std::vector<float> lse(rows, 99.0f);
    prefill_params implicit(view, queries, q.offsets, outputs);
    implicit.lse = lse;
    implicit.options = c.options;
    cpu_backend{}.prefill(implicit);
    std::vector<Element> unused;
    std::vector<float> unused_lse;
    prefill_params expected_call(view, queries, q.offsets, unused);
    expected_call.lse = unused_lse;
    expected_call.options = c.options;
    compare(outputs, lse, reference_backend{}.prefill_exact(expected_call),
            std::string("tiling edges, causal, ") + Factory::name + ", " + c.name);
    // The same positions out of order within each sequence: rows of one
    // block then sit at scattered positions, each with its own mask.
    std::mt19937 random(seed + 3);
    for (std::size_t b = 0; b + 1 < q.offsets.size(); ++b)
        std::shuffle(q.positions.begin() + q.offsets[b], q.positions.begin() + q.offsets[b + 1], random);
    cpu_prefill_at(view, queries, q, outputs, lse, c.options);
    compare(outputs, lse, exact_at(view, queries, q, c.options),
            std::string("tiling edges, shuffled positions, ") + Factory::name + ", " + c.name);
}

}  // namespace

TEST_CASE("cpu prefill as tiled products: partial blocks, diagonal tiles, odd groups and dims") {
    attention_options capped;
    capped.logits_soft_cap = 4.0f;
    // 203 keys, the last 77 queried: the chunk starts at 126, two keys before a
    // 32-key tile boundary; 77 tokens leave a partial last block for every group.
    const context_case causal{"causal 203/77", {203, 45}, 0, 0, 12, {77, 45}, {}};
    const context_case windowed{"window 50, 2 sinks", {203}, 50, 2, 16, {77}, capped};
    // Group 4, dim 128 (the shape of the issue): 16-token blocks, 77 = 4 x 16 + 13.
    check_tiling_edges<paged_factory, half, head_config<32, 8, 128>>(causal, 500);
    check_tiling_edges<paged_factory, float, head_config<32, 8, 128>>(causal, 510);
    // Group 3: 21-token blocks of 63 rows, one padding lane per block.
    check_tiling_edges<paged_factory, half, head_config<6, 2, 80>>(causal, 520);
    check_tiling_edges<contiguous_factory, float, head_config<6, 2, 80>>(causal, 530);
    // Group 5, dim 56: 12-token blocks of 60 rows.
    check_tiling_edges<paged_factory, half, head_config<10, 2, 56>>(causal, 540);
    // Group 1 and group 8: 64 tokens of 1 row, 8 tokens of 8 rows per block.
    check_tiling_edges<contiguous_factory, half, head_config<2, 2, 64>>(causal, 550);
    check_tiling_edges<paged_factory, float, head_config<8, 1, 32>>(causal, 560);
    // A window with sinks cuts tiles on both sides of the rows; soft cap on.
    check_tiling_edges<sliding_window_factory, half, head_config<32, 8, 128>>(windowed, 570);
    check_tiling_edges<paged_factory, float, head_config<6, 2, 80>>(windowed, 580);
}
