// detail::run_in_parallel, which match_prefix reads page files with: every
// task runs once whatever the thread count, and a task's exception reaches
// the caller after every thread has joined.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kvcache/cache/parallel_reads.hpp"

TEST_CASE("every task runs exactly once, on up to the threads asked for") {
    for (const int threads : {1, 2, 3, 8}) {
        for (const int count : {0, 1, 2, 7, 40}) {
            INFO(threads << " threads, " << count << " tasks");
            std::vector<std::atomic<int>> runs(std::size_t(count) + 1);
            std::mutex lock;
            std::set<std::thread::id> ran_on;
            kvcache::detail::run_in_parallel(count, threads, [&](int i) {
                ++runs[std::size_t(i)];
                const std::lock_guard<std::mutex> hold(lock);
                ran_on.insert(std::this_thread::get_id());
            });
            for (int i = 0; i < count; ++i) CHECK(runs[std::size_t(i)] == 1);
            CHECK(runs[std::size_t(count)] == 0);
            CHECK(ran_on.size() <= std::size_t(std::min(threads, std::max(count, 1))));
            if (threads == 1 && count > 0) CHECK(ran_on.count(std::this_thread::get_id()) == 1);  // the caller's own
        }
    }
}

TEST_CASE("a task's exception is rethrown once every thread has joined") {
    for (const int threads : {1, 4}) {
        INFO(threads << " threads");
        std::atomic<int> finished{0};
        CHECK_THROWS_WITH_AS(kvcache::detail::run_in_parallel(20, threads,
                                                             [&](int i) {
                                                                 if (i == 3) throw std::runtime_error("task 3 failed");
                                                                 ++finished;
                                                             }),
                             "task 3 failed", std::runtime_error);
        // Tasks already taken finish; none runs after the call returned.
        const int seen = finished;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        CHECK(finished == seen);
        CHECK(seen <= 19);
    }
}
