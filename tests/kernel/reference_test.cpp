// The oracle itself, checked on cases small enough to compute by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kvcache/backend/reference.hpp"
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
    const auto result = reference::decode_attention_exact(cache.view(), query, options);
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
    auto result = reference::decode_attention_exact(cache.view(), query, options);
    const double w0 = std::exp(0.0), w3 = std::exp(3.0), w4 = std::exp(4.0);
    CHECK(result.outputs[0] == doctest::Approx((1 * w0 + 4 * w3 + 5 * w4) / (w0 + w3 + w4)).epsilon(1e-12));

    options.logits_soft_cap = 2.0f;  // logits become 2 tanh(l / 2)
    result = reference::decode_attention_exact(cache.view(), query, options);
    const double c0 = 1.0, c3 = std::exp(2 * std::tanh(1.5)), c4 = std::exp(2 * std::tanh(2.0));
    CHECK(result.outputs[0] == doctest::Approx((1 * c0 + 4 * c3 + 5 * c4) / (c0 + c3 + c4)).epsilon(1e-12));
}

TEST_CASE("reference prefill is causal within the chunk") {
    scatter_cache<float, heads_1x1x8> cache({3}, 0, 0, 3, 1);
    for (int p = 0; p < 3; ++p) set_row(cache, 0, p, 1.0f, float(10 * (p + 1)), 0);
    std::vector<float> queries(2 * 8, 0.0f);  // the last two positions, 1 and 2; all logits equal
    const int offsets[2] = {0, 2};
    const auto result = reference::prefill_attention_exact(cache.view(), queries, offsets);
    CHECK(result.outputs[0] == doctest::Approx(15.0));  // position 1 sees 10, 20
    CHECK(result.outputs[8] == doctest::Approx(20.0));  // position 2 sees 10, 20, 30
    CHECK(result.lse[0] == doctest::Approx(std::log(2.0)));
}

TEST_CASE("reference prefill at explicit positions: any order, repeats, past the end, more tokens than keys") {
    // Three keys with values 10, 20, 30 and equal logits; a window of 2 with 1 sink on a
    // layout that keeps everything: a query at q sees 0 and the keys in (q - 2, q].
    scatter_cache<float, heads_1x1x8> cache({3}, 2, 1, 3, 1, /*drop_outside_window=*/false);
    for (int p = 0; p < 3; ++p) set_row(cache, 0, p, 1.0f, float(10 * (p + 1)), 0);
    std::vector<float> queries(5 * 8, 0.0f);
    const int offsets[2] = {0, 5};
    const std::vector<int> positions = {2, 0, 9, 1, 0};
    const auto result =
        reference::prefill_attention_exact(cache.view(), queries, offsets, {}, make_span(positions));
    CHECK(result.outputs[0 * 8] == doctest::Approx(20.0));  // position 2 sees 0, 1, 2
    CHECK(result.outputs[1 * 8] == doctest::Approx(10.0));  // position 0 sees 0
    CHECK(result.outputs[2 * 8] == doctest::Approx(10.0));  // position 9 sees the sink only: 1 and 2 left the window
    CHECK(result.outputs[3 * 8] == doctest::Approx(15.0));  // position 1 sees 0, 1
    CHECK(result.outputs[4 * 8] == doctest::Approx(10.0));
    CHECK(result.lse[0] == doctest::Approx(std::log(3.0)));
    CHECK(result.lse[2] == doctest::Approx(0.0));
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
    reference::merge_states(2, 2, dim, outputs, lse, merged, merged_lse);
    CHECK(merged[0] == doctest::Approx(2.0));
    CHECK(merged[1] == doctest::Approx(4.0));
    CHECK(merged_lse[0] == doctest::Approx(std::log(3.0)));
    CHECK(merged[dim] == 0.0f);
    CHECK(merged[dim + 1] == 0.0f);
    CHECK(merged_lse[1] == -inf);

    // Two equal-weight states average.
    const std::vector<float> both = rows({{1, 2}, {3, 6}});
    const std::vector<float> both_lse = {0.5f, 0.5f};
    reference::merge_states(2, 1, dim, both, both_lse, merged, merged_lse);
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
    reference::append(cache.view(), keys, values, offsets);
    CHECK(cache.view().key(0, 0, 2)[0] == 16.0f);
    CHECK(cache.view().value(0, 0, 3)[7] == -31.0f);
    CHECK_FALSE(reference::is_present(cache.view(), 0, 1));
}
