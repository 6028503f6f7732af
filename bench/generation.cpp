// generation: the model of examples/02_generate (a Llama-architecture
// decoder, random weights) generating greedily, recomputing every past
// token's K/V at each step vs with kvcache (paged, fp32), by context length.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "benchmarks.hpp"
#include "harness/timing.hpp"
#include "kvcache_engine/generation_comparison.hpp"
#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace kvcache::bench {

namespace {

namespace ex = kvcache::examples;

/// Per-token seconds of steps [first, end) of a trace.
timing steps_timing(const ex::generation_trace& trace, int first) {
    return summarise(std::vector<double>(trace.step_seconds.begin() + first, trace.step_seconds.end()));
}

}  // namespace

void run_generation(const options& opts, report& out) {
    const int layers = opts.quick ? 2 : 4;
    const ex::model_config config = ex::flagship_config(layers);  // 02_generate's model
    ex::thread_pool pool(opts.threads);
    ex::llama_model model(ex::make_random_weights(config, 1), pool);
    ex::cache_options cache;
    cache.layout = layout_kind::paged;
    cache.element = element_kind::fp32;
    cache.page_size = 16;

    const std::vector<int> contexts =
        opts.quick ? std::vector<int>{64, 256} : std::vector<int>{128, 256, 512, 1024, 2048, 4096};
    ex::seeded_random prompt_random(7919u + 17u);
    for (int context : contexts) {
        std::vector<int> prompt(context);
        for (auto& t : prompt) t = int(prompt_random.next() % std::uint64_t(config.vocab_size));
        // Step 0 is the prompt (prefill / first full pass); then warm-up steps,
        // then the measured ones. Recomputing is slow at long contexts, so
        // fewer of its steps are measured there; both generate the same count.
        // A cached step takes about a millisecond, under a scheduler's time
        // slice, so it gets more measured steps (the tokens are compared over
        // the steps both ran; the few extra positions barely change its cost).
        const int repeats = (!opts.quick && context >= 2048) ? 5 : opts.repeats();
        const int cached_repeats = std::max(repeats, opts.quick ? opts.repeats() : 31);
        const int first_measured = 1 + opts.warmup();
        ex::generation_options options;
        options.keep_logits = true;
        ex::recompute_attention recompute(config, pool, cache.element, cache.visibility());
        const ex::generation_trace slow =
            ex::generate(model, prompt, first_measured + repeats, recompute, ex::generation_mode::recompute, options);
        const ex::generation_trace fast =
            ex::generate_with_kvcache<ex::configurations_for<ex::flagship_heads>>(model, prompt, first_measured + cached_repeats, cache, options).trace;

        const timing recompute_time = steps_timing(slow, first_measured);
        const timing cached_time = steps_timing(fast, first_measured);
        const bool identical = fast.tokens.size() >= slow.tokens.size() &&
                               std::equal(slow.tokens.begin(), slow.tokens.end(), fast.tokens.begin());
        double max_logit_diff = 0;
        for (std::size_t s = 0; s < slow.logits.size(); ++s)
            for (std::size_t i = 0; i < slow.logits[s].size(); ++i)
                max_logit_diff = std::max(max_logit_diff, double(std::fabs(slow.logits[s][i] - fast.logits[s][i])));

        nlohmann::json metrics;
        add_timing(metrics, "cached_ms_per_token", cached_time, 1e3);
        add_timing(metrics, "recompute_ms_per_token", recompute_time, 1e3);
        metrics["latency_reduction"] = 1.0 - cached_time.median / recompute_time.median;
        metrics["throughput_ratio"] = recompute_time.median / cached_time.median;
        metrics["cached_tokens_per_s"] = 1.0 / cached_time.median;
        metrics["recompute_tokens_per_s"] = 1.0 / recompute_time.median;
        metrics["cached_prefill_ms"] = fast.step_seconds[0] * 1e3;
        metrics["tokens_identical"] = identical;
        metrics["max_logit_diff"] = max_logit_diff;
        out.add({"generation",
                 {{"context", context},
                  {"model", config.describe()},
                  {"layout", "paged"},
                  {"element", "fp32"},
                  {"page_size", cache.page_size},
                  {"measured_steps_recompute", repeats},
                  {"measured_steps_cached", cached_repeats},
                  {"compared_tokens", int(slow.tokens.size())},
                  {"threads", pool.size()}},
                 metrics});
    }
}

}  // namespace kvcache::bench
