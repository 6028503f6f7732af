// The engine's policy path (eviction_driver.hpp) on the owners without a page
// pool, the contiguous and sliding-window ones, on the CPU path (host_attention)
// and the emulated device path (device_attention): every pass's outputs equal
// a double-precision attention over the rows the layer held before the pass
// plus the pass's own tokens (what the cache still shows), each layer ends
// every compaction at exactly its budget, sinks and the recent rows stay, and
// h2o keeps the rows its definition picks from sums the test keeps by position
// (on the sliding window, through the ring dropping rows between compactions).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache_engine/device_attention.hpp"
#include "kvcache_engine/kvcache_attention.hpp"

namespace {

using namespace kvcache::examples;
using heads = kvcache::head_config<4, 2, 16>;
constexpr int query_heads = heads::query_heads(), kv_heads = heads::kv_heads(), dim = heads::head_dim;
constexpr int layers = 2, prompt = 12, decode_steps = 30, budget = 10, sinks = 2, recent = 4;
// The sliding-window owner's: a ring of window + chunk - 1 = 19 rows, so positions leave it from
// length 21 on and the policy's scores must follow their rows.
constexpr int window = 8, window_sinks = 2, chunk = prompt;

// Every K/V row fed so far, by layer and position: the oracle's memory.
struct history {
    std::vector<std::vector<float>> keys{layers}, values{layers};
};

// One query's output over the key positions it may see, in double; its softmax weights are
// added to weights[position] (H2O's statistic, kept by the test by position).
void naive_output(const std::vector<float>& keys, const std::vector<float>& values, const float* q, int kv,
                  const std::vector<int>& seen, float* out, std::vector<double>& weights) {
    std::vector<double> scores(seen.size());
    double best = -1e300;
    for (std::size_t j = 0; j < seen.size(); ++j) {
        double s = 0;
        for (int i = 0; i < dim; ++i) s += double(q[i]) * keys[(std::size_t(seen[j]) * kv_heads + kv) * dim + i];
        scores[j] = s / std::sqrt(double(dim));
        best = std::max(best, scores[j]);
    }
    std::vector<double> acc(dim, 0.0);
    double total = 0;
    for (std::size_t j = 0; j < seen.size(); ++j) {
        const double p = std::exp(scores[j] - best);
        total += p;
        for (int i = 0; i < dim; ++i) acc[i] += p * values[(std::size_t(seen[j]) * kv_heads + kv) * dim + i];
    }
    for (int i = 0; i < dim; ++i) out[i] = float(acc[i] / total);
    for (std::size_t j = 0; j < seen.size(); ++j) {
        if (weights.size() <= std::size_t(seen[j])) weights.resize(std::size_t(seen[j]) + 1, 0.0);
        weights[std::size_t(seen[j])] += std::exp(scores[j] - best) / total;
    }
}

// H2O's choice over the candidate positions, from the test's own sums: the first sinks, the last
// recent and the highest sums between (ties to the more recent); empty when the cut between kept
// and dropped is closer than float sums can tell apart.
std::vector<int> h2o_choice(const std::vector<int>& candidates, const std::vector<double>& sums) {
    const std::size_t n = candidates.size();
    std::vector<int> middle(candidates.begin() + sinks, candidates.end() - recent);
    auto sum_of = [&](int p) { return std::size_t(p) < sums.size() ? sums[std::size_t(p)] : 0.0; };
    std::sort(middle.begin(), middle.end(), [&](int a, int b) { return sum_of(a) != sum_of(b) ? sum_of(a) > sum_of(b) : a > b; });
    const std::size_t wanted = std::size_t(budget - sinks - recent);
    if (wanted < middle.size() && sum_of(middle[wanted - 1]) - sum_of(middle[wanted]) < 1e-4) return {};
    std::vector<int> kept(candidates.begin(), candidates.begin() + sinks);
    kept.insert(kept.end(), middle.begin(), middle.begin() + std::ptrdiff_t(wanted));
    kept.insert(kept.end(), candidates.begin() + std::ptrdiff_t(n - recent), candidates.end());
    std::sort(kept.begin(), kept.end());
    return kept;
}

compression_options policy(kvcache::eviction_policy p) {
    compression_options c;
    c.policy = p;
    c.budget = kvcache::eviction_budget::of_tokens(budget);
    c.sinks = sinks;
    c.recent = recent;
    c.observation_window = 4;
    return c;
}

// Drives one sequence through a prompt and decode steps of random Q/K/V and checks every pass.
// visibility: the owner's rule (a sliding window's); held before a pass: present_positions.
// present_for(length): the positions the owner can still hold at that length (a window's ring).
template <class Attention, class Cache, class PresentFor>
void run_policy(Cache& cache, kvcache::eviction_policy p, kvcache::attention_visibility visibility,
                PresentFor&& present_for) {
    const std::string policy_name = kvcache::to_string(p);
    CAPTURE(policy_name);
    Attention attention(cache);
    attention.compress_with(policy(p));
    const kvcache::sequence_id id = attention.sequence();
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    history seen;
    std::vector<std::vector<double>> sums(layers);  // per layer, by position: H2O's sums over KV heads
    int position = 0;
    int checked_choices = 0;
    for (int pass = 0; pass <= decode_steps; ++pass) {
        const int tokens = pass == 0 ? prompt : 1;
        std::vector<std::vector<int>> held(layers);
        for (int l = 0; l < layers; ++l) held[std::size_t(l)] = cache.present_positions(id, l);
        attention.begin_tokens(position, tokens);
        for (int l = 0; l < layers; ++l) {
            std::vector<float> q(std::size_t(tokens) * query_heads * dim), k(std::size_t(tokens) * kv_heads * dim),
                v(k.size()), out(q.size());
            for (float& x : q) x = normal(rng);
            for (float& x : k) x = normal(rng);
            for (float& x : v) x = normal(rng);
            seen.keys[std::size_t(l)].insert(seen.keys[std::size_t(l)].end(), k.begin(), k.end());
            seen.values[std::size_t(l)].insert(seen.values[std::size_t(l)].end(), v.begin(), v.end());
            attention.attend(l, q.data(), k.data(), v.data(), tokens, out.data());
            std::vector<int> shown = held[std::size_t(l)];
            for (int t = 0; t < tokens; ++t) shown.push_back(position + t);
            held[std::size_t(l)] = shown;  // what the layer showed this pass, for the choice below
            for (int t = 0; t < tokens; ++t) {
                std::vector<int> visible;
                for (int k_pos : shown)
                    if (visibility.allows(position + t, k_pos)) visible.push_back(k_pos);
                for (int h = 0; h < query_heads; ++h) {
                    float expected[dim];
                    naive_output(seen.keys[std::size_t(l)], seen.values[std::size_t(l)],
                                 &q[(std::size_t(t) * query_heads + h) * dim], h / (query_heads / kv_heads), visible,
                                 expected, sums[std::size_t(l)]);
                    for (int i = 0; i < dim; ++i) {
                        CAPTURE(pass);
                        CAPTURE(l);
                        CAPTURE(t);
                        CAPTURE(h);
                        REQUIRE(out[(std::size_t(t) * query_heads + h) * dim + i] ==
                                doctest::Approx(expected[i]).epsilon(1e-4));
                    }
                }
            }
        }
        position += tokens;
        // Compaction after the prefill and every decode step: every layer at its budget exactly,
        // its first sinks and last recent positions kept.
        const std::vector<int> rows = attention.rows_held();
        for (int l = 0; l < layers; ++l) {
            CAPTURE(pass);
            CAPTURE(l);
            CHECK(rows[std::size_t(l)] == budget);
            const std::vector<int> kept = cache.present_positions(id, l);
            if (p == kvcache::eviction_policy::h2o) {  // the rows H2O's definition picks from the test's sums
                const std::vector<int> still = present_for(position);
                std::vector<int> candidates;
                for (int k_pos : held[std::size_t(l)])
                    if (std::binary_search(still.begin(), still.end(), k_pos)) candidates.push_back(k_pos);
                const std::vector<int> expected = h2o_choice(candidates, sums[std::size_t(l)]);
                if (!expected.empty() && candidates.size() > std::size_t(budget)) {
                    CHECK(kept == expected);
                    ++checked_choices;
                }
            }
            REQUIRE(kept.size() == std::size_t(budget));
            for (int s = 0; s < sinks; ++s) CHECK(kept[std::size_t(s)] == s);
            for (int r = 0; r < recent; ++r) CHECK(kept[std::size_t(budget - 1 - r)] == position - 1 - r);
        }
    }
    // Every pass compacts, except on a window a pass where the ring took a kept row from every layer.
    CHECK(attention.compactions() <= decode_steps + 1);
    CHECK(attention.compactions() > decode_steps / 2);
    if (p == kvcache::eviction_policy::h2o) CHECK(checked_choices >= decode_steps);  // most layers' passes were checked
    CHECK(bytes_used_of(cache) == std::size_t(layers) * budget * 2 * kv_heads * dim * sizeof(float));
}

constexpr kvcache::eviction_policy policies[] = {kvcache::eviction_policy::h2o,     kvcache::eviction_policy::snapkv,
                                                 kvcache::eviction_policy::tova,    kvcache::eviction_policy::knorm,
                                                 kvcache::eviction_policy::streaming, kvcache::eviction_policy::random};

template <template <class> class Attention>
void on_contiguous() {
    for (kvcache::eviction_policy p : policies) {
        kvcache::static_cache<float, heads> cache(heads{}, layers, 1, prompt + decode_steps);
        run_policy<Attention<decltype(cache)>>(cache, p, kvcache::attention_visibility{}, [](int length) {
            std::vector<int> all(std::size_t(length), 0);
            for (int i = 0; i < length; ++i) all[std::size_t(i)] = i;
            return all;
        });
    }
}

template <template <class> class Attention>
void on_sliding_window() {
    for (kvcache::eviction_policy p : policies) {
        kvcache::sliding_window_cache<float, heads> cache(heads{}, layers, 1, window, window_sinks, chunk);
        run_policy<Attention<decltype(cache)>>(cache, p, kvcache::attention_visibility{window, window_sinks},
                                               [&cache](int length) { return cache.present_positions_for(length); });
    }
}

template <class Cache>
using cpu_attention = kvcache_attention<Cache>;

}  // namespace

