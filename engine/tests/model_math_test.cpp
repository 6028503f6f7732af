// The example model's building blocks against values worked out by hand or in
// double precision, and its cached path against recomputation.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kvcache_engine/tiny_llama.hpp"
#include "naive_cache_attention.hpp"
#include "support/cached_generation.hpp"

using namespace kvcache::examples;

namespace {
generation_options keep_logits() {
    generation_options o;
    o.keep_logits = true;
    return o;
}

// The model of the cached-generation tests: 2 layers, 4 query / 2 KV heads of 16.
model_config small_config() {
    model_config c;
    c.vocab_size = 97;
    c.hidden_size = 48;
    c.num_layers = 2;
    c.num_query_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 80;
    return c;
}
}  // namespace

TEST_CASE("matmul matches a double-precision product and is row-count invariant") {
    thread_pool pool(2);
    const int rows = 7, in = 37, out = 45;  // odd sizes exercise the tails of every loop
    seeded_random random(3);
    std::vector<float> x(rows * in), w(out * in), b(out), y(rows * out);
    for (auto& v : x) v = random.uniform();
    for (auto& v : w) v = random.uniform();
    for (auto& v : b) v = random.uniform();
    matmul(pool, x.data(), rows, in, w.data(), b.data(), out, y.data());
    for (int t = 0; t < rows; ++t)
        for (int n = 0; n < out; ++n) {
            double expect = b[n];
            for (int k = 0; k < in; ++k) expect += double(x[t * in + k]) * w[n * in + k];
            CHECK(y[t * out + n] == doctest::Approx(expect).epsilon(1e-5));
        }
    // One row at a time must give the very same bits: the cached path relies on it.
    std::vector<float> single(out);
    for (int t = 0; t < rows; ++t) {
        matmul(pool, x.data() + t * in, 1, in, w.data(), b.data(), out, single.data());
        for (int n = 0; n < out; ++n) CHECK(single[n] == y[t * out + n]);
    }
}

TEST_CASE("rms_norm scales to unit root-mean-square times the weight") {
    std::vector<float> x{3.0f, 4.0f}, w{1.0f, 2.0f}, y(2);
    rms_norm(x.data(), 1, 2, w.data(), 0.0f, y.data());
    double rms = std::sqrt((9.0 + 16.0) / 2.0);
    CHECK(y[0] == doctest::Approx(3.0 / rms));
    CHECK(y[1] == doctest::Approx(2.0 * 4.0 / rms));
}

TEST_CASE("rope rotates dimension pairs (i, i + d/2) by position * theta^(-2i/d)") {
    model_config c;
    c.head_dim = 4;
    c.rope_theta = 100.0;
    rope_table rope(c);
    std::vector<float> x{1.0f, 1.0f, 0.0f, 0.0f};  // pairs (x0, x2) and (x1, x3)
    rope.apply(x.data(), 1, 1, 3);
    // pair 0: frequency 1, angle 3; pair 1: frequency 100^(-1/2) = 0.1, angle 0.3
    CHECK(x[0] == doctest::Approx(std::cos(3.0)));
    CHECK(x[2] == doctest::Approx(std::sin(3.0)));
    CHECK(x[1] == doctest::Approx(std::cos(0.3)));
    CHECK(x[3] == doctest::Approx(std::sin(0.3)));
}

TEST_CASE("rope llama3 scaling keeps high frequencies and stretches low ones") {
    model_config c;
    c.head_dim = 64;
    c.rope_theta = 500000.0;
    c.scaling.type = rope_scaling::kind::llama3;
    c.scaling.factor = 8.0;
    c.scaling.original_max_position_embeddings = 8192;
    rope_table scaled(c);
    c.scaling.type = rope_scaling::kind::none;
    rope_table plain(c);
    std::vector<float> a(64, 0.0f), b(64, 0.0f);
    a[0] = b[0] = 1.0f;    // highest frequency: wavelength 2*pi, unchanged
    a[31] = b[31] = 1.0f;  // lowest frequency: wavelength far above 8192, divided by 8
    scaled.apply(a.data(), 1, 1, 1000);
    plain.apply(b.data(), 1, 1, 1000);
    CHECK(a[0] == b[0]);
    CHECK(a[32] == b[32]);
    double low = 1.0 / std::pow(500000.0, 62.0 / 64.0);
    CHECK(a[63] == doctest::Approx(std::sin(1000 * low / 8.0)).epsilon(1e-4));
}

TEST_CASE("cached generation (naive test cache) gives the tokens of recomputation") {
    thread_pool pool(2);
    model_config c = small_config();
    c.attention_bias = true;
    c.output_bias = true;
    llama_model model(make_random_weights(c, 11), pool);
    std::vector<int> prompt{5, 17, 3, 90, 42, 8};
    recompute_attention recompute(c, pool, kvcache::element_kind::fp32);
    auto slow = generate(model, prompt, 10, recompute, generation_mode::recompute, keep_logits());
    testing::naive_cache_attention cache(c);
    auto fast = generate(model, prompt, 10, cache, generation_mode::cached, keep_logits());
    CHECK(slow.tokens == fast.tokens);
    CHECK(testing::largest_logit_difference(slow, fast) < 1e-3);
    // The tokens are not trivially constant: greedy picks should vary on random weights.
    bool varied = false;
    for (int t : slow.tokens) varied |= t != slow.tokens[0];
    CHECK(varied);
}

#include "kvcache_engine/kvcache_attention.hpp"

TEST_CASE("cached generation through every kvcache layout and element type gives recomputation's tokens") {
    thread_pool pool(2);
    model_config c = small_config();
    llama_model model(make_random_weights(c, 5), pool);
    std::vector<int> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % c.vocab_size);
    // A window of 16, shorter than the sequence: the window really drops keys.
    testing::for_each_cache_kind(8, 16, 2, 8, [&](const cache_options& cache) {
        recompute_attention recompute(c, pool, cache.element, cache.visibility());
        auto slow = generate(model, prompt, 12, recompute, generation_mode::recompute, keep_logits());
        auto fast = generate_with_kvcache<configurations_for<kvcache::head_config<4, 2, 16>>>(model, prompt, 12, cache, keep_logits()).trace;
        CHECK(slow.tokens == fast.tokens);
        CHECK(testing::largest_logit_difference(slow, fast) < 1e-3);
    });
}
