// decode_bandwidth: decode attention's bytes moved per call (K/V it reads,
// plus Q and O) over time, against the streaming-read bandwidth measured in
// the same run on the same memory.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "benchmarks.hpp"
#include "harness/bandwidth.hpp"
#include "harness/machine.hpp"
#include "harness/timing.hpp"
#include "kvcache/backend/cpu.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

constexpr std::size_t mib = std::size_t(1) << 20;

/// A read buffer far larger than the last-level cache, within what memory allows.
std::size_t dram_buffer_bytes(bool quick) {
    const std::size_t llc = last_level_cache_bytes();
    std::size_t bytes = quick ? std::max<std::size_t>(256 * mib, 2 * llc) : std::max<std::size_t>(4096 * mib, 8 * llc);
    const std::size_t available = available_memory_bytes();
    if (available > 0) bytes = std::min(bytes, available / 3);
    return bytes;
}

}  // namespace

void run_decode_bandwidth(const options& opts, report& out) {
    const std::size_t llc = last_level_cache_bytes();
    const std::size_t probe_bytes = dram_buffer_bytes(opts.quick);
    nlohmann::json bandwidth = {{"buffer_mib", double(probe_bytes) / double(mib)},
                                {"threads", opts.threads},
                                {"kernel", "multi-threaded streaming read (sum of 64-bit words)"},
                                {"probes", nlohmann::json::array()}};
    if (llc > 0) {
        // The same read over a buffer that fits the last-level cache: what a
        // KV working set that fits there can be read at.
        const bandwidth_result cached = measure_read_bandwidth(llc / 4, opts.threads, opts.repeats() * 3);
        bandwidth["in_cache_gbytes_per_s"] = cached.gbytes_per_s;
        bandwidth["in_cache_buffer_mib"] = double(cached.bytes) / double(mib);
    }

    const std::vector<layout_kind> layouts = {layout_kind::contiguous, layout_kind::paged, layout_kind::sliding_window};
    const std::vector<element_kind> elements = {element_kind::fp32, element_kind::fp16, element_kind::bf16};
    const std::vector<int> batches = opts.quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 32};
    const std::vector<int> contexts = opts.quick ? std::vector<int>{512, 2048} : std::vector<int>{512, 4096, 16384};
    for (layout_kind layout : layouts)
        for (element_kind element : elements) {
            // The machine's bandwidth drifts when other work comes and goes,
            // so it is probed again right before each group it is compared with.
            const bandwidth_result dram = measure_read_bandwidth(probe_bytes, opts.threads, opts.repeats());
            const double probe_min = double(dram.bytes) / dram.seconds.max / 1e9;
            const double probe_max = double(dram.bytes) / dram.seconds.min / 1e9;
            if (bandwidth["probes"].empty()) {
                bandwidth["gbytes_per_s"] = dram.gbytes_per_s;
                bandwidth["gbytes_per_s_min"] = probe_min;
                bandwidth["gbytes_per_s_max"] = probe_max;
            }
            bandwidth["probes"].push_back({{"before", std::string(to_string(layout)) + "/" + to_string(element)},
                                           {"gbytes_per_s", dram.gbytes_per_s},
                                           {"gbytes_per_s_min", probe_min},
                                           {"gbytes_per_s_max", probe_max}});
            out.machine()["read_bandwidth"] = bandwidth;
            std::printf("%-16s | streaming read over %.0f MiB (LLC %.0f MiB), %d threads, before %s/%s: %.2f GB/s median "
                        "(min %.2f, max %.2f)",
                        "decode_bandwidth", double(dram.bytes) / double(mib), double(llc) / double(mib), dram.threads,
                        to_string(layout), to_string(element), dram.gbytes_per_s, probe_min, probe_max);
            if (bandwidth.contains("in_cache_gbytes_per_s"))
                std::printf("; over %.0f MiB (fits the LLC, once at the start): %.2f GB/s",
                            bandwidth["in_cache_buffer_mib"].get<double>(),
                            bandwidth["in_cache_gbytes_per_s"].get<double>());
            std::printf("\n");
            for (int batch : batches)
                for (int context : contexts) {
                    const std::size_t row_bytes = 2 * bench_heads::kv_heads() * bench_heads::head_dim *
                                                  element_size(element);
                    const std::size_t needed = std::size_t(batch) * context * row_bytes;
                    const std::size_t available = available_memory_bytes();
                    if (available > 0 && needed > available / 2) {
                        std::printf("%-16s | skipped %s/%s batch %d context %d: %.0f MiB of K/V, %.0f MiB available\n",
                                    "decode_bandwidth", to_string(layout), to_string(element), batch, context,
                                    double(needed) / double(mib), double(available) / double(mib));
                        continue;
                    }
                    with_filled_cache(layout, element, batch, context, [&](auto& filled) {
                        const auto view = filled.view();
                        const std::size_t q_elements = std::size_t(batch) * bench_heads::query_heads() * bench_heads::head_dim;
                        const std::vector<float> queries = random_floats(q_elements, 7);
                        std::vector<float> outputs(q_elements);
                        const cpu_backend cpu;
                        const timing t =
                            measure_for([&] { cpu.decode(decode_params(view, queries, outputs)); },
                                        opts.warmup(), opts.repeats(), opts.min_seconds());
                        const std::size_t bytes = filled.kv_bytes() + 2 * q_elements * sizeof(float);
                        const double gbps = double(bytes) / t.median / 1e9;
                        nlohmann::json metrics;
                        add_timing(metrics, "ms_per_call", t, 1e3);
                        add_rate(metrics, "gbytes_per_s", double(bytes) / 1e9, t);
                        metrics["fraction_of_measured_bandwidth"] = gbps / dram.gbytes_per_s;
                        metrics["read_gbytes_per_s"] = dram.gbytes_per_s;
                        metrics["bytes_per_call"] = bytes;
                        metrics["runs"] = t.runs;
                        metrics["fits_in_llc"] = llc > 0 && filled.kv_bytes() <= llc;
                        out.add({"decode_bandwidth",
                                 {{"layout", to_string(layout)},
                                  {"element", to_string(element)},
                                  {"batch", batch},
                                  {"context", context},
                                  {"heads", "32q/8kv/d128"},
                                  {"threads", opts.threads}},
                                 metrics});
                    });
                }
        }
}

}  // namespace kvcache::bench
