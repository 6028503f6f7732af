// Independent reads and writes (page files of the disk tier) spread over a
// few threads started for one call. The cache owners sit below the backends, so they
// cannot borrow the CPU backend's pool; a disk read is mostly system calls,
// page faults and a checksum, which threads of their own overlap well.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace kvcache {
namespace detail {

/// Runs task(i) for every i in [0, count) on up to `threads` threads, the
/// caller's among them, and returns once every task has run. The first
/// exception a task throws is rethrown here after every thread has joined
/// (tasks not yet started are then skipped). A thread that cannot be started
/// leaves its share to the others.
/// @tparam Task callable as task(int), safe to call from several threads at once
template <class Task>
void run_in_parallel(int count, int threads, const Task& task) {
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr first_failure;
    std::mutex failure_lock;
    const auto work = [&] {
        for (int i = next++; i < count && !failed; i = next++) {
            try {
                task(i);
            } catch (...) {
                const std::lock_guard<std::mutex> lock(failure_lock);
                if (!first_failure) first_failure = std::current_exception();
                failed = true;
            }
        }
    };
    std::vector<std::thread> helpers;
    const int wanted = std::min(threads, count) - 1;
    try {
        helpers.reserve(std::size_t(std::max(wanted, 0)));
        for (int t = 0; t < wanted; ++t) helpers.emplace_back(work);
    } catch (const std::exception&) {  // no memory or no thread for another helper: fewer threads
    }
    work();
    for (std::thread& helper : helpers) helper.join();
    if (first_failure) std::rethrow_exception(first_failure);
}

}  // namespace detail
}  // namespace kvcache
