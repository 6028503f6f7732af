// Attention scores (decode_params::scores, prefill_params::scores) of a
// backend against the double-precision reference, and the property every
// score block has: a (sequence, KV head)'s entries sum to the number of
// contributing query rows of its group that saw a key.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_harness.hpp"

namespace kvcache_test {

/// Tolerance on one score entry of expected value e (a sum of softmax
/// weights, each in [0, 1]). A float weight is exp(logit - base) times
/// exp(base - lse): logits of |value| <= ~15 in FP32 are off by ~1e-6
/// absolute, the lse by its 1e-5 relative (lse_tolerance), so each weight is
/// off by at most ~3e-5 relative; the terms are positive, so their sum is
/// too. 1e-4 relative leaves margin, and 1e-6 absolute covers weights that
/// underflow differently. A wrong rescale or normalisation moves a score by
/// a factor (e^(max difference), the group size), far past this.
inline double score_tolerance(double expected) { return 1e-6 + 1e-4 * std::fabs(expected); }

/// Compares scores with the reference's and checks each (sequence, KV head)
/// block sums to group x (its contributing rows with a finite reference
/// lse), and entries past the visible count are 0.
/// @tparam View a layout view
/// @tparam Scores a sized float buffer
template <class View, class Scores>
void compare_scores(const View& view, const Scores& actual, int stride, const reference::attention_result& expected,
                    const std::vector<int>& offsets, int score_queries, const std::string& what) {
    INFO(what);
    REQUIRE(expected.scores.size() == actual.size());
    double worst = 0.0;
    std::size_t worst_index = 0;
    bool within = true;
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const double error = std::fabs(double(actual[i]) - expected.scores[i]);
        if (!(error <= score_tolerance(expected.scores[i]))) within = false;
        if (!(error <= worst)) worst = error, worst_index = i;
    }
    INFO("worst score error " << worst << " at " << worst_index << " (expected "
                              << expected.scores[worst_index] << ")");
    CHECK(within);
    const int group = view.group_size();
    for (int b = 0; b < view.sequence_count(); ++b) {
        const int tokens = offsets[b + 1] - offsets[b];
        const int first = score_queries > 0 ? std::max(0, tokens - score_queries) : 0;
        for (int kv = 0; kv < view.kv_heads(); ++kv) {
            int seen = 0;
            for (int t = first; t < tokens; ++t)
                for (int g = 0; g < group; ++g)
                    seen += std::isfinite(expected.lse[std::size_t(offsets[b] + t) * view.query_heads() + kv * group + g]);
            const std::size_t block = (std::size_t(b) * view.kv_heads() + kv) * stride;
            double sum = 0.0;
            for (int i = 0; i < stride; ++i) sum += actual[block + i];
            INFO("sequence " << b << ", kv head " << kv << ": scores sum to " << sum << ", rows that saw a key " << seen);
            CHECK(std::fabs(sum - seen) <= 1e-4 * std::max(1, seen));
            const int visible = view.length(b) > 0 ? view.visible_count(b) : 0;
            for (int i = visible; i < stride; ++i) CHECK(actual[block + i] == 0.0f);
        }
    }
}

