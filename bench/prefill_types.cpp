// prefill, every layout x storage type: the chunk of 512 queries after a
// prefix of 1024 (issue 13's target shape; quick mode 64 after 128) in each
// layout (contiguous, paged with 16-token pages, sliding window) and each
// stored type (fp16, fp32, bf16, fp8 e4m3 and e5m2, int8, int4). The types of
// one layout are timed in alternation, round after round, so a noisy
// machine's drifts hit all alike; each is reported in GFLOP/s and relative to
// fp16 from the per-round ratios. A step is what the chunk-size sweep times:
// the chunk's plan, cpu_backend::append of its K/V (quantised into the stored
// type), then cpu_backend::prefill over prefix + chunk.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks.hpp"
#include "harness/alternating.hpp"
#include "harness/timing.hpp"
#include "kvcache/backend/cpu.hpp"
#include "support/attention_counts.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

/// Keys of the sliding-window configuration's window: the prefix's length,
/// so the chunk's last queries no longer see the prefix's first keys.
constexpr int prefill_window_of(int prefix) { return prefix; }

/// Keys the chunk's queries see in all, summed over the queries: causal
/// (prefix + i + 1 for query i) or, through a window of `window` keys and
/// `sinks` sink positions, only the sinks and the keys newer than position - window.
double keys_seen(layout_kind layout, int prefix, int chunk) {
    double keys = 0;
    for (int i = 0; i < chunk; ++i) {
        const int position = prefix + i;
        if (layout != layout_kind::sliding_window) {
            keys += position + 1;
            continue;
        }
        const int window = prefill_window_of(prefix);
        const int oldest = std::max(0, position - window + 1);  // the window's first position
        keys += (position - oldest + 1) + std::min(oldest, bench_sinks);
    }
    return keys;
}

/// One layout x type: its cache with the prefix written, and the timed step.
struct timed_prefill {
    kv_kinds element;
    std::function<double()> step;
};

/// A cache of `Cache` with one sequence holding `prefix` random rows, and a
/// step that truncates it back to the prefix, plans, appends and prefills a
/// chunk (queries, K and V random and the same for every type).
template <class Cache>
timed_prefill prepared(std::shared_ptr<Cache> cache, int prefix, int chunk, int append_step) {
    using heads = typename Cache::heads;
    const sequence_id id = cache->add_sequence();
    for (int done = 0; done < prefix; done += append_step) cache->begin_append(id, std::min(append_step, prefix - done));
    detail::write_present_rows(*cache, {id}, prefix);
    constexpr std::size_t q_row = std::size_t(heads::query_heads()) * heads::head_dim;
    constexpr std::size_t kv_row = std::size_t(heads::kv_heads()) * heads::head_dim;
    auto queries = std::make_shared<std::vector<float>>(random_floats(chunk * q_row, 3));
    auto keys = std::make_shared<std::vector<float>>(random_floats(chunk * kv_row, 4));
    auto values = std::make_shared<std::vector<float>>(random_floats(chunk * kv_row, 5));
    auto outputs = std::make_shared<std::vector<float>>(chunk * q_row);
    auto plan = std::make_shared<typename Cache::plan_type>();
    timed_prefill out{kinds_of<typename Cache::element_type>(), {}};
    out.step = [=] {
        const cpu_backend cpu;
        return seconds_of([&] {
            cache->truncate(id, prefix);
            cache->replan(*plan, {id}, {chunk});  // reuses the plan's buffers
            const auto view = plan->view(0);
            cpu.append(append_params(view, *keys, *values, plan->new_token_offsets()));
            cpu.prefill(prefill_params(view, *queries, plan->new_token_offsets(), *outputs));
        });
    };
    return out;
}

template <class Element>
timed_prefill prepared_in(layout_kind layout, int prefix, int chunk) {
    using heads = bench_heads;
    switch (layout) {
    case layout_kind::contiguous:
        return prepared(std::make_shared<static_cache<Element, heads>>(1, 1, prefix + chunk), prefix, chunk, prefix);
    case layout_kind::paged: {
        const int pages = (prefix + chunk + bench_page_size - 1) / bench_page_size;
        return prepared(std::make_shared<paged_cache<Element, heads>>(1, pages, bench_page_size, false), prefix, chunk,
                        prefix);
    }
    case layout_kind::sliding_window:
        break;
    }
    // Appends come in chunks of at most max_chunk (the ring is sized for them).
    return prepared(std::make_shared<sliding_window_cache<Element, heads>>(1, 1, prefill_window_of(prefix), bench_sinks,
                                                                           chunk),
                    prefix, chunk, chunk);
}

void compare_types(const options& opts, report& out, layout_kind layout, int prefix, int chunk) {
    std::vector<timed_prefill> types;
    types.push_back(prepared_in<half>(layout, prefix, chunk));  // first: the baseline
    types.push_back(prepared_in<float>(layout, prefix, chunk));
    types.push_back(prepared_in<bfloat16>(layout, prefix, chunk));
    types.push_back(prepared_in<float8_e4m3>(layout, prefix, chunk));  // scale 1
    types.push_back(prepared_in<float8_e5m2>(layout, prefix, chunk));
    types.push_back(prepared_in<qint8>(layout, prefix, chunk));
    types.push_back(prepared_in<qint4>(layout, prefix, chunk));
    const std::vector<compared_timing> compared =
        compare_in_alternation(types, opts.warmup(), opts.repeats(), opts.min_seconds(), 200);
    const double flops = 4.0 * bench_heads::query_heads() * bench_heads::head_dim * keys_seen(layout, prefix, chunk);
    for (std::size_t i = 0; i < types.size(); ++i) {
        const timing &time = compared[i].time, &ratio = compared[i].ratio;
        nlohmann::json metrics;
        add_timing(metrics, "ms_per_chunk", time, 1e3);
        add_rate(metrics, "tokens_per_s", chunk, time);
        add_rate(metrics, "gflop_per_s", flops / 1e9, time);
        metrics["runs"] = time.runs;
        metrics["speed_vs_fp16"] = compared[i].speed_vs_baseline;
        metrics["speed_vs_fp16_min"] = ratio.min;
        metrics["speed_vs_fp16_max"] = ratio.max;
        nlohmann::json params = {{"layout", to_string(layout)},
                                 {"element", types[i].element.to_string()},
                                 {"chunk", chunk},
                                 {"prefix", prefix},
                                 {"batch", 1},
                                 {"heads", "32q/8kv/d128"},
                                 {"threads", opts.threads},
                                 {"types_compared", true}};
        if (layout == layout_kind::sliding_window) {
            params["window"] = prefill_window_of(prefix);
            params["sinks"] = bench_sinks;
        }
        out.add({"prefill", params, metrics});
    }
}

}  // namespace

void run_prefill_types(const options& opts, report& out) {
    const int prefix = opts.quick ? 128 : 1024, chunk = opts.quick ? 64 : 512;
    for (layout_kind layout : {layout_kind::contiguous, layout_kind::paged, layout_kind::sliding_window})
        compare_types(opts, out, layout, prefix, chunk);
}

}  // namespace kvcache::bench
