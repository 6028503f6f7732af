// prefix_tiers: what spilling a cached prefix to the host tier or the disk
// tier and bringing it back costs, against the streaming copy of the same
// bytes. Each round caches a new prompt's pages in a paged fp16 cache
// (32q/8kv/d128, pages of 16 tokens, 4 layers); then another sequence without
// token ids takes the whole pool, and the time its begin_append takes is the
// spill: every prompt page goes to the host tier (and, with a host tier of one
// page, on to page files, the tier full of the previous round's, so each new
// file takes an evicted one's place). Then match_prefix of the prompt on a new
// sequence copies every page back into the pool, and a memcpy of as many bytes
// between two host buffers is timed. The disk row reads files the tier just
// wrote: the operating system's page cache serves them, so it measures the
// format's read and checksum, not a disk (and the writes, what the file
// system does to create or reuse a file). The disk row is run with the page
// files read and written on one thread and on the bench's threads.
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "benchmarks.hpp"
#include "harness/timing.hpp"
#include "kvcache/core/memory.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

constexpr int tier_layers = 4;

/// Writes n rows of random K/V into every layer of sequence id from position first.
void write_rows(paged_cache<half, bench_heads>& cache, sequence_id id, int first, int n) {
    const std::size_t elements = std::size_t(n) * bench_heads::kv_heads() * bench_heads::head_dim;
    const std::vector<float> rows = random_floats(elements, 11);
    for (int l = 0; l < tier_layers; ++l) cache.write(id, l, first, rows, rows, n);
}

void measure_tier(const options& opts, report& out, bool disk, int context, int read_threads) {
    const int prompt_pages = context / bench_page_size;
    paged_cache<half, bench_heads> cache(tier_layers, prompt_pages, bench_page_size, true);
    std::string directory;
    if (disk) {
        directory = (std::filesystem::temp_directory_path() /
                     ("kvcache_bench_prefix_tiers_" + std::to_string(::getpid()))).string();
        std::filesystem::create_directories(directory);
        cache.attach_host_tier(1);
        cache.attach_disk_tier(directory, prompt_pages, read_threads);
    } else {
        cache.attach_host_tier(prompt_pages);
    }
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(context));
    const std::size_t bytes = std::size_t(prompt_pages) * cache.page_bytes();
    host_buffer<unsigned char> from(bytes), to(bytes);
    std::memset(from.data(), 1, bytes);

    std::vector<double> back_seconds, spill_seconds, copy_seconds, fraction, spill_fraction;
    int generation = 0;
    const auto round = [&] {
        // Untimed: a new prompt, cached in the pool.
        for (int i = 0; i < context; ++i) prompt[std::size_t(i)] = 1000 + (generation % 1000) * context + i;
        ++generation;
        const sequence_id a = cache.add_sequence();
        write_rows(cache, a, cache.begin_append(a, context, prompt), context);
        cache.remove_sequence(a);  // its pages stay cached in the pool
        // A sequence with no token ids takes the pool, pushing the prompt down the tiers.
        const sequence_id filler = cache.add_sequence();
        int first = 0;
        spill_seconds.push_back(seconds_of([&] { first = cache.begin_append(filler, context); }));
        write_rows(cache, filler, first, context);
        cache.remove_sequence(filler);
        const sequence_id returning = cache.add_sequence();
        int matched = 0;
        back_seconds.push_back(seconds_of([&] { matched = cache.match_prefix(returning, prompt); }));
        require(matched == context, error_code::invalid_argument, "prefix_tiers: matched ", matched, " of ", context,
                " tokens");
        cache.remove_sequence(returning);
        copy_seconds.push_back(seconds_of([&] { std::memcpy(to.data(), from.data(), bytes); }));
        fraction.push_back(copy_seconds.back() / back_seconds.back());
        spill_fraction.push_back(copy_seconds.back() / spill_seconds.back());
    };
    for (int i = 0; i < opts.warmup(); ++i) round();
    back_seconds.clear(), spill_seconds.clear(), copy_seconds.clear(), fraction.clear(), spill_fraction.clear();
    double total = 0;
    while (int(back_seconds.size()) < opts.repeats() || (total < opts.min_seconds() && back_seconds.size() < 200)) {
        round();
        total += back_seconds.back();
    }
    const pool_statistics st = cache.statistics();
    const timing back = summarise(back_seconds), copy = summarise(copy_seconds), ratio = summarise(fraction);
    const timing spill = summarise(spill_seconds), spill_ratio = summarise(spill_fraction);
    nlohmann::json metrics;
    add_timing(metrics, "bring_back_ms", back, 1e3);
    add_timing(metrics, "spill_ms", spill, 1e3);
    metrics["spill_fraction_of_copy"] = copy.median / spill.median;
    metrics["spill_fraction_min"] = spill_ratio.min;
    metrics["spill_fraction_max"] = spill_ratio.max;
    add_timing(metrics, "copy_ms", copy, 1e3);
    metrics["bring_back_gbytes_per_s"] = double(bytes) / back.median / 1e9;
    metrics["copy_gbytes_per_s"] = double(bytes) / copy.median / 1e9;
    metrics["bring_back_fraction_of_copy"] = copy.median / back.median;
    metrics["fraction_min"] = ratio.min;
    metrics["fraction_max"] = ratio.max;
    metrics["host_prefix_hit_pages"] = double(st.host_prefix_hit_pages);
    metrics["disk_prefix_hit_pages"] = double(st.disk_prefix_hit_pages);
    metrics["pages_written_to_disk"] = double(st.pages_written_to_disk);
    out.add({"prefix_tiers",
             {{"tier", disk ? "disk" : "host"},
              {"layout", "paged"},
              {"element", "fp16"},
              {"context", context},
              {"layers", tier_layers},
              {"pages", prompt_pages},
              {"bytes", bytes},
              {"heads", "32q/8kv/d128"},
              {"rounds", int(back_seconds.size())},
              {"read_threads", disk ? read_threads : 0}},
             metrics});
    if (disk) {
        cache.clear_prefix_cache();
        std::error_code ignored;
        std::filesystem::remove_all(directory, ignored);
    }
}

}  // namespace

void run_prefix_tiers(const options& opts, report& out) {
    const int context = opts.quick ? 256 : 4096;
    measure_tier(opts, out, false, context, 0);
    measure_tier(opts, out, true, context, 1);
    if (opts.threads > 1) measure_tier(opts, out, true, context, opts.threads);  // main resolved 0 to the machine's
}

}  // namespace kvcache::bench
