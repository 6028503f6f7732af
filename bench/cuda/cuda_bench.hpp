// kvcache_bench --backend cuda: decode, prefill and append of the CUDA
// backend against a device-to-device copy measured in the same run. Built
// only with KVCACHE_BUILD_CUDA_BENCH where nvcc is found (bench/CMakeLists.txt).
#pragma once

#include <nlohmann/json.hpp>

#include "harness/options.hpp"
#include "harness/report.hpp"

namespace kvcache::bench {

/// The GPU the CUDA benchmarks run on: name, compute capability, memory, L2,
/// driver and runtime versions, peak clocks (runtime API attributes).
nlohmann::json describe_device();

/// Runs the CUDA benchmarks opts selects (cuda_copy, cuda_decode,
/// cuda_append, cuda_prefill) and adds their results to `out`.
void run_cuda_benchmarks(const options& opts, report& out);

}  // namespace kvcache::bench
