// element_types: decode speed of each storage element type against fp16, in
// one run (fp32, bf16, fp8 e4m3 and e5m2, int8 with a scale per row, int4 with a scale
// and minimum per group of 32). For each layout (contiguous, paged, sliding window), head shape (GQA 32/8 and MHA
// 8/8, head dim 128) and context, one cache per type holds the same random
// K/V; the types are timed in alternation, round after round, so a noisy
// machine's drifts hit all alike. Reported per type: ms per step, the bytes
// it read (K/V as stored, plus queries and outputs), GB/s and its fraction of
// the streaming read probed just before, and its speed relative to fp16 from
// the per-round ratios.
#include <algorithm>
#include <functional>
#include <vector>

#include "benchmarks.hpp"
#include "harness/alternating.hpp"
#include "harness/bandwidth.hpp"
#include "harness/machine.hpp"
#include "harness/timing.hpp"
#include "kvcache/backend/cpu.hpp"
#include "support/decode_step.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

constexpr std::size_t mib = std::size_t(1) << 20;

/// One type's cache and its timed decode step.
struct timed_type {
    kv_kinds element;
    std::size_t bytes = 0;  ///< K/V read per step, plus queries and outputs
    std::function<double()> step;
};

template <class Element, class Heads>
void add_type(std::vector<timed_type>& types, layout_kind layout, int context) {
    const std::size_t q_elements = std::size_t(Heads::query_heads()) * Heads::head_dim;
    const auto time_view = [&](auto filled) {
        const std::size_t bytes = filled.kv_bytes() + 2 * q_elements * sizeof(float);
        types.push_back({kinds_of<Element>(), bytes, timed_decode_step(std::move(filled))});
    };
    if (layout == layout_kind::paged)
        time_view(make_paged<Element, Heads>(1, context));
    else if (layout == layout_kind::sliding_window)
        time_view(make_sliding_window<Element, Heads>(1, context));  // 4 sinks + a window of context - 4, wrapped
    else
        time_view(make_contiguous<Element, Heads>(1, context));
}

template <class Heads>
void compare_types(const options& opts, report& out, layout_kind layout, int context, const char* heads_name,
                   std::size_t probe_bytes) {
    std::vector<timed_type> types;
    add_type<half, Heads>(types, layout, context);  // first: the baseline
    add_type<float, Heads>(types, layout, context);
    add_type<bfloat16, Heads>(types, layout, context);
    add_type<float8_e4m3, Heads>(types, layout, context);  // scale 1: the speed does not depend on it
    add_type<float8_e5m2, Heads>(types, layout, context);
    add_type<qint8, Heads>(types, layout, context);  // bytes as stored: head_dim + 4 per row
    add_type<qint4, Heads>(types, layout, context);  // head_dim / 2 + 4 per group of 32
    // K/V pairs: each side read in its own type (llama.cpp's -ctk q8_0 -ctv q4_0 and the like).
    add_type<kv_elements<half, qint4>, Heads>(types, layout, context);
    add_type<kv_elements<qint8, qint4>, Heads>(types, layout, context);
    const bandwidth_result dram = measure_read_bandwidth(probe_bytes, opts.threads, opts.repeats());
    const std::vector<compared_timing> compared =
        compare_in_alternation(types, opts.warmup(), opts.repeats() + (opts.quick ? 0 : 10), opts.min_seconds(), 500);
    for (std::size_t i = 0; i < types.size(); ++i) {
        const auto& t = types[i];
        const timing &time = compared[i].time, &ratio = compared[i].ratio;
        nlohmann::json metrics;
        add_timing(metrics, "ms_per_step", time, 1e3);
        metrics["bytes_read"] = double(t.bytes);
        metrics["gbytes_per_s"] = double(t.bytes) / time.median / 1e9;
        metrics["read_gbytes_per_s"] = dram.gbytes_per_s;
        metrics["fraction_of_measured_bandwidth"] = double(t.bytes) / time.median / 1e9 / dram.gbytes_per_s;
        metrics["speed_vs_fp16"] = compared[i].speed_vs_baseline;
        metrics["speed_vs_fp16_min"] = ratio.min;
        metrics["speed_vs_fp16_max"] = ratio.max;
        out.add({"element_types",
                 {{"layout", to_string(layout)},
                  {"element", t.element.to_string()},
                  {"heads", heads_name},
                  {"batch", 1},
                  {"context", context},
                  {"threads", opts.threads},
                  {"rounds", time.runs},
                  {"kv_fit_llc", t.bytes < last_level_cache_bytes()}},
                 metrics});
    }
}

}  // namespace

void run_element_types(const options& opts, report& out) {
    const std::size_t llc = last_level_cache_bytes();
    std::size_t probe_bytes = std::max<std::size_t>(opts.quick ? 256 * mib : 2048 * mib, 4 * llc);
    const std::size_t available = available_memory_bytes();
    if (available > 0) probe_bytes = std::min(probe_bytes, available / 4);
    const std::vector<int> contexts = opts.quick ? std::vector<int>{1024} : std::vector<int>{4096, 16384};
    for (layout_kind layout : {layout_kind::contiguous, layout_kind::paged, layout_kind::sliding_window})
        for (int context : contexts) {
            compare_types<head_config<32, 8, 128>>(opts, out, layout, context, "32q/8kv/d128", probe_bytes);
            compare_types<head_config<8, 8, 128>>(opts, out, layout, context, "8q/8kv/d128", probe_bytes);
        }
}

}  // namespace kvcache::bench
