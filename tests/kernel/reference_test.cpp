// The oracle itself, checked on cases small enough to compute by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kvcache/backend/reference.hpp"
#include "kvcache/layout/contiguous_view.hpp"
#include "support/scatter_layout.hpp"

using namespace kvcache;
using kvcache_test::scatter_cache;
using heads_1x1x8 = head_config<1, 1, 8>;

namespace {

// Sets key/value rows of a one-head, head-dim-8 cache: key = k * e0, value = v * e_d.
template <class Cache>
void set_row(Cache& cache, int sequence, int position, float k, float v, int value_dim) {
    auto view = cache.view();
    float* key = view.key(sequence, 0, position);
    float* value = view.value(sequence, 0, position);
    for (int d = 0; d < 8; ++d) key[d] = value[d] = 0.0f;
    key[0] = k;
    value[value_dim] = v;
}

}  // namespace

TEST_CASE("reference decode: one key gives its value, two keys a softmax blend") {
    scatter_cache<float, heads_1x1x8> cache({2}, 0, 0, 1, 7);
    set_row(cache, 0, 0, 1.0f, 3.0f, 0);
    set_row(cache, 0, 1, 2.0f, 5.0f, 1);
    float query[8] = {0.5f, 0, 0, 0, 0, 0, 0, 0};
    attention_options options;
    options.softmax_scale = 2.0f;
    decode_params call(cache.view(), query, span<float>());
    call.options = options;
    const auto result = reference_backend{}.decode_exact(call);
    // logits: 2*0.5*1 = 1 and 2*0.5*2 = 2
    const double w0 = std::exp(1.0), w1 = std::exp(2.0);
    CHECK(result.outputs[0] == doctest::Approx(3.0 * w0 / (w0 + w1)).epsilon(1e-12));
    CHECK(result.outputs[1] == doctest::Approx(5.0 * w1 / (w0 + w1)).epsilon(1e-12));
    CHECK(result.outputs[2] == 0.0);
    CHECK(result.lse[0] == doctest::Approx(std::log(w0 + w1)).epsilon(1e-12));
}

TEST_CASE("reference decode honours the window, the sinks and the soft cap") {
    // Five positions all present; visibility window 2 with 1 sink: query at 4 sees 0, 3, 4.
    scatter_cache<float, heads_1x1x8> cache({5}, 2, 1, 2, 3, /*drop_outside_window=*/false);
    for (int p = 0; p < 5; ++p) set_row(cache, 0, p, float(p), float(p + 1), 0);
    float query[8] = {1.0f, 0, 0, 0, 0, 0, 0, 0};
    attention_options options;
    options.softmax_scale = 1.0f;
    decode_params call(cache.view(), query, span<float>());
    call.options = options;
    auto result = reference_backend{}.decode_exact(call);
    const double w0 = std::exp(0.0), w3 = std::exp(3.0), w4 = std::exp(4.0);
    CHECK(result.outputs[0] == doctest::Approx((1 * w0 + 4 * w3 + 5 * w4) / (w0 + w3 + w4)).epsilon(1e-12));

    call.options.logits_soft_cap = 2.0f;  // logits become 2 tanh(l / 2)
    result = reference_backend{}.decode_exact(call);
    const double c0 = 1.0, c3 = std::exp(2 * std::tanh(1.5)), c4 = std::exp(2 * std::tanh(2.0));
    CHECK(result.outputs[0] == doctest::Approx((1 * c0 + 4 * c3 + 5 * c4) / (c0 + c3 + c4)).epsilon(1e-12));
}

TEST_CASE("reference prefill is causal within the chunk") {
    scatter_cache<float, heads_1x1x8> cache({3}, 0, 0, 3, 1);
    for (int p = 0; p < 3; ++p) set_row(cache, 0, p, 1.0f, float(10 * (p + 1)), 0);
    std::vector<float> queries(2 * 8, 0.0f);  // the last two positions, 1 and 2; all logits equal
    const int offsets[2] = {0, 2};
    prefill_params call(cache.view(), queries, offsets, span<float>());
    const auto result = reference_backend{}.prefill_exact(call);
    CHECK(result.outputs[0] == doctest::Approx(15.0));  // position 1 sees 10, 20
    CHECK(result.outputs[8] == doctest::Approx(20.0));  // position 2 sees 10, 20, 30
    CHECK(result.lse[0] == doctest::Approx(std::log(2.0)));
}

