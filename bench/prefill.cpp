// prefill: append attention (a plan of the chunk, cpu_backend::append of its
// K/V, then cpu_backend::prefill over prefix + chunk) by chunk size, after a
// prefix already in a paged cache: tokens/s and GFLOP/s of the attention;
// then every layout x storage type at one chunk (prefill_types.cpp).
#include <cstdio>
#include <vector>

#include "benchmarks.hpp"
#include "harness/timing.hpp"
#include "kvcache/backend/cpu.hpp"
#include "support/attention_counts.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

template <class Element>
void prefill_chunks(const options& opts, report& out, int prefix, const std::vector<int>& chunks) {
    using heads = bench_heads;
    int longest = 0;
    for (int c : chunks) longest = std::max(longest, c);
    auto filled = make_paged<Element>(1, prefix + longest);  // pages for the longest chunk too
    paged_cache<Element, heads>& cache = *filled.cache;
    const sequence_id id = filled.batch[0];
    constexpr std::size_t q_row = std::size_t(heads::query_heads()) * heads::head_dim;
    constexpr std::size_t kv_row = std::size_t(heads::kv_heads()) * heads::head_dim;
    for (int chunk : chunks) {
        const std::vector<float> queries = random_floats(chunk * q_row, 3);
        const std::vector<float> keys = random_floats(chunk * kv_row, 4), values = random_floats(chunk * kv_row, 5);
        std::vector<float> outputs(chunk * q_row);
        const cpu_backend cpu;
        step_plan<paged_cache<Element, heads>> plan;
        auto step = [&] {
            cache.truncate(id, prefix);
            cache.replan(plan, filled.batch, {chunk});  // reuses the plan's buffers
            const auto view = plan.view(0);
            cpu.append(append_params(view, keys, values, plan.new_token_offsets()));
            cpu.prefill(prefill_params(view, queries, plan.new_token_offsets(), outputs));
        };
        const timing t = measure_for(step, opts.warmup(), opts.repeats(), opts.min_seconds());
        const double flops = prefill_flops(1, heads::query_heads(), heads::head_dim, prefix, chunk);
        nlohmann::json metrics;
        add_timing(metrics, "ms_per_chunk", t, 1e3);
        add_rate(metrics, "tokens_per_s", chunk, t);
        metrics["runs"] = t.runs;
        add_rate(metrics, "gflop_per_s", flops / 1e9, t);
        out.add({"prefill",
                 {{"layout", "paged"},
                  {"element", to_string(element_traits<Element>::kind)},
                  {"chunk", chunk},
                  {"prefix", prefix},
                  {"batch", 1},
                  {"heads", "32q/8kv/d128"},
                  {"threads", opts.threads}},
                 metrics});
    }
}

}  // namespace

void run_prefill(const options& opts, report& out) {
    const int prefix = opts.quick ? 128 : 1024;
    const std::vector<int> chunks = opts.quick ? std::vector<int>{16, 64} : std::vector<int>{16, 64, 256, 512, 1024};
    prefill_chunks<float>(opts, out, prefix, chunks);
    prefill_chunks<half>(opts, out, prefix, chunks);
    run_prefill_types(opts, out);
}

}  // namespace kvcache::bench
