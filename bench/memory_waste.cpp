// memory_waste: for a realistic mix of request lengths in flight at once,
// bytes reserved vs bytes holding live K/V, for the static contiguous cache
// (one slot of the model's maximum length per request) and the paged cache
// (16-token pages handed out as sequences grow). Both owners are real; the
// figures are their own bytes_reserved/bytes_used accounting. Then, per
// storage type (fp32, fp16, bf16, fp8 e4m3 and e5m2), the bytes one token's K
// and V take in one layer of a Llama-3-8B-shaped paged cache, from the same
// accounting.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "benchmarks.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/configuration/configuration.hpp"
#include "kvcache/configuration/presets.hpp"

namespace kvcache::bench {

namespace {

// Waste is a ratio of rows, independent of the row size: a small head shape
// keeps the static cache's full reservation cheap to allocate.
using waste_heads = head_config<1, 1, 8>;
using waste_element = half;
constexpr std::size_t row_bytes = 2 * waste_heads::kv_heads() * waste_heads::head_dim * sizeof(waste_element);

/// A workload: requests in flight, each somewhere inside its generation.
struct workload {
    const char* name;
    int requests;
    int max_length;      // the model's context limit: what a static slot reserves
    double prompt_median, prompt_sigma;
    double output_median, output_sigma;
};

/// Live lengths of the requests at one instant: prompt + the part of the
/// output generated so far (log-normal prompt and output lengths, a uniform
/// point in each generation), clamped to max_length.
std::vector<int> snapshot(const workload& w, std::uint64_t seed) {
    std::mt19937_64 engine(seed);
    std::lognormal_distribution<double> prompt(std::log(w.prompt_median), w.prompt_sigma);
    std::lognormal_distribution<double> output(std::log(w.output_median), w.output_sigma);
    std::uniform_real_distribution<double> progress(0.0, 1.0);
    std::vector<int> lengths;
    for (int r = 0; r < w.requests; ++r) {
        const int p = std::clamp(int(prompt(engine)), 1, w.max_length - 1);
        const int o = std::clamp(int(output(engine)), 1, w.max_length - p);
        lengths.push_back(p + int(progress(engine) * o));
    }
    return lengths;
}

void report_layout(report& out, const workload& w, const std::vector<int>& lengths, const char* layout,
                   std::size_t reserved, std::size_t live, const nlohmann::json& extra) {
    std::vector<int> sorted = lengths;
    std::sort(sorted.begin(), sorted.end());
    double mean = 0;
    for (int n : lengths) mean += n;
    mean /= double(lengths.size());
    nlohmann::json params = {{"layout", layout},
                             {"workload", w.name},
                             {"requests", w.requests},
                             {"max_length", w.max_length},
                             {"length_mean", mean},
                             {"length_median", sorted[sorted.size() / 2]},
                             {"length_max", sorted.back()}};
    nlohmann::json metrics = {{"waste_fraction", 1.0 - double(live) / double(reserved)},
                              {"reserved_bytes", reserved},
                              {"live_bytes", live}};
    for (auto it = extra.begin(); it != extra.end(); ++it) params[it.key()] = it.value();
    out.add({"memory_waste", params, metrics});
}

/// One full page of a paged cache of Element with Llama-3-8B's heads (8 KV x
/// 128): its bytes per token per layer, from the pool's own accounting.
template <class Element>
void report_element(report& out) {
    using heads = presets::llama3_8b::heads;
    constexpr int page_size = 16;
    paged_cache<Element, heads> cache(1, 1, page_size, false);
    cache.begin_append(cache.add_sequence(), page_size);
    const std::size_t held = cache.statistics().bytes_used;
    // A stored row as the pool holds it: an int8 row's scale and an int4 row's group records are part of it, not waste.
    const std::size_t rows =
        std::size_t(page_size) * std::size_t(stored_token_bytes(kinds_of<Element>(), heads::kv_heads(), heads::head_dim));
    out.add({"memory_waste",
             {{"layout", "paged"}, {"workload", "one full page"}, {"element", element_name<Element>()},
              {"heads", "llama3_8b (8 KV heads x 128)"}},
             {{"waste_fraction", 1.0 - double(rows) / double(held)},
              {"bytes_per_token_per_layer", double(held) / page_size}}});
}

template <class... Elements>
void report_elements(report& out, type_list<Elements...>) {
    (report_element<Elements>(out), ...);
}

}  // namespace

void run_memory_waste(const options&, report& out) {
    report_elements(out, cache_element_choices{});
    // Chat serving (prompts of a few hundred tokens, answers of a few hundred)
    // under a 4K context limit, and long-document work under a 32K limit.
    const std::vector<workload> workloads = {
        {"chat", 256, 4096, 400, 0.9, 250, 0.8},
        {"long_context", 64, 32768, 4000, 1.0, 500, 0.8},
    };
    for (const workload& w : workloads) {
        const std::vector<int> lengths = snapshot(w, 2024);
        std::size_t live = 0;
        for (int n : lengths) live += std::size_t(n) * row_bytes;

        static_cache<waste_element, waste_heads> contiguous(1, w.requests, w.max_length);
        for (int n : lengths) contiguous.begin_append(contiguous.add_sequence(), n);
        require(contiguous.bytes_used() == live, error_code::invalid_argument, "static cache counts ",
                contiguous.bytes_used(), " live bytes, the workload has ", live);
        report_layout(out, w, lengths, "contiguous", contiguous.bytes_reserved(), live,
                      {{"reservation", "max_length per request"}});

        constexpr int page_size = 16;
        std::size_t pages = 0;
        for (int n : lengths) pages += std::size_t((n + page_size - 1) / page_size);
        paged_cache<waste_element, waste_heads> paged(1, int(pages), page_size, false);
        // Requests grow interleaved, as in serving: a page's worth of tokens
        // each per round, so their pages are scattered through the pool.
        std::vector<sequence_id> ids;
        for (std::size_t r = 0; r < lengths.size(); ++r) ids.push_back(paged.add_sequence());
        const int longest = *std::max_element(lengths.begin(), lengths.end());
        for (int step = 0; step < longest; step += page_size)
            for (std::size_t r = 0; r < lengths.size(); ++r)
                if (step < lengths[r]) paged.begin_append(ids[r], std::min(page_size, lengths[r] - step));
        const pool_statistics stats = paged.statistics();
        report_layout(out, w, lengths, "paged", stats.bytes_used, live,
                      {{"page_size", page_size}, {"reservation", "pages held by sequences"}});
    }
}

}  // namespace kvcache::bench
