// The CPU backend's worker threads: one process-wide pool that runs
// parallel_for over work items, the caller taking part. Starting threads per
// call would cost more than a short decode step.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "kvcache/core/error.hpp"

namespace kvcache {
namespace cpu {
namespace detail {

/// A fixed set of workers that run one parallel_for at a time.
class thread_pool {
public:
    explicit thread_pool(int threads) { start(threads); }
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    ~thread_pool() { stop(); }

    /// The process-wide pool the CPU backend uses.
    static thread_pool& instance() {
        static thread_pool pool(0);
        return pool;
    }

    /// Threads taking part in a parallel_for, the caller included.
    int threads() const noexcept { return int(workers_.size()) + 1; }

    /// Replaces the workers; 0 means std::thread::hardware_concurrency().
    void resize(int threads) {
        require(threads >= 0, error_code::invalid_argument, "thread count ", threads, " must not be negative");
        std::lock_guard<std::mutex> busy(call_mutex_);
        stop();
        start(threads);
    }

    /// Calls body(i) for i in [0, count), spread over the workers; rethrows the
    /// first exception a body threw. Runs inline when the pool is busy with
    /// another caller's loop or when called from inside a body.
    void parallel_for(int count, const std::function<void(int)>& body) {
        if (count <= 0) return;
        std::unique_lock<std::mutex> busy(call_mutex_, std::try_to_lock);
        if (!busy.owns_lock() || workers_.empty() || count == 1 || inside_body()) {
            for (int i = 0; i < count; ++i) body(i);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            body_ = &body;
            count_ = count;
            next_.store(0);
            pending_ = int(workers_.size());
            failure_ = nullptr;
            ++generation_;
        }
        wake_.notify_all();
        run_items();
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return pending_ == 0; });
        body_ = nullptr;
        if (failure_) std::rethrow_exception(failure_);
    }

private:
    static bool& inside_body() {
        thread_local bool inside = false;
        return inside;
    }

    void start(int threads) {
        if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
        quit_ = false;
        for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
    }

    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            quit_ = true;
        }
        wake_.notify_all();
        for (auto& worker : workers_) worker.join();
        workers_.clear();
    }

    void run_items() {
        inside_body() = true;
        for (int i = next_.fetch_add(1); i < count_; i = next_.fetch_add(1)) {
            try {
                (*body_)(i);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mutex_);
                if (!failure_) failure_ = std::current_exception();
            }
        }
        inside_body() = false;
    }

    void work() {
        std::size_t seen = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
                if (quit_) return;
                seen = generation_;
            }
            run_items();
            std::lock_guard<std::mutex> lock(mutex_);
            if (--pending_ == 0) done_.notify_one();
        }
    }

    std::mutex call_mutex_;  // one parallel_for at a time
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> workers_;
    const std::function<void(int)>* body_ = nullptr;
    int count_ = 0;
    std::atomic<int> next_{0};
    int pending_ = 0;
    std::size_t generation_ = 0;
    bool quit_ = false;
    std::exception_ptr failure_;
};

}  // namespace detail

/// Sets the threads the CPU backend uses (the caller included); 0 means
/// std::thread::hardware_concurrency(), the default.
inline void set_thread_count(int threads) { detail::thread_pool::instance().resize(threads); }

/// Threads the CPU backend uses, the caller included.
inline int thread_count() { return detail::thread_pool::instance().threads(); }

}  // namespace cpu
}  // namespace kvcache
