// A description of the machine a benchmark ran on, for its output: CPU,
// caches, memory, the instruction set the bench was compiled for, and the
// load the machine carried while it ran (other work skews every figure).
#pragma once

#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>
#include <sys/utsname.h>
#include <unistd.h>

#include "kvcache/backend/cpu/isa.hpp"

namespace kvcache::bench {

namespace detail {

inline std::string read_first_line(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

inline std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            return colon == std::string::npos ? line : line.substr(colon + 2);
        }
    }
    return "unknown";
}

/// The SIMD extensions this translation unit was compiled for (what the
/// kernels can use), from the compiler's predefined macros.
inline std::string compiled_simd() {
    std::string out;
    auto add = [&](const char* name) { out += out.empty() ? name : std::string(" ") + name; };
#if defined(__AVX512F__)
    add("avx512f");
#endif
#if defined(__AVX512FP16__)
    add("avx512fp16");
#endif
#if defined(__AVX512BF16__)
    add("avx512bf16");
#endif
#if defined(__AVX2__)
    add("avx2");
#endif
#if defined(__FMA__)
    add("fma");
#endif
#if defined(__F16C__)
    add("f16c");
#endif
#if defined(__SSE4_2__)
    add("sse4.2");
#endif
    return out.empty() ? "baseline" : out;
}

}  // namespace detail

/// The 1-minute load average (other processes competing for the cores).
inline double load_average() {
    std::ifstream in("/proc/loadavg");
    double one = -1;
    in >> one;
    return one;
}

/// CPU model, core count, cache sizes, memory, kernel, compiler and the
/// instruction set the bench was built for, as JSON.
inline nlohmann::json describe_machine() {
    nlohmann::json machine;
    machine["cpu"] = detail::cpu_model();
    machine["hardware_threads"] = std::thread::hardware_concurrency();
    nlohmann::json caches = nlohmann::json::object();
    for (int index = 0; index < 8; ++index) {
        const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
        const std::string level = detail::read_first_line(base + "level");
        if (level.empty()) break;
        const std::string type = detail::read_first_line(base + "type");
        caches["L" + level + (type == "Data" ? "d" : type == "Instruction" ? "i" : "")] =
            detail::read_first_line(base + "size");
    }
    machine["caches"] = caches;
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGE_SIZE);
    machine["memory_gib"] = static_cast<double>(pages) * static_cast<double>(page_size) / (1024.0 * 1024 * 1024);
    utsname name{};
    if (uname(&name) == 0) machine["kernel"] = std::string(name.sysname) + " " + name.release;
#if defined(__VERSION__)
    machine["compiler"] = std::string("g++ ") + __VERSION__;
#endif
#if defined(KVCACHE_BENCH_ARCH_FLAGS)
    machine["arch_flags"] = KVCACHE_BENCH_ARCH_FLAGS;
#else
    machine["arch_flags"] = "";
#endif
    machine["simd_compiled"] = detail::compiled_simd();
    // The CPU backend's kernel path for these flags (its ISA namespace): what the figures measure.
    machine["cpu_kernels"] = kvcache::cpu::detail::isa_name;
    machine["backend"] = "cpu";
    machine["gpu"] = "none";
    return machine;
}

/// The last-level cache size in bytes (0 when unknown).
inline std::size_t last_level_cache_bytes() {
    std::size_t largest = 0;
    for (int index = 0; index < 8; ++index) {
        const std::string size =
            detail::read_first_line("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
        if (size.empty()) break;
        std::size_t value = std::stoul(size);
        if (size.back() == 'K') value *= 1024;
        if (size.back() == 'M') value *= 1024 * 1024;
        if (size.back() == 'G') value *= 1024ull * 1024 * 1024;
        if (value > largest) largest = value;
    }
    return largest;
}

/// Physical memory available now, in bytes (MemAvailable; 0 when unknown).
inline std::size_t available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    std::size_t kib = 0;
    std::string unit;
    while (in >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024;
    return 0;
}

}  // namespace kvcache::bench
