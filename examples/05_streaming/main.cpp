// 05_streaming: generation far beyond the attention window with the
// sliding-window layout plus attention sinks (StreamingLLM): the cache keeps
// the first `sinks` positions and a ring of the newest ones, so its memory
// stays flat however long the generation runs. The comparison recomputes,
// at every step, everything the newest token can see through the windowed
// layers, and must produce the same tokens.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common/run_main.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/flagship_model.hpp"
#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/timing.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace ex = kvcache::examples;

namespace {

using model_heads = ex::flagship_heads;

const char* usage = R"(usage: 05_streaming [options]

A Llama-architecture decoder (deterministic random weights) generates far
beyond its attention window. Each layer attends to the first SINKS positions
plus the newest WINDOW ones; kvcache's sliding-window cache holds exactly
those (sinks + a ring), so the bytes it reserves never change. Compared with
recomputing, at every step, the sinks and the last LAYERS x (WINDOW - 1) + 1
tokens (all the newest token depends on through the windowed layers) from
scratch: the tokens must be identical. Prints the cache's bytes at several
points of the generation and the time per token of both.

options:
  --prompt N       prompt tokens (default 16)
  --new-tokens N   tokens generated (default 512)
  --window N       keys each query sees besides the sinks (default 32)
  --sinks N        first positions kept forever (default 4)
  --chunk N        prompt prefill chunk, the cache's largest append (default 16)
  --points N       memory checkpoints printed (default 5)
  --layers N       decoder layers (default 2)
  --threads N      CPU threads (default: all cores)
  --seed N         weights and prompt seed (default 1)
  --help           this text
)";

/// Attention without a cache that keeps the K/V of the current step only:
/// forward() may be called several times per step (the sinks, then a later
/// run of tokens), each call attending over everything fed since reset(),
/// restricted by the window and the sinks.
class window_recompute final : public ex::attention_backend {
public:
    window_recompute(const ex::model_config& config, ex::thread_pool& pool, kvcache::attention_visibility visibility)
        : heads_(config.heads()), pool_(pool), visibility_(visibility), keys_(config.num_layers),
          values_(config.num_layers) {}

    void reset() {
        positions_.clear();
        for (auto& k : keys_) k.clear();
        for (auto& v : values_) v.clear();
    }

    void begin_tokens(int first_position, int tokens) override {
        for (int i = 0; i < tokens; ++i) positions_.push_back(first_position + i);
    }

    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        const int qh = heads_.query_heads, kvh = heads_.kv_heads, d = heads_.head_dim, group = heads_.group_size();
        const std::size_t row = static_cast<std::size_t>(kvh) * d;
        keys_[layer].insert(keys_[layer].end(), k, k + tokens * row);
        values_[layer].insert(values_[layer].end(), v, v + tokens * row);
        const int rows = static_cast<int>(keys_[layer].size() / row), first_new = rows - tokens;
        const float* keys = keys_[layer].data();
        const float* values = values_[layer].data();
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        pool_.parallel_for(tokens * qh, [&](int begin, int end) {
            std::vector<float> scores(rows), acc(d);
            for (int item = begin; item < end; ++item) {
                const int t = item / qh, h = item % qh, kv = h / group;
                const int query_position = positions_[first_new + t];
                const float* qrow = q + (static_cast<std::size_t>(t) * qh + h) * d;
                float best = -INFINITY;
                for (int j = 0; j < rows; ++j) {
                    scores[j] = visibility_.allows(query_position, positions_[j])
                                    ? ex::dot(qrow, keys + j * row + kv * d, d) * scale
                                    : -INFINITY;
                    best = std::max(best, scores[j]);
                }
                float total = 0.0f;
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int j = 0; j < rows; ++j) {
                    if (scores[j] == -INFINITY) continue;
                    const float p = std::exp(scores[j] - best);
                    total += p;
                    const float* vrow = values + j * row + kv * d;
                    for (int i = 0; i < d; ++i) acc[i] += p * vrow[i];
                }
                float* orow = out + (static_cast<std::size_t>(t) * qh + h) * d;
                for (int i = 0; i < d; ++i) orow[i] = acc[i] / total;
            }
        });
    }

    /// K/V rows held now (for the memory comparison).
    std::size_t rows() const noexcept { return positions_.size(); }