TEST_CASE("reference prefill at explicit query positions: each query sees the keys up to its own position") {
    scatter_cache<float, heads_1x1x8> cache({3}, 0, 0, 3, 1);
    for (int p = 0; p < 3; ++p) set_row(cache, 0, p, 1.0f, float(10 * (p + 1)), 0);
    std::vector<float> queries(4 * 8, 0.0f);  // all logits equal: outputs are plain means
    const int offsets[2] = {0, 4};
    const int positions[4] = {0, 7, 1, 2};  // unsorted; 7 is past the length: it sees every key
    prefill_params call(cache.view(), queries, offsets, span<float>());
    call.query_positions = positions;
    const auto result = reference_backend{}.prefill_exact(call);
    CHECK(result.outputs[0] == doctest::Approx(10.0));
    CHECK(result.outputs[8] == doctest::Approx(20.0));
    CHECK(result.outputs[16] == doctest::Approx(15.0));
    CHECK(result.outputs[24] == doctest::Approx(20.0));
    CHECK(result.lse[0] == doctest::Approx(0.0));
    CHECK(result.lse[1] == doctest::Approx(std::log(3.0)));
}

TEST_CASE("reference merge: empty states weigh nothing and never give NaN") {
    const float inf = std::numeric_limits<float>::infinity();
    constexpr int dim = 8;  // merges take head dims that are multiples of 8; dims 2..7 are zero here
    // Rows of dim values whose first two are (a, b).
    auto rows = [](std::vector<std::pair<float, float>> pairs) {
        std::vector<float> out;
        for (auto [a, b] : pairs) {
            out.push_back(a);
            out.push_back(b);
            out.insert(out.end(), dim - 2, 0.0f);
        }
        return out;
    };
    // states x rows = 2 x 2; row 0: state 0 empty; row 1: both empty.
    const std::vector<float> outputs = rows({{9, 9}, {1, 1}, {2, 4}, {9, 9}});
    const std::vector<float> lse = {-inf, -inf, std::log(3.0f), -inf};
    std::vector<float> merged(2 * dim, -1.0f), merged_lse(2, 0.0f);
    merge_params first(2, 2, dim, outputs, lse, merged);
    first.merged_lse = merged_lse;
    reference_backend{}.merge(first);
    CHECK(merged[0] == doctest::Approx(2.0));
    CHECK(merged[1] == doctest::Approx(4.0));
    CHECK(merged_lse[0] == doctest::Approx(std::log(3.0)));
    CHECK(merged[dim] == 0.0f);
    CHECK(merged[dim + 1] == 0.0f);
    CHECK(merged_lse[1] == -inf);

    // Two equal-weight states average.
    const std::vector<float> both = rows({{1, 2}, {3, 6}});
    const std::vector<float> both_lse = {0.5f, 0.5f};
    merge_params second(2, 1, dim, both, both_lse, span<float>(merged.data(), dim));
    second.merged_lse = span<float>(merged_lse.data(), 1);
    reference_backend{}.merge(second);
    CHECK(merged[0] == doctest::Approx(2.0));
    CHECK(merged[1] == doctest::Approx(4.0));
    CHECK(merged_lse[0] == doctest::Approx(0.5 + std::log(2.0)));
}

TEST_CASE("reference append skips positions the window dropped") {
    // Length 4, window 2, no sinks: only positions 2 and 3 are present.
    scatter_cache<float, heads_1x1x8> cache({4}, 2, 0, 1, 5);
    std::vector<float> keys(4 * 8), values(4 * 8);
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = float(i), values[i] = -float(i);
    const int offsets[2] = {0, 4};
    reference_backend{}.append(append_params(cache.view(), keys, values, offsets));
    CHECK(cache.view().key(0, 0, 2)[0] == 16.0f);
    CHECK(cache.view().value(0, 0, 3)[7] == -31.0f);
    CHECK_FALSE(reference::is_present(cache.view(), 0, 1));
}

