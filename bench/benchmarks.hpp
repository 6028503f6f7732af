// The benchmarks of kvcache_bench, one function each, each in its own file.
#pragma once

#include "harness/options.hpp"
#include "harness/report.hpp"

namespace kvcache::bench {

/// A benchmark: runs its configurations and adds one result per configuration.
using benchmark_function = void (*)(const options&, report&);

/// A benchmark's name (as in the JSON) and its function.
struct benchmark_entry {
    const char* name;
    benchmark_function run;
};

void run_generation(const options&, report&);
void run_decode_bandwidth(const options&, report&);
void run_layout_overhead(const options&, report&);
void run_memory_waste(const options&, report&);
void run_prefill(const options&, report&);
/// The prefill benchmark's second part: every layout x storage type at one shape (prefill_types.cpp).
void run_prefill_types(const options&, report&);
void run_dynamic_heads(const options&, report&);
void run_host_tier(const options&, report&);
void run_element_types(const options&, report&);
void run_prefix_tiers(const options&, report&);
void run_decode_cold(const options&, report&);

}  // namespace kvcache::bench