/// Decode (with the case's splits and with 4; with and without lse) and
/// prefill (at the last and at explicit positions, every query or the last 5
/// contributing) of a backend, asking for scores, against the reference. Every
/// buffer is the factory's (memory the backend reads).
/// @tparam Factory a layout factory (layout_factories.hpp)
/// @tparam Element the cache's element type
/// @tparam Heads a head_config
/// @tparam Query the queries' element type
/// @tparam Backend a backend object
template <class Factory, class Element, class Heads, class Query = Element, class Backend>
void check_scores(const Backend& backend, const std::string& backend_name, const Heads& counts = Heads{},
                  const std::vector<context_case>& cases = standard_cases()) {
    constexpr int dim = Heads::head_dim;
    const reference_backend reference;
    unsigned seed = 71;
    for (const context_case& c : cases) {
        auto cache = Factory::template make<Element, Heads>(c, seed++, counts);
        const auto view = cache->view();
        fill_cache(view, seed++);
        const std::string what = backend_name + " scores, " + Factory::name + " " + element_name<Element>() +
                                 " cache, " + heads_name(counts.query_heads(), counts.kv_heads(), dim) + ", " + c.name;
        const int batch = view.sequence_count();
        int stride = 1;
        for (int b = 0; b < batch; ++b) stride = std::max(stride, view.visible_count(b) + 3);  // 3 padding entries
        const std::size_t score_count = std::size_t(batch) * counts.kv_heads() * stride;
        {
            const std::size_t rows = std::size_t(batch) * counts.query_heads();
            const auto host_queries = random_rows<Query>(rows * dim, 3.0f, seed++);
            const auto queries = buffer_of<Factory::template buffer>(host_queries);
            const auto scored = scored_queries<Backend>::template of<Element, dim>(
                host_queries, resolved_softmax_scale(c.options, dim), counts.query_heads() / counts.kv_heads());
            std::vector<int> offsets;
            for (int b = 0; b <= batch; ++b) offsets.push_back(b);
            for (const int splits : {c.options.kv_splits, 4})
                for (const bool with_lse : {true, false}) {
                    auto outputs = filled<Factory::template buffer>(rows * dim, from_float<Query>(99.0f));
                    auto lse = filled<Factory::template buffer>(rows, 99.0f);
                    auto scores = filled<Factory::template buffer>(score_count, 99.0f);
                    decode_params call(view, first(queries, rows * dim), first(outputs, rows * dim));
                    if (with_lse) call.lse = first(lse, rows);
                    call.scores = first(scores, score_count);
                    call.score_stride = stride;
                    call.options = c.options;
                    call.options.kv_splits = splits;
                    backend.decode(call);
                    backend.synchronize();
                    const auto expected = decode_as_scored(call, scored);
                    const std::string step = what + ", decode, kv_splits " + std::to_string(splits) +
                                             (with_lse ? "" : ", no lse");
                    compare(call.outputs, call.lse, expected, step);
                    compare_scores(view, call.scores, stride, expected, offsets, 0, step);
                }
        }
        std::vector<int> host_offsets(1, 0);
        for (int b = 0; b < batch; ++b) host_offsets.push_back(host_offsets.back() + c.chunk[b]);
        const auto offsets = buffer_of<Factory::template buffer>(host_offsets);
        const std::size_t rows = std::size_t(host_offsets.back()) * counts.query_heads();
        const auto queries = buffer_of<Factory::template buffer>(random_rows<Query>(rows * dim, 3.0f, seed++));
        const auto positions =
            buffer_of<Factory::template buffer>(scattered_positions(host_offsets, c.lengths, seed++));
        for (const bool explicit_positions : {false, true})
            for (const int score_queries : {0, 5}) {
                auto outputs = filled<Factory::template buffer>(rows * dim, from_float<Query>(99.0f));
                auto lse = filled<Factory::template buffer>(rows, 99.0f);
                auto scores = filled<Factory::template buffer>(score_count, 99.0f);
                prefill_params call(view, first(queries, rows * dim), first(offsets, host_offsets.size()),
                                    first(outputs, rows * dim));
                if (score_queries == 0) call.lse = first(lse, rows);  // the other runs without: the backend's own
                if (explicit_positions) call.query_positions = first(positions, std::size_t(host_offsets.back()));
                call.scores = first(scores, score_count);
                call.score_stride = stride;
                call.score_queries = score_queries;
                call.options = c.options;
                backend.prefill(call);
                backend.synchronize();
                const auto expected = reference.prefill_exact(call);
                const std::string step = what + ", prefill" + (explicit_positions ? " at explicit positions" : "") +
                                         ", score_queries " + std::to_string(score_queries);
                compare(call.outputs, call.lse, expected, step);
                compare_scores(view, call.scores, stride, expected, host_offsets, score_queries, step);
            }
    }
    combination_registry::instance().add("scores", Factory::name, element_name<Element>(),
                                         heads_name(counts.query_heads(), counts.kv_heads(), dim));
}

}  // namespace kvcache_test