TEST_CASE("CPU path: a policy on a contiguous owner keeps the budget and attends over the kept rows") {
    on_contiguous<cpu_attention>();
}

TEST_CASE("CPU path: a policy on a sliding-window owner keeps the budget and attends over the kept rows") {
    on_sliding_window<cpu_attention>();
}

TEST_CASE("emulated path: a policy on a contiguous owner keeps the budget and attends over the kept rows") {
    on_contiguous<emulated_kvcache_attention>();
}

TEST_CASE("emulated path: a policy on a sliding-window owner keeps the budget and attends over the kept rows") {
    on_sliding_window<emulated_kvcache_attention>();
}

TEST_CASE("the pool trigger on an owner without a pool is refused naming the value, and nothing changes") {
    kvcache::static_cache<float, heads> cache(heads{}, layers, 1, 8);
    cpu_attention<decltype(cache)> attention(cache);
    compression_options options = policy(kvcache::eviction_policy::h2o);
    options.compress_when_free_below = 3;
    CHECK_THROWS_WITH_AS(attention.compress_with(options),
                         doctest::Contains("compress_when_free_below = 3 watches a page pool"), kvcache::error);
    CHECK(attention.compactions() == 0);
    attention.begin_tokens(0, 1);  // no policy took hold: a pass runs without scores
    std::vector<float> q(query_heads * dim, 0.5f), kv(kv_heads * dim, 0.25f), out(q.size());
    for (int l = 0; l < layers; ++l) attention.attend(l, q.data(), kv.data(), kv.data(), 1, out.data());
    CHECK(attention.rows_held() == std::vector<int>{1, 1});
}
