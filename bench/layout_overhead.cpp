// layout_overhead: paged and sliding-window decode time over contiguous on
// the same visible work (same batch, same number of keys each query sees).
// Paged runs with the default 16-token pages and, to show what the page size
// costs a kernel that streams one page at a time, with 64-token pages.
// The layouts run in alternation, round after round, so drifts of a
// noisy machine hit all alike; the ratio comes from the medians and its
// spread from the per-round ratios.
#include <cstdio>
#include <vector>

#include "benchmarks.hpp"
#include "harness/timing.hpp"
#include "kvcache/backend/cpu.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

template <class Element>
void compare_layouts(const options& opts, report& out, int batch, int context) {
    auto contiguous = make_contiguous<Element>(batch, context);
    auto paged = make_paged<Element>(batch, context);
    auto paged_64 = make_paged<Element>(batch, context, 64);
    auto sliding = make_sliding_window<Element>(batch, context);
    const auto contiguous_view = contiguous.view();
    const auto paged_view = paged.view();
    const auto paged_64_view = paged_64.view();
    const auto sliding_view = sliding.view();
    const std::size_t q_elements = std::size_t(batch) * bench_heads::query_heads() * bench_heads::head_dim;
    const std::vector<float> queries = random_floats(q_elements, 11);
    std::vector<float> outputs(q_elements);
    const cpu_backend cpu;

    auto time_contiguous = [&] { return seconds_of([&] { cpu.decode(decode_params(contiguous_view, queries, outputs)); }); };
    auto time_paged = [&] { return seconds_of([&] { cpu.decode(decode_params(paged_view, queries, outputs)); }); };
    auto time_paged_64 = [&] { return seconds_of([&] { cpu.decode(decode_params(paged_64_view, queries, outputs)); }); };
    auto time_sliding = [&] { return seconds_of([&] { cpu.decode(decode_params(sliding_view, queries, outputs)); }); };
    for (int i = 0; i < opts.warmup(); ++i) time_contiguous(), time_paged(), time_paged_64(), time_sliding();
    // At least repeats() rounds, more until min_seconds of each layout were timed.
    const int least_rounds = opts.repeats() + (opts.quick ? 0 : 6);
    std::vector<double> c, p, p64, s, paged_ratio, paged_64_ratio, sliding_ratio;
    double contiguous_total = 0;
    while (int(c.size()) < least_rounds || (contiguous_total < opts.min_seconds() && c.size() < 500)) {
        c.push_back(time_contiguous());
        contiguous_total += c.back();
        p.push_back(time_paged());
        p64.push_back(time_paged_64());
        s.push_back(time_sliding());
        paged_ratio.push_back(p.back() / c.back());
        paged_64_ratio.push_back(p64.back() / c.back());
        sliding_ratio.push_back(s.back() / c.back());
    }
    const int rounds = int(c.size());
    const timing contiguous_time = summarise(c);
    auto add = [&](const char* layout, int page_size, const std::vector<double>& times,
                   const std::vector<double>& ratios) {
        const timing t = summarise(times), ratio = summarise(ratios);
        nlohmann::json metrics;
        metrics["ratio_to_contiguous"] = t.median / contiguous_time.median;
        metrics["ratio_min"] = ratio.min;
        metrics["ratio_max"] = ratio.max;
        metrics["paired_ratio_median"] = ratio.median;
        add_timing(metrics, "layout_ms", t, 1e3);
        add_timing(metrics, "contiguous_ms", contiguous_time, 1e3);
        nlohmann::json params = {{"layout", layout},
                                 {"element", to_string(element_traits<Element>::kind)},
                                 {"batch", batch},
                                 {"context", context},
                                 {"heads", "32q/8kv/d128"},
                                 {"threads", opts.threads},
                                 {"rounds", rounds}};
        if (page_size > 0) params["page_size"] = page_size;
        out.add({"layout_overhead", params, metrics});
    };
    add("paged", bench_page_size, p, paged_ratio);
    add("paged", 64, p64, paged_64_ratio);
    add("sliding_window", 0, s, sliding_ratio);
}

}  // namespace

void run_layout_overhead(const options& opts, report& out) {
    struct shape { int batch, context; };
    const std::vector<shape> shapes = opts.quick ? std::vector<shape>{{8, 1024}}
                                                 : std::vector<shape>{{1, 16384}, {8, 4096}, {32, 4096}, {8, 16384}};
    for (const shape& s : shapes) {
        compare_layouts<float>(opts, out, s.batch, s.context);
        compare_layouts<half>(opts, out, s.batch, s.context);
    }
}

}  // namespace kvcache::bench