TEST_CASE("reference append at explicit positions writes exactly those rows") {
    scatter_cache<float, heads_1x1x8> cache({4}, 0, 0, 1, 5);
    std::vector<float> keys(2 * 8, 1.0f), values(2 * 8, 2.0f);
    const float before = cache.view().key(0, 0, 0)[0];
    const int offsets[2] = {0, 2};
    append_params call(cache.view(), keys, values, offsets);
    const int positions[2] = {3, 1};
    call.positions = positions;
    reference_backend{}.append(call);
    CHECK(cache.view().key(0, 0, 3)[0] == 1.0f);
    CHECK(cache.view().value(0, 0, 1)[5] == 2.0f);
    CHECK(cache.view().key(0, 0, 0)[0] == before);
}

TEST_CASE("reference over a dynamic head_config equals the compiled one over the same memory, bit for bit") {
    using compiled = head_config<6, 2, 16>;
    using runtime = dynamic_heads<16>;
    const std::vector<int> lengths = {5, 9};
    std::vector<float> keys(2 * 2 * 12 * 16), values(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        keys[i] = std::sin(0.37f * float(i));
        values[i] = std::cos(0.11f * float(i));
    }
    const auto fixed = contiguous_view<float, compiled>::packed(keys.data(), values.data(), lengths.data(), nullptr, 2, 12);
    const auto dynamic =
        contiguous_view<float, runtime>::packed(keys.data(), values.data(), lengths.data(), nullptr, 2, 12, runtime{6, 2});
    CHECK(dynamic.query_heads() == 6);
    CHECK(dynamic.kv_heads() == 2);
    CHECK(dynamic.group_size() == 3);
    std::vector<float> queries(14 * 6 * 16);
    for (std::size_t i = 0; i < queries.size(); ++i) queries[i] = std::sin(1.3f * float(i));
    const std::vector<int> offsets = {0, 5, 14};
    std::vector<float> out_a(queries.size()), out_b(queries.size());
    const auto a = reference_backend{}.prefill_exact(prefill_params(fixed, queries, offsets, out_a));
    const auto b = reference_backend{}.prefill_exact(prefill_params(dynamic, queries, offsets, out_b));
    CHECK(a.outputs == b.outputs);
    CHECK(a.lse == b.lse);
    const std::vector<float> decode_queries(queries.begin(), queries.begin() + 2 * 6 * 16);
    std::vector<float> d_a(decode_queries.size()), d_b(decode_queries.size());
    CHECK(reference_backend{}.decode_exact(decode_params(fixed, decode_queries, d_a)).outputs ==
          reference_backend{}.decode_exact(decode_params(dynamic, decode_queries, d_b)).outputs);
}

TEST_CASE("a dynamic head_config refuses counts that break the rules, naming them") {
    using runtime = dynamic_heads<32>;
    CHECK_THROWS_WITH_AS(runtime(30, 8), doctest::Contains("query_heads = 30 is not a multiple of kv_heads = 8"), kvcache::error);
    CHECK_THROWS_WITH_AS(runtime(0, 1), doctest::Contains("query_heads = 0 must be positive"), kvcache::error);
    CHECK_THROWS_WITH_AS((head_config<dynamic, 2, 32>(6, 3)), doctest::Contains("kv_heads = 3 but this configuration is compiled for 2"),
                         kvcache::error);
    CHECK_THROWS_WITH_AS(runtime(head_shape{8, 2, 64}), doctest::Contains("head_dim = 64 but this configuration is compiled for 32"),
                         kvcache::error);
    // A view whose counts were never set is refused by every call, not read as zero heads.
    const std::vector<int> lengths = {1};
    std::vector<float> rows(64), queries(32), outputs(32);
    const auto unset = contiguous_view<float, runtime>::packed(rows.data(), rows.data(), lengths.data(), nullptr, 1, 1);
    CHECK_THROWS_WITH_AS(reference_backend{}.decode(decode_params(unset, queries, outputs)),
                         doctest::Contains("kv are not set: a view over a dynamic head_config takes its counts"), kvcache::error);
}
