// What the emulated-kernel tests of the row-quantised types (int8, int4) share:
// one owner of each layout appended by the backend under test and a twin
// appended by the reference (rows compared bit for bit, scales and group
// records included), then decode (with lse and scores) and prefill of the
// backend against the double-precision reference on the same cache, with rows
// of zeros and rows holding a NaN where asked.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kvcache/backend/emulated.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/core/stored_row.hpp"
#include "scored_queries.hpp"
#include "storage_owners.hpp"

namespace kvcache_test {

/// Where the special rows go: token `zero_token`'s key and value rows of KV
/// head 0 are all zeros (with `signed_zeros`, -0 and +0 mixed across a group's
/// lanes, so which zero a group's extreme keeps shows in its record); token
/// `nan_key_token`'s key row of KV head 0 and token `nan_value_token`'s value
/// row of the last KV head hold one NaN each.
struct special_rows {
    bool enabled = false;
    bool signed_zeros = false;
    int zero_token = 3;
    int nan_key_token = 30;    // late in sequence 0 (41 tokens): earlier prefill queries must stay finite
    int nan_value_token = 20;  // in sequence 0 too; sequence 1 never sees either
};

/// Largest |a[i] - b[i]| over the entries both have finite; counts where one
/// is NaN and the other is not.
struct comparison {
    double largest = 0;
    int nan_mismatches = 0;
    int nans = 0;
};

inline comparison compare(const std::vector<float>& kernel, const std::vector<float>& reference) {
    comparison c;
    for (std::size_t i = 0; i < kernel.size(); ++i) {
        const bool a = std::isnan(kernel[i]), b = std::isnan(reference[i]);
        if (a != b) ++c.nan_mismatches;
        if (a || b) {
            c.nans += a && b;
            continue;
        }
        c.largest = std::max(c.largest, std::fabs(double(kernel[i]) - double(reference[i])));
    }
    return c;
}

/// Every visible row of every (sequence, KV head) of two views, keys and
/// values with their scales, byte for byte; returns the rows that differ.
/// @tparam View a layout view (of a K/V pair too: each side's rows in their own type)
template <class View>
int differing_rows(const View& a, const View& b) {
    using key = typename View::key_type;
    using value = typename View::value_type;
    constexpr int key_bytes = kvcache::row_elements<key>(View::heads::head_dim) * int(sizeof(key));
    constexpr int value_bytes = kvcache::row_elements<value>(View::heads::head_dim) * int(sizeof(value));
    int differing = 0;
    REQUIRE(a.sequence_count() == b.sequence_count());
    for (int s = 0; s < a.sequence_count(); ++s) {
        REQUIRE(a.length(s) == b.length(s));
        const int visible = a.length(s) > 0 ? a.visible_count(s) : 0;
        REQUIRE(visible == (b.length(s) > 0 ? b.visible_count(s) : 0));
        for (int h = 0; h < a.kv_heads(); ++h)
            for (int i = 0; i < visible; ++i) {
                const int position = a.visible_position(s, i);
                differing += std::memcmp(a.key(s, h, position), b.key(s, h, position), key_bytes) != 0;
                differing += std::memcmp(a.value(s, h, position), b.value(s, h, position), value_bytes) != 0;
            }
    }
    return differing;
}

/// Bounds of check_owner: outputs relative to the largest |value| appended,
/// lse relative, scores absolute.
struct quantised_bounds {
    double output = 1e-5;
    double lse = 1e-5;
    double score = 1e-5;
};

/// One owner appended by `backend` and a twin appended by the reference: rows
/// equal bit for bit; then decode (with lse and scores) and prefill of
/// `backend` against the reference on that cache.
/// @tparam Heads a head_config
/// @tparam Backend a backend with append, decode and prefill
/// @tparam MakeCache callable returning a fresh owner
template <class Heads, class Backend, class MakeCache>
void check_owner(const Backend& backend, MakeCache make, const special_rows& special, const quantised_bounds& bounds,
                 const std::string& what) {
    using namespace kvcache;
    CAPTURE(what);
    constexpr int dim = Heads::head_dim;
    const int kv = Heads{}.kv_heads(), qh = Heads{}.query_heads();
    auto cache = make();
    auto twin = make();
    const std::vector<int> lengths = {41, 29};
    std::vector<sequence_id> batch, twin_batch;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        batch.push_back(cache.add_sequence());
        twin_batch.push_back(twin.add_sequence());
    }
    const int total = lengths[0] + lengths[1];
    const std::size_t row = std::size_t(kv) * dim;
    std::vector<float> keys = random_rows(std::size_t(total) * row, 31);
    std::vector<float> values = random_rows(std::size_t(total) * row, 32);
    if (special.enabled) {
        auto zero_row = [&](std::vector<float>& rows, float first_lane, float other_lanes) {
            float* r = rows.data() + special.zero_token * row;
            for (int d = 0; d < dim; ++d) r[d] = special.signed_zeros ? (d < 8 ? first_lane : other_lanes) : 0.0f;
        };
        zero_row(keys, 0.0f, -0.0f);
        zero_row(values, -0.0f, 0.0f);
        keys[special.nan_key_token * row + 1] = std::nanf("");
        values[special.nan_value_token * row + std::size_t(kv - 1) * dim + dim - 1] = std::nanf("");
    }
    float value_range = 0.0f;
    for (float v : values)
        if (!std::isnan(v)) value_range = std::max(value_range, std::fabs(v));
    const int layer = 1;
    auto plan = cache.plan(batch, lengths);
    auto twin_plan = twin.plan(twin_batch, lengths);
    for (int l = 0; l < cache.layers(); ++l) {
        backend.append(append_params(plan.view(l), span<const float>(keys), span<const float>(values),
                                     plan.new_token_offsets()));
        reference_backend{}.append(append_params(twin_plan.view(l), span<const float>(keys), span<const float>(values),
                                                 twin_plan.new_token_offsets()));
    }
    CHECK(differing_rows(plan.view(layer), twin_plan.view(layer)) == 0);
    CHECK(differing_rows(plan.view(0), twin_plan.view(0)) == 0);

