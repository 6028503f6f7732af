// The memory read bandwidth of this machine, measured in the same run as the
// kernels it is compared with: a multi-threaded streaming read over a buffer
// far larger than the last-level cache.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "harness/timing.hpp"
#include "kvcache/core/memory.hpp"

namespace kvcache::bench {

/// Result of the streaming-read measurement.
struct bandwidth_result {
    double gbytes_per_s = 0;   ///< median, 1e9 bytes per second
    timing seconds;            ///< per pass over the buffer
    std::size_t bytes = 0;     ///< buffer size
    int threads = 0;           ///< reader threads
};

/// Reads `bytes` of memory with `threads` threads, each summing its own
/// contiguous share (the sum is kept so the reads cannot be optimised away).
inline bandwidth_result measure_read_bandwidth(std::size_t bytes, int threads, int repeats) {
    const std::size_t words = bytes / sizeof(std::uint64_t);
    host_buffer<std::uint64_t> buffer(words);
    for (std::size_t i = 0; i < words; i += 512) buffer[i] = i;  // touch every page
    std::vector<std::uint64_t> sums(static_cast<std::size_t>(threads) * 8);
    auto pass = [&] {
        std::vector<std::thread> workers;
        const std::size_t share = (words + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                const std::size_t begin = std::min(words, share * static_cast<std::size_t>(t));
                const std::size_t end = std::min(words, begin + share);
                std::uint64_t a = 0, b = 0, c = 0, d = 0;
                const std::uint64_t* data = buffer.data();
                std::size_t i = begin;
                for (; i + 4 <= end; i += 4) {
                    a += data[i];
                    b += data[i + 1];
                    c += data[i + 2];
                    d += data[i + 3];
                }
                for (; i < end; ++i) a += data[i];
                sums[static_cast<std::size_t>(t) * 8] = a + b + c + d;  // one cache line per thread
            });
        }
        for (auto& worker : workers) worker.join();
    };
    bandwidth_result result;
    result.seconds = measure(pass, 1, repeats);
    result.bytes = words * sizeof(std::uint64_t);
    result.threads = threads;
    result.gbytes_per_s = static_cast<double>(result.bytes) / result.seconds.median / 1e9;
    volatile std::uint64_t sink = 0;
    for (std::uint64_t s : sums) sink = sink + s;
    (void)sink;
    return result;
}

}  // namespace kvcache::bench
