// kvcache_bench: every benchmark in one run, so the ratios between them hold
// on a noisy machine. A table on stdout, JSON with --json FILE.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <thread>

#include "benchmarks.hpp"
#include "harness/machine.hpp"
#include "kvcache/backend/cpu/thread_pool.hpp"
#ifndef KVCACHE_BENCH_CUDA
#define KVCACHE_BENCH_CUDA 0
#endif
#if KVCACHE_BENCH_CUDA
#include "cuda/cuda_bench.hpp"
#endif

namespace {

using namespace kvcache::bench;

const benchmark_entry all_benchmarks[] = {
    {"memory_waste", run_memory_waste},
    {"decode_bandwidth", run_decode_bandwidth},
    {"layout_overhead", run_layout_overhead},
    {"prefill", run_prefill},
    {"generation", run_generation},
    {"dynamic_heads", run_dynamic_heads},
    {"host_tier", run_host_tier},
    {"element_types", run_element_types},
    {"prefix_tiers", run_prefix_tiers},
    {"decode_cold", run_decode_cold},
};

// --backend cuda's benchmarks (cuda/cuda_bench.cpp); the copy always runs, as the others' yardstick.
const char* const cuda_benchmarks[] = {"cuda_copy", "cuda_decode", "cuda_append", "cuda_prefill"};

void print_help() {
    std::printf(
        "usage: kvcache_bench [--backend cpu|cuda] [--quick] [--json FILE] [--only NAME[,NAME...]] [--threads N]\n"
        "  --backend B    cpu (default) or cuda (only where built with KVCACHE_BUILD_CUDA_BENCH)\n"
        "  --quick        tiny sizes and few repeats (the CI smoke run, well under two minutes)\n"
        "  --json FILE    write {\"machine\", \"results\"} to FILE\n"
        "  --only NAMES   run only these benchmarks:");
    for (const auto& entry : all_benchmarks) std::printf(" %s", entry.name);
    std::printf(";\n                 with --backend cuda:");
    for (const char* name : cuda_benchmarks) std::printf(" %s", name);
    std::printf("\n  --threads N    CPU backend threads (default: all hardware threads)\n");
    std::printf("this build %s\n", KVCACHE_BENCH_CUDA ? "has the CUDA path (--backend cuda)" : "has no CUDA path");
}

bool is_known(const std::string& name) {
    for (const auto& entry : all_benchmarks)
        if (name == entry.name) return true;
    for (const char* cuda_name : cuda_benchmarks)
        if (name == cuda_name) return true;
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    options opts;
    std::string backend = "cpu";
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&](const char* flag) -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "kvcache_bench: %s needs a value (see --help)\n", flag);
                std::exit(2);
            }
            return argv[++i];
        };
        if (arg == "--help" || arg == "-h") {
            print_help();
            return 0;
        } else if (arg == "--backend") {
            backend = value("--backend");
            if (backend != "cpu" && backend != "cuda") {
                std::fprintf(stderr, "kvcache_bench: --backend '%s' must be cpu or cuda\n", backend.c_str());
                return 2;
            }
#if !KVCACHE_BENCH_CUDA
            if (backend == "cuda") {
                std::fprintf(stderr, "kvcache_bench: --backend cuda needs a build with KVCACHE_BUILD_CUDA_BENCH=ON "
                                     "where nvcc is found (this one has no CUDA path)\n");
                return 2;
            }
#endif
        } else if (arg == "--quick") {
            opts.quick = true;
        } else if (arg == "--json") {
            opts.json_path = value("--json");
        } else if (arg == "--threads") {
            const std::string text = value("--threads");
            char* end = nullptr;
            const long n = std::strtol(text.c_str(), &end, 10);
            if (end == text.c_str() || *end != '\0' || n < 1 || n > 1024) {
                std::fprintf(stderr, "kvcache_bench: --threads '%s' must be an integer in 1..1024\n", text.c_str());
                return 2;
            }
            opts.threads = static_cast<int>(n);
        } else if (arg == "--only") {
            std::stringstream names(value("--only"));
            std::string name;
            while (std::getline(names, name, ',')) {
                if (!is_known(name)) {
                    std::fprintf(stderr, "kvcache_bench: unknown benchmark '%s' (see --help)\n", name.c_str());
                    return 2;
                }
                opts.only.insert(name);
            }
        } else {
            std::fprintf(stderr, "kvcache_bench: unknown argument '%s' (see --help)\n", arg.c_str());
            return 2;
        }
    }
    if (opts.threads == 0) opts.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

    try {
        const auto start = std::chrono::steady_clock::now();
        kvcache::cpu::set_thread_count(opts.threads);
        nlohmann::json machine = describe_machine();
        machine["threads"] = opts.threads;
        machine["mode"] = opts.quick ? "quick" : "full";
        machine["backend"] = backend;
        machine["load_average_at_start"] = load_average();
        std::printf("kvcache_bench: %s mode, %d threads\nmachine: %s\n", opts.quick ? "quick" : "full", opts.threads,
                    machine.dump().c_str());
        std::printf("times: median over the measured repeats (after warm-up), with _min/_max\n");
        report results(std::move(machine));
        std::printf("%-16s | %-58s | %s\n", "benchmark", "params", "metrics");
#if KVCACHE_BENCH_CUDA
        if (backend == "cuda")
            run_cuda_benchmarks(opts, results);
        else
#endif
            for (const auto& entry : all_benchmarks)
                if (opts.wants(entry.name)) entry.run(opts, results);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        results.machine()["load_average_at_end"] = load_average();
        results.machine()["run_seconds"] = seconds;
        std::printf("kvcache_bench: %zu results in %.1f s (load average %.2f at the end)\n", results.results().size(),
                    seconds, load_average());
        if (!opts.json_path.empty()) {
            results.write(opts.json_path);
            std::printf("kvcache_bench: wrote %s\n", opts.json_path.c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvcache_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
