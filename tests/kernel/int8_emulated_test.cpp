// int8 caches (qint8: a float scale after each row's values) on the emulated
// backend, i.e. the CUDA kernel bodies under the host SIMT emulator: append
// writes every row as core's quantise_row does (compared bit for bit with the
// reference backend's append, which calls quantise_row), and decode, prefill,
// their lse and scores match the double-precision reference on the same int8
// cache, in every layout, for GQA, MHA and MQA, under two schedules; rows of
// zeros and rows holding a NaN behave as the reference says.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcache/backend/emulated.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/policy/key_norms.hpp"
#include "support/backend_suite.hpp"
#include "support/score_checks.hpp"
#include "support/storage_owners.hpp"

using namespace kvcache;

namespace {

using kvcache_test::random_rows;
template <class Element, class Heads>
using owners = kvcache_test::storage_owners<Element, Heads>;

/// Where the special rows go: token `zero_token`'s key and value rows of KV
/// head 0 are all zeros; token `nan_key_token`'s key row of KV head 0 and
/// token `nan_value_token`'s value row of the last KV head hold one NaN each.
struct special_rows {
    bool enabled = false;
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

comparison compare(const std::vector<float>& kernel, const std::vector<float>& reference) {
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
template <class View>
int differing_rows(const View& a, const View& b) {
    constexpr int bytes = row_elements<qint8>(View::heads::head_dim);
    int differing = 0;
    REQUIRE(a.sequence_count() == b.sequence_count());
    for (int s = 0; s < a.sequence_count(); ++s) {
        REQUIRE(a.length(s) == b.length(s));
        const int visible = a.length(s) > 0 ? a.visible_count(s) : 0;
        REQUIRE(visible == (b.length(s) > 0 ? b.visible_count(s) : 0));
        for (int h = 0; h < a.kv_heads(); ++h)
            for (int i = 0; i < visible; ++i) {
                const int position = a.visible_position(s, i);
                differing += std::memcmp(a.key(s, h, position), b.key(s, h, position), bytes) != 0;
                differing += std::memcmp(a.value(s, h, position), b.value(s, h, position), bytes) != 0;
            }
    }
    return differing;
}

// Tolerances, relative to the largest |value| appended (outputs are convex
// combinations of the dequantised values). Both sides read the same int8
// rows and the same scales: the reference widens and scales in double, the
// bodies take the FP32 dot product of the integers with the pre-scaled
// query and multiply it by the key's scale, and fold the value's scale into
// the FP32 softmax weight. FP32 sums of at most head_dim products and a few
// tens of weights stay within ~1e-6 of double relative to their magnitude
// (logits here are O(1), |outputs| <= the largest value), so 1e-5 holds with
// margin; one row read with the wrong scale, or a scale applied twice, moves
// an output by 1e-2 or more. Log-sum-exp: 1e-5 relative; scores (sums of at
// most group softmax weights, each <= 1): 1e-5 absolute.
constexpr double output_bound = 1e-5;
constexpr double lse_bound = 1e-5;
constexpr double score_bound = 1e-5;

/// One owner of qint8 rows appended by the emulated backend and a twin appended
/// by the reference: rows equal bit for bit; then decode (with lse and scores)
/// and prefill of the emulated backend against the reference on that cache.
template <class Heads, class MakeCache>
void check_owner(const emulated_backend& backend, MakeCache make, const special_rows& special, const std::string& what) {
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
        std::fill_n(keys.begin() + std::ptrdiff_t(special.zero_token * row), dim, 0.0f);
        std::fill_n(values.begin() + std::ptrdiff_t(special.zero_token * row), dim, 0.0f);
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
        decode_params r(plan.view(layer), span<const float>(decode_queries), span<float>(expected));
        r.lse = expected_lse;
        r.scores = expected_scores;
        r.score_stride = stride;
        reference_backend{}.decode(r);
        const comparison outputs = compare(out, expected), lses = compare(lse, expected_lse), weights = compare(scores, expected_scores);
        CHECK(outputs.nan_mismatches == 0);
        CHECK(lses.nan_mismatches == 0);
        CHECK(weights.nan_mismatches == 0);
        CHECK(outputs.largest <= output_bound * value_range);
        CHECK(weights.largest <= score_bound);
        for (std::size_t i = 0; i < lse.size(); ++i)
            if (!std::isnan(expected_lse[i])) CHECK(lse[i] == doctest::Approx(expected_lse[i]).epsilon(lse_bound));
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
        CHECK(outputs.largest <= output_bound * value_range);
        for (std::size_t i = 0; i < lse.size(); ++i)
            if (!std::isnan(expected_lse[i])) CHECK(lse[i] == doctest::Approx(expected_lse[i]).epsilon(lse_bound));
        if (special.enabled) {
            CHECK(outputs.nans > 0);
            CHECK(outputs.nans < int(out.size()));  // tokens before the NaN rows, and sequence 1, are finite
        }
        MESSAGE(what, " prefill: largest error ", outputs.largest / value_range, " of the largest |value|, NaN outputs ",
                outputs.nans);
    }
}

template <class Heads>
void check_every_owner(const special_rows& special = {}) {
    using int8_owners = owners<qint8, Heads>;
    const emulator_options in_order{}, shuffled{emulator_schedule::shuffled(14)};
    for (const emulator_options& options : {in_order, shuffled}) {
        CAPTURE(to_string(options.schedule));
        const emulated_backend backend(options);
        check_owner<Heads>(backend, int8_owners::contiguous, special, "contiguous");
        check_owner<Heads>(backend, int8_owners::paged, special, "paged");
        check_owner<Heads>(backend, int8_owners::window, special, "sliding_window");
    }
}

}  // namespace

TEST_CASE("int8 caches on the emulated kernels: GQA 4/2, head dim 32") { check_every_owner<head_config<4, 2, 32>>(); }

TEST_CASE("int8 caches on the emulated kernels: MHA 2/2, head dim 16") { check_every_owner<head_config<2, 2, 16>>(); }

TEST_CASE("int8 caches on the emulated kernels: MQA 3/1, head dim 264 (two pieces of a row per lane in append)") {
    check_every_owner<head_config<3, 1, 264>>();
}

TEST_CASE("int8 caches on the emulated kernels: zero rows and NaN rows as the reference reads them") {
    check_every_owner<head_config<4, 2, 32>>(special_rows{true});
}

TEST_CASE("int8 caches on the emulated kernels: the kernel suite's contexts (splits, soft cap, windows, explicit positions)") {
    // The shared harness (tests/kernel/support): caches filled by the reference's append (quantise_row),
    // every context of standard_cases(), the queries' type's tolerance (float 2e-5, half 1e-3 absolute,
    // for outputs within [-1, 1]), append compared bit for bit, scale included; scores 1e-6 + 1e-4 relative.
    using namespace kvcache_test;
    const emulated_backend backend;
    check_attention<contiguous_factory, qint8, suite_gqa, float>(backend, "emulated");
    check_attention<paged_factory, qint8, suite_mqa, half>(backend, "emulated");
    check_attention<sliding_window_factory, qint8, suite_mha, float>(backend, "emulated");
    check_attention<paged_factory, qint8, dynamic_heads<32>, bfloat16>(backend, "emulated", dynamic_heads<32>{9, 1});
    check_append<contiguous_factory, qint8, suite_mqa, half>(backend, "emulated");
    check_append<paged_factory, qint8, suite_gqa, float>(backend, "emulated");
    check_append<sliding_window_factory, qint8, head_config<5, 1, 56>, float>(backend, "emulated");
    check_append<paged_factory, qint8, dynamic_heads<32>, bfloat16>(backend, "emulated", dynamic_heads<32>{6, 2});
    check_scores<paged_factory, qint8, suite_gqa, float>(backend, "emulated");
    check_scores<sliding_window_factory, qint8, suite_mqa, half>(backend, "emulated");
}

TEST_CASE("int8 key norms apply each row's scale") {
    using heads = head_config<2, 1, 16>;
    constexpr int dim = heads::head_dim, stored = dim + 4;
    paged_cache<qint8, heads> cache(1, 8, 4);
    const sequence_id id = cache.add_sequence();
    const int tokens = 6;
    const auto keys = random_rows(std::size_t(tokens) * dim, 41), values = random_rows(std::size_t(tokens) * dim, 42);
    cache.append(id, 0, keys, values, tokens);
    std::vector<qint8> k(std::size_t(tokens) * stored), v(k.size());
    cache.read(id, 0, 0, tokens, span<qint8>(k), span<qint8>(v));
    auto plan = cache.plan({id});
    std::vector<float> norms(8);
    key_norms(plan.view(0), span<float>(norms), 8);
    for (int t = 0; t < tokens; ++t) {
        float scale;
        std::memcpy(&scale, k.data() + std::size_t(t) * stored + dim, sizeof scale);
        double sum = 0;
        for (int d = 0; d < dim; ++d) {
            const double x = double(k[std::size_t(t) * stored + d].bits) * scale;
            sum += x * x;
        }
        CHECK(norms[t] == doctest::Approx(std::sqrt(sum)).epsilon(1e-6));
    }
    CHECK(norms[tokens] == 0.0f);
}
