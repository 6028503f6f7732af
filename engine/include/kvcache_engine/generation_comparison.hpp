// Cached vs recomputed greedy generation on one prompt, measured: what
// 02_generate prints per context length and what a benchmark can report.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvcache_engine/flagship_model.hpp"
#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace kvcache::examples {

/// A deterministic prompt of `length` ids below vocab_size.
inline std::vector<int> seeded_prompt(int length, int vocab_size, std::uint64_t seed) {
    seeded_random random(seed * 7919u + 17u);
    std::vector<int> prompt(length);
    for (auto& t : prompt) t = static_cast<int>(random.next() % static_cast<std::uint64_t>(vocab_size));
    return prompt;
}

/// One context length's figures. Per-token figures cover the steps after the first (the first carries the prompt).
struct generation_comparison {
    int context = 0;                  ///< prompt length
    double recompute_ms = 0;          ///< median ms per generated token, no cache
    double cached_ms = 0;             ///< median ms per generated token, kvcache
    double recompute_tps = 0;         ///< generated tokens per second, no cache
    double cached_tps = 0;            ///< generated tokens per second, kvcache
    double recompute_first_ms = 0;    ///< first step without cache (the whole prompt)
    double cached_prefill_ms = 0;     ///< first step with kvcache (prefill of the prompt)
    bool identical = false;           ///< the same generated ids
    double max_logit_diff = 0;        ///< largest |logit difference| over all steps
    std::size_t cache_bytes = 0;      ///< kvcache memory reserved
};

namespace detail {

inline std::vector<double> decode_steps(const std::vector<double>& seconds) {
    if (seconds.size() <= 1) return seconds;
    return std::vector<double>(seconds.begin() + 1, seconds.end());
}

// The median resists the odd step a busy machine stretches.
inline double median_ms(std::vector<double> seconds) {
    std::sort(seconds.begin(), seconds.end());
    std::size_t n = seconds.size();
    return (n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2) * 1e3;
}

inline double tokens_per_second(const std::vector<double>& seconds) {
    double sum = 0;
    for (double s : seconds) sum += s;
    return static_cast<double>(seconds.size()) / sum;
}

}  // namespace detail

/// The cached side of a comparison.
struct cached_path {
    cached_runner run = nullptr;            ///< generate_with_kvcache<> (CPU) or its CUDA twin
    bool element_queries_outputs = false;   ///< attention takes queries and gives outputs in the cache's element type (CUDA)
};

/// Generates new_tokens ids after the prompt twice — recomputing everything each step (K/V, and
/// queries/outputs where the cached path rounds them, rounded through the cache's element type and
/// limited by its visibility, so both compute the same model) and with `path` — and compares.
/// `progress(path, step)` is called after each step when set.
inline generation_comparison compare_generation(llama_model& model, const std::vector<int>& prompt, int new_tokens,
                                                const cache_options& cache, const cached_path& path,
                                                const std::function<void(const char*, int)>& progress = {}) {
    require(path.run != nullptr, error_code::invalid_argument, "compare_generation: no cached path");
    generation_options options;
    options.keep_logits = true;
    if (progress) options.progress = [&](int step) { progress("recompute", step); };
    recompute_attention recompute(model.config(), model.pool(), cache.element, cache.visibility(),
                                  path.element_queries_outputs);
    generation_trace slow = generate(model, prompt, new_tokens, recompute, generation_mode::recompute, options);
    if (progress) options.progress = [&](int step) { progress("cached", step); };
    cached_generation cached = path.run(model, prompt, new_tokens, cache, options);
    const generation_trace& fast = cached.trace;

    generation_comparison m;
    m.context = static_cast<int>(prompt.size());
    m.recompute_ms = detail::median_ms(detail::decode_steps(slow.step_seconds));
    m.cached_ms = detail::median_ms(detail::decode_steps(fast.step_seconds));
    m.recompute_tps = detail::tokens_per_second(detail::decode_steps(slow.step_seconds));
    m.cached_tps = detail::tokens_per_second(detail::decode_steps(fast.step_seconds));
    m.recompute_first_ms = slow.step_seconds[0] * 1e3;
    m.cached_prefill_ms = fast.step_seconds[0] * 1e3;
    m.identical = slow.tokens == fast.tokens;
    for (std::size_t s = 0; s < slow.logits.size(); ++s)
        for (std::size_t i = 0; i < slow.logits[s].size(); ++i)
            m.max_logit_diff = std::max(m.max_logit_diff, double(std::fabs(slow.logits[s][i] - fast.logits[s][i])));
    m.cache_bytes = cached.bytes_reserved;
    return m;
}

/// compare_generation with kvcache's CPU backend as the cached path, dispatched
/// over Configurations (by default every shape engine_configurations runs).
/// @tparam Configurations a type_list of kvcache::configuration
template <class Configurations = engine_configurations>
generation_comparison compare_generation(llama_model& model, const std::vector<int>& prompt, int new_tokens,
                                         const cache_options& cache,
                                         const std::function<void(const char*, int)>& progress = {}) {
    return compare_generation(model, prompt, new_tokens, cache,
                              cached_path{&generate_with_kvcache<Configurations>, false}, progress);
}

}  // namespace kvcache::examples
