// host_tier: what swapping a sequence to the paged cache's host tier and back
// costs. One sequence of a paged fp16 cache (32q/8kv/d128, pages of 16
// tokens) is swapped out and in, round after round; in the same rounds a
// plain memcpy of the same number of bytes between two host buffers gives the
// machine's streaming copy rate, so each round's swap throughput is a
// fraction of what a copy can do right then.
#include <cstring>
#include <vector>

#include "benchmarks.hpp"
#include "harness/timing.hpp"
#include "kvcache/core/memory.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

void run_host_tier(const options& opts, report& out) {
    const int context = opts.quick ? 256 : 16384;
    auto filled = make_paged<half>(1, context);
    paged_cache<half, bench_heads>& cache = *filled.cache;
    const sequence_id id = filled.batch[0];
    const int pages = static_cast<int>(cache.pages(id).size());
    cache.attach_host_tier(pages);
    const std::size_t bytes = std::size_t(pages) * 2 * std::size_t(cache.page_elements()) * sizeof(half);
    host_buffer<unsigned char> from(bytes), to(bytes);
    std::memset(from.data(), 1, bytes);

    std::vector<double> out_seconds, in_seconds, copy_seconds, in_fraction;
    const auto round = [&] {
        out_seconds.push_back(seconds_of([&] { cache.swap_out(id); }));
        in_seconds.push_back(seconds_of([&] { cache.swap_in(id); }));
        copy_seconds.push_back(seconds_of([&] { std::memcpy(to.data(), from.data(), bytes); }));
        in_fraction.push_back(copy_seconds.back() / in_seconds.back());
    };
    for (int i = 0; i < opts.warmup(); ++i) round();
    out_seconds.clear(), in_seconds.clear(), copy_seconds.clear(), in_fraction.clear();
    double total = 0;
    while (int(in_seconds.size()) < opts.repeats() || (total < opts.min_seconds() && in_seconds.size() < 500)) {
        round();
        total += in_seconds.back() + out_seconds.back();
    }
    const timing swap_out = summarise(out_seconds), swap_in = summarise(in_seconds), copy = summarise(copy_seconds),
                 fraction = summarise(in_fraction);
    nlohmann::json metrics;
    metrics["swap_in_gbytes_per_s"] = double(bytes) / swap_in.median / 1e9;
    metrics["swap_out_gbytes_per_s"] = double(bytes) / swap_out.median / 1e9;
    metrics["copy_gbytes_per_s"] = double(bytes) / copy.median / 1e9;
    metrics["swap_in_fraction_of_copy"] = copy.median / swap_in.median;
    metrics["fraction_min"] = fraction.min;
    metrics["fraction_max"] = fraction.max;
    add_timing(metrics, "swap_in_ms", swap_in, 1e3);
    add_timing(metrics, "swap_out_ms", swap_out, 1e3);
    add_timing(metrics, "copy_ms", copy, 1e3);
    out.add({"host_tier",
             {{"layout", "paged"},
              {"element", "fp16"},
              {"context", context},
              {"pages", pages},
              {"bytes", bytes},
              {"heads", "32q/8kv/d128"},
              {"rounds", int(in_seconds.size())}},
             metrics});
}

}  // namespace kvcache::bench
