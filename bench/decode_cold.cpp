// decode_cold: batch-1 decode with the working set over the last-level cache,
// contiguous against paged, interleaved. decode_bandwidth and element_types
// time a cache that the LLC of a large server part can hold, so a step may
// be served from it; here each layout gets enough copies of the same cache
// that the copies together are at least twice the LLC, and a round steps
// through every copy, contiguous copy c next to paged copy c with 16-token
// and with 64-token pages (the order rotated every step), so each step reads
// its cache back from memory. The ratio of a paged step to the contiguous
// step next to it is the paged layout's overhead under the same drift; the
// fraction is of the streaming read probed just before.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "benchmarks.hpp"
#include "harness/bandwidth.hpp"
#include "harness/machine.hpp"
#include "harness/timing.hpp"
#include "kvcache/backend/cpu.hpp"
#include "support/decode_step.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

constexpr std::size_t mib = std::size_t(1) << 20;

/// Copies of one layout's cache and the decode step over each.
struct cold_layout {
    layout_kind layout;
    int page_size = 0;                           ///< paged only
    std::vector<std::function<double()>> steps;  ///< one per copy
    std::vector<double> seconds;
    std::vector<double> ratios;  ///< to the contiguous step of the same copy and round
};

template <class Element, class Heads>
cold_layout make_copies(layout_kind layout, int context, int copies, int page_size = 0) {
    cold_layout out{layout, page_size, {}, {}, {}};
    for (int c = 0; c < copies; ++c) {
        if (layout == layout_kind::paged)
            out.steps.push_back(timed_decode_step(make_paged<Element, Heads>(1, context, page_size)));
        else
            out.steps.push_back(timed_decode_step(make_contiguous<Element, Heads>(1, context)));
    }
    return out;
}

template <class Element, class Heads>
void compare_cold(const options& opts, report& out, int context, const char* heads_name) {
    const std::size_t llc = last_level_cache_bytes();
    const std::size_t q_elements = std::size_t(Heads::query_heads()) * Heads::head_dim;
    const std::size_t kv = std::size_t(context) *
                           std::size_t(stored_token_bytes(kinds_of<Element>(), Heads::kv_heads(), Heads::head_dim));
    const std::size_t bytes = kv + 2 * q_elements * sizeof(float);
    // Copies of each layout: together at least twice the LLC (and two at
    // least), within a quarter of the memory for all three; the quick run
    // is a smoke test and stops at four.
    int copies = llc > 0 ? int((2 * llc + kv - 1) / kv) + 1 : 2;
    const std::size_t available = available_memory_bytes();
    if (available > 0) copies = std::min<int>(copies, int(available / 4 / (3 * kv)));
    copies = std::max(copies, 2);
    if (opts.quick) copies = std::min(copies, 4);
    std::vector<cold_layout> layouts;
    layouts.push_back(make_copies<Element, Heads>(layout_kind::contiguous, context, copies));
    layouts.push_back(make_copies<Element, Heads>(layout_kind::paged, context, copies, bench_page_size));
    layouts.push_back(make_copies<Element, Heads>(layout_kind::paged, context, copies, 64));
    const std::size_t working_set = layouts.size() * std::size_t(copies) * kv;

    std::size_t probe_bytes = std::max<std::size_t>(opts.quick ? 256 * mib : 2048 * mib, 4 * llc);
    if (available > 0) probe_bytes = std::min(probe_bytes, available / 4);
    const bandwidth_result dram = measure_read_bandwidth(probe_bytes, opts.threads, opts.repeats());

    for (int i = 0; i < opts.warmup(); ++i)
        for (auto& l : layouts)
            for (auto& step : l.steps) step();
    const int rounds = opts.quick ? 2 : 12;
    const int count = int(layouts.size());
    for (int r = 0; r < rounds; ++r)
        for (int c = 0; c < copies; ++c) {
            std::vector<double> s(layouts.size());
            for (int k = 0; k < count; ++k) {  // who goes first rotates
                const int which = (k + r * copies + c) % count;
                s[which] = layouts[which].steps[c]();
                layouts[which].seconds.push_back(s[which]);
            }
            for (int which = 0; which < count; ++which) layouts[which].ratios.push_back(s[which] / s[0]);
        }
    std::printf("%-16s | %s %s context %d: %d copies per layout, %.0f MiB in all (LLC %.0f MiB); streaming read "
                "%.2f GB/s\n",
                "decode_cold", kinds_of<Element>().to_string().c_str(), heads_name, context, copies,
                double(working_set) / double(mib), double(llc) / double(mib), dram.gbytes_per_s);
    for (const auto& l : layouts) {
        const timing time = summarise(l.seconds), ratio = summarise(l.ratios);
        nlohmann::json metrics;
        add_timing(metrics, "ms_per_step", time, 1e3);
        metrics["bytes_read"] = double(bytes);
        metrics["gbytes_per_s"] = double(bytes) / time.median / 1e9;
        metrics["read_gbytes_per_s"] = dram.gbytes_per_s;
        metrics["fraction_of_measured_bandwidth"] = double(bytes) / time.median / 1e9 / dram.gbytes_per_s;
        metrics["copies"] = copies;
        metrics["working_set_mib"] = double(working_set) / double(mib);
        metrics["working_set_over_llc"] = llc > 0 && working_set >= 2 * llc;
        // The layout's time over the contiguous one's, per copy and round.
        metrics["ratio_to_contiguous"] = ratio.median;
        metrics["ratio_to_contiguous_min"] = ratio.min;
        metrics["ratio_to_contiguous_max"] = ratio.max;
        out.add({"decode_cold",
                 {{"layout", to_string(l.layout)},
                  {"page_size", l.page_size},
                  {"element", kinds_of<Element>().to_string()},
                  {"heads", heads_name},
                  {"batch", 1},
                  {"context", context},
                  {"threads", opts.threads},
                  {"steps", int(l.seconds.size())}},
                 metrics});
    }
}

}  // namespace

void run_decode_cold(const options& opts, report& out) {
    const int context = opts.quick ? 1024 : 16384;
    compare_cold<half, head_config<32, 8, 128>>(opts, out, context, "32q/8kv/d128");
    compare_cold<half, head_config<8, 8, 128>>(opts, out, context, "8q/8kv/d128");
    compare_cold<qint8, head_config<32, 8, 128>>(opts, out, context, "32q/8kv/d128");
    compare_cold<qint4, head_config<32, 8, 128>>(opts, out, context, "32q/8kv/d128");
}

}  // namespace kvcache::bench