private:
    kvcache::head_shape heads_;
    ex::thread_pool& pool_;
    kvcache::attention_visibility visibility_;
    std::vector<int> positions_;
    std::vector<std::vector<float>> keys_, values_;
};

struct checkpoint {
    int step = 0, length = 0;
    std::size_t reserved = 0, used = 0, recompute_rows = 0;
};

int run(int argc, char** argv) {
    ex::arguments args(argc, argv, {"--help"},
                       {"--prompt", "--new-tokens", "--window", "--sinks", "--chunk", "--points", "--layers",
                        "--threads", "--seed"});
    if (args.has("--help")) {
        std::cout << usage;
        return 0;
    }
    const int prompt_tokens = args.integer("--prompt", 16, 1, 1 << 16);
    const int new_tokens = args.integer("--new-tokens", 512, 2, 1 << 20);
    const int window = args.integer("--window", 32, 1, 1 << 16);
    const int sinks = args.integer("--sinks", 4, 0, 1 << 16);
    const int chunk = args.integer("--chunk", 16, 1, 1 << 16);
    const int points = args.integer("--points", 5, 2, 1000);
    const int layers = args.integer("--layers", 2, 1, 64);
    const int threads = args.integer("--threads", 0, 0, 1024);
    const int seed = args.integer("--seed", 1, 0, 1 << 30);

    const ex::model_config config = ex::flagship_config(layers);
    ex::thread_pool pool(threads);
    kvcache::cpu::set_thread_count(threads);
    ex::llama_model model(ex::make_random_weights(config, static_cast<std::uint64_t>(seed)), pool);

    ex::seeded_random random(static_cast<std::uint64_t>(seed) * 7919u + 31u);
    std::vector<int> prompt(prompt_tokens);
    for (auto& t : prompt) t = static_cast<int>(random.next() % static_cast<std::uint64_t>(config.vocab_size));
    const kvcache::attention_visibility visibility{window, sinks};
    const int final_length = prompt_tokens + new_tokens - 1;  // the last generated token is never fed
    const std::size_t row_bytes = 2u * model_heads::kv_heads() * model_heads::head_dim * sizeof(float) * layers;

    std::printf("model: Llama-architecture decoder, %s, random weights (seed %d)\n", config.describe().c_str(), seed);
    std::printf("cache: sliding window %d + %d sinks, fp32, kvcache CPU backend, %d threads\n", window, sinks,
                pool.size());
    std::printf("generating %d tokens after a %d-token prompt: the sequence reaches %d positions, %.1f windows\n\n",
                new_tokens, prompt_tokens, final_length, double(final_length) / window);

    // With the cache: one token per step.
    kvcache::sliding_window_cache<float, model_heads> cache(layers, 1, window, sinks, chunk);
    std::vector<int> marks;  // steps at which memory is recorded, evenly spread
    for (int i = 0; i < points; ++i) marks.push_back(int(std::int64_t(new_tokens - 1) * i / (points - 1)));
    std::vector<checkpoint> checkpoints;
    ex::generation_trace cached;
    {
        ex::kvcache_attention<decltype(cache)> attention(cache);
        ex::generation_options options;
        options.keep_logits = true;
        options.prefill_chunk = chunk;
        options.progress = [&](int step) {
            if (std::find(marks.begin(), marks.end(), step) == marks.end()) return;
            checkpoint c;
            c.step = step + 1;
            c.length = cache.length(attention.sequence());
            c.reserved = cache.bytes_reserved();
            c.used = cache.bytes_used();
            checkpoints.push_back(c);
        };
        cached = ex::generate(model, prompt, new_tokens, attention, ex::generation_mode::cached, options);
    }

    // Recomputing: every step runs the sinks and the newest token's receptive field from scratch.
    window_recompute recompute(config, pool, visibility);
    std::vector<int> sequence = prompt, recomputed_tokens;
    std::vector<double> recompute_seconds;
    std::vector<std::vector<float>> recompute_logits;
    std::size_t peak_rows = 0;
    const long reach = static_cast<long>(layers) * (window - 1);  // positions back the newest token depends on
    auto last_progress = std::chrono::steady_clock::now();
    for (int step = 0; step < new_tokens; ++step) {
        const auto start = std::chrono::steady_clock::now();
        if (start - last_progress > std::chrono::seconds(1)) {  // long runs show they are alive
            std::fprintf(stderr, "  recomputing: step %d of %d\n", step + 1, new_tokens);
            last_progress = start;
        }
        const int length = static_cast<int>(sequence.size());
        const int first = static_cast<int>(std::max<long>(0, length - 1 - reach));
        recompute.reset();
        std::vector<float> logits;
        if (first <= sinks) {
            logits = model.forward(sequence.data(), length, 0, recompute);
        } else {
            if (sinks > 0) model.forward(sequence.data(), sinks, 0, recompute);
            logits = model.forward(sequence.data() + first, length - first, first, recompute);
        }
        const int next = ex::argmax(logits.data(), static_cast<int>(logits.size()));
        recompute_seconds.push_back(ex::seconds_since(start));
        peak_rows = std::max(peak_rows, recompute.rows());
        recomputed_tokens.push_back(next);
        recompute_logits.push_back(std::move(logits));
        sequence.push_back(next);
        for (auto& c : checkpoints)
            if (c.step == step + 1) c.recompute_rows = recompute.rows();
    }

    std::printf("%6s | %8s | %22s | %19s | %21s | %26s\n", "step", "length", "sliding: bytes reserved",
                "sliding: bytes used", "recompute: K/V bytes", "whole-history cache bytes");
    for (const auto& c : checkpoints)
        std::printf("%6d | %8d | %23zu | %19zu | %21zu | %26zu\n", c.step, c.length, c.reserved, c.used,
                    c.recompute_rows * row_bytes, std::size_t(c.length) * row_bytes);

    bool flat = true;
    for (const auto& c : checkpoints) flat = flat && c.reserved == checkpoints.front().reserved;
    // Once the ring is full, the rows held (and so the bytes used) stop growing too.
    const int full_at = sinks + cache.ring();
    std::vector<std::size_t> used_when_full;
    for (const auto& c : checkpoints)
        if (c.length >= full_at) used_when_full.push_back(c.used);
    bool used_flat = !used_when_full.empty();
    for (std::size_t u : used_when_full) used_flat = used_flat && u == used_when_full.front();

    double max_logit_diff = 0;
    for (std::size_t s = 0; s < cached.logits.size(); ++s)
        for (std::size_t i = 0; i < cached.logits[s].size(); ++i)
            max_logit_diff = std::max(max_logit_diff, double(std::fabs(cached.logits[s][i] - recompute_logits[s][i])));
    const bool identical = cached.tokens == recomputed_tokens;
    auto mean_after_first = [](const std::vector<double>& seconds) {
        double sum = 0;
        for (std::size_t i = 1; i < seconds.size(); ++i) sum += seconds[i];
        return sum / double(seconds.size() - 1) * 1e3;
    };
    const double cached_ms = mean_after_first(cached.step_seconds), recompute_ms = mean_after_first(recompute_seconds);
    double cached_total = 0, recompute_total = 0;
    for (double s : cached.step_seconds) cached_total += s;
    for (double s : recompute_seconds) recompute_total += s;

    std::printf("\nbytes reserved at %zu points up to length %d (%.1f windows): %zu each; flat: %s\n",
                checkpoints.size(), final_length, double(final_length) / window, checkpoints.front().reserved,
                flat ? "yes" : "no");
    std::printf("bytes used once the window is full (length >= %d, %zu points): flat: %s\n", full_at,
                used_when_full.size(), used_flat ? "yes" : "no");
    std::printf("recompute holds up to %zu K/V rows a step (%zu bytes), and runs that many tokens through the model\n",
                peak_rows, peak_rows * row_bytes);
    std::printf("time per token: cached %.3f ms, recompute %.3f ms (%.1fx); whole run: %.1f ms vs %.1f ms\n", cached_ms,
                recompute_ms, recompute_ms / cached_ms, cached_total * 1e3, recompute_total * 1e3);
    std::printf("tokens identical to recomputing the window at every step: %s\n", identical ? "yes" : "no");
    std::printf("largest logit difference: %.3g\n", max_logit_diff);
    return flat && used_flat && identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("05_streaming", [&] { return run(argc, argv); });
}