    const auto queries = random_rows(std::size_t(total) * qh * dim, 33);
    const std::vector<float> decode_queries(queries.begin(), queries.begin() + std::ptrdiff_t(lengths.size()) * qh * dim);
    {  // decode, with lse and scores
        const int stride = lengths[0];
        std::vector<float> out(decode_queries.size()), expected(out.size());
        std::vector<float> lse(lengths.size() * qh), expected_lse(lse.size());
        std::vector<float> scores(lengths.size() * kv * stride), expected_scores(scores.size());
        decode_params p(plan.view(layer), span<const float>(decode_queries), span<float>(out));
        p.lse = lse;
        p.scores = scores;
        p.score_stride = stride;
        backend.decode(p);
        // On the queries as the backend scores them (scored_queries.hpp).
        const std::vector<float> scored = scored_queries<Backend>::template of<typename std::decay_t<decltype(plan.view(layer))>::element_type, dim>(
            decode_queries, resolved_softmax_scale(attention_options{}, dim), qh / kv);
        decode_params r(plan.view(layer), span<const float>(scored.empty() ? decode_queries : scored), span<float>(expected));
        r.lse = expected_lse;
        r.scores = expected_scores;
        r.score_stride = stride;
        reference_backend{}.decode(r);
        const comparison outputs = compare(out, expected), lses = compare(lse, expected_lse), weights = compare(scores, expected_scores);
        CHECK(outputs.nan_mismatches == 0);
        CHECK(lses.nan_mismatches == 0);
        CHECK(weights.nan_mismatches == 0);
        CHECK(outputs.largest <= bounds.output * value_range);
        CHECK(weights.largest <= bounds.score);
        for (std::size_t i = 0; i < lse.size(); ++i)
            if (!std::isnan(expected_lse[i])) CHECK(lse[i] == doctest::Approx(expected_lse[i]).epsilon(bounds.lse));
        if (special.enabled) CHECK(outputs.nans > 0);  // sequence 0's last query sees the NaN rows
        MESSAGE(what, " decode: largest error ", outputs.largest / value_range, " of the largest |value|, scores ",
                weights.largest, ", NaN outputs ", outputs.nans);
    }
    {  // prefill: every appended token queries the cache (causal: early tokens do not see the NaN rows)
        std::vector<float> out(queries.size()), expected(out.size());
        std::vector<float> lse(std::size_t(total) * qh), expected_lse(lse.size());
        prefill_params p(plan.view(layer), span<const float>(queries), plan.new_token_offsets(), span<float>(out));
        p.lse = lse;
        backend.prefill(p);
        prefill_params r(plan.view(layer), span<const float>(queries), plan.new_token_offsets(), span<float>(expected));
        r.lse = expected_lse;
        reference_backend{}.prefill(r);
        const comparison outputs = compare(out, expected), lses = compare(lse, expected_lse);
        CHECK(outputs.nan_mismatches == 0);
        CHECK(lses.nan_mismatches == 0);
        CHECK(outputs.largest <= bounds.output * value_range);
        for (std::size_t i = 0; i < lse.size(); ++i)
            if (!std::isnan(expected_lse[i])) CHECK(lse[i] == doctest::Approx(expected_lse[i]).epsilon(bounds.lse));
        if (special.enabled) {
            CHECK(outputs.nans > 0);
            CHECK(outputs.nans < int(out.size()));  // tokens before the NaN rows, and sequence 1, are finite
        }
        MESSAGE(what, " prefill: largest error ", outputs.largest / value_range, " of the largest |value|, NaN outputs ",
                outputs.nans);
    }
}

/// check_owner on the three owners, under the in-order and a shuffled schedule.
/// @tparam Element a row-quantised element type (qint8, qint4), or a K/V pair
/// @tparam Heads a head_config
template <class Element, class Heads>
void check_every_owner(const special_rows& special = {}, const quantised_bounds& bounds = {}) {
    using namespace kvcache;
    using owners = storage_owners<Element, Heads>;
    const emulator_options in_order{}, shuffled{emulator_schedule::shuffled(14)};
    for (const emulator_options& options : {in_order, shuffled}) {
        CAPTURE(to_string(options.schedule));
        const emulated_backend backend(options);
        check_owner<Heads>(backend, owners::contiguous, special, bounds, "contiguous");
        check_owner<Heads>(backend, owners::paged, special, bounds, "paged");
        check_owner<Heads>(backend, owners::window, special, bounds, "sliding_window");
    }
}

}  // namespace kvcache_test
