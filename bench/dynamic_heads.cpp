// dynamic_heads: what runtime head counts cost. The same paged cache (32 query
// heads over 8 KV heads, head dim 128) is read through a view compiled for
// those counts and through a view whose counts are runtime values
// (dynamic_heads<128>{32, 8}), decode and prefill on the CPU backend. The two
// run in alternation, round after round, so a noisy machine's drifts hit both
// alike; the ratio comes from the medians and its spread from the per-round ratios.
#include <cstdio>
#include <vector>

#include "benchmarks.hpp"
#include "harness/timing.hpp"
#include "kvcache/backend/cpu.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

template <class Element, class Call>
void compare_counts(const options& opts, report& out, const char* operation, int batch, int context, int chunk,
                    Call&& call) {
    auto filled = make_paged<Element>(batch, context);
    const auto compiled = filled.view();
    using runtime_heads = dynamic_heads<bench_heads::head_dim>;
    const auto runtime = paged_view<Element, runtime_heads>::packed(
        compiled.keys, compiled.values, compiled.page_offsets, compiled.page_indices, compiled.lengths,
        compiled.sequences, compiled.page_size, runtime_heads{bench_heads::query_heads(), bench_heads::kv_heads()});
    const int rows = chunk > 0 ? batch * chunk : batch;
    const std::size_t q_elements = std::size_t(rows) * bench_heads::query_heads() * bench_heads::head_dim;
    const std::vector<float> queries = random_floats(q_elements, 21);
    std::vector<float> outputs(q_elements);
    std::vector<int> offsets(1, 0);
    for (int b = 0; b < batch; ++b) offsets.push_back(offsets.back() + chunk);
    auto time_compiled = [&] { return seconds_of([&] { call(compiled, queries, offsets, outputs); }); };
    auto time_runtime = [&] { return seconds_of([&] { call(runtime, queries, offsets, outputs); }); };
    for (int i = 0; i < opts.warmup(); ++i) time_compiled(), time_runtime();
    const int least_rounds = opts.repeats() + (opts.quick ? 0 : 6);
    std::vector<double> c, r, ratio;
    double total = 0;
    while (int(c.size()) < least_rounds || (total < opts.min_seconds() && c.size() < 500)) {
        c.push_back(time_compiled());
        r.push_back(time_runtime());
        total += c.back();
        ratio.push_back(r.back() / c.back());
    }
    const timing compiled_time = summarise(c), runtime_time = summarise(r), ratios = summarise(ratio);
    nlohmann::json metrics;
    metrics["ratio_to_compiled"] = runtime_time.median / compiled_time.median;
    metrics["ratio_min"] = ratios.min;
    metrics["ratio_max"] = ratios.max;
    metrics["paired_ratio_median"] = ratios.median;
    add_timing(metrics, "dynamic_ms", runtime_time, 1e3);
    add_timing(metrics, "compiled_ms", compiled_time, 1e3);
    nlohmann::json params = {{"operation", operation},
                             {"layout", "paged"},
                             {"element", to_string(element_traits<Element>::kind)},
                             {"batch", batch},
                             {"context", context},
                             {"heads", "32q/8kv/d128"},
                             {"threads", opts.threads},
                             {"rounds", int(c.size())}};
    if (chunk > 0) params["chunk"] = chunk;
    out.add({"dynamic_heads", params, metrics});
}

template <class Element>
void run_element(const options& opts, report& out) {
    const cpu_backend cpu;
    const auto decode = [&](const auto& view, const std::vector<float>& q, const std::vector<int>&, std::vector<float>& o) {
        cpu.decode(decode_params(view, q, o));
    };
    const auto prefill = [&](const auto& view, const std::vector<float>& q, const std::vector<int>& offsets,
                             std::vector<float>& o) { cpu.prefill(prefill_params(view, q, offsets, o)); };
    const int batch = opts.quick ? 2 : 8, context = opts.quick ? 256 : 4096;
    compare_counts<Element>(opts, out, "decode", batch, context, 0, decode);
    compare_counts<Element>(opts, out, "prefill", 1, opts.quick ? 256 : 2048, opts.quick ? 64 : 512, prefill);
}

}  // namespace

void run_dynamic_heads(const options& opts, report& out) {
    run_element<half>(opts, out);
    run_element<float>(opts, out);
}

}  // namespace kvcache::bench
