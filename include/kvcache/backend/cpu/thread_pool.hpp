// The CPU backend's worker threads: a pool that runs parallel_for over work
// items, the caller taking part. Starting threads per call would cost more
// than a short decode step, so a pool keeps its workers; the process-wide one
// serves every cpu_backend{} and a caller may bring its own.
//
// Outside the ISA-keyed namespace of cpu/isa.hpp: nothing in it depends on
// the vector instructions, and units built for different ISAs must see one
// type (and one process-wide pool), not one each.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "kvcache/core/error.hpp"

namespace kvcache {
namespace cpu {

/// A fixed set of workers that runs one parallel_for at a time.
///
/// Concurrency: parallel_for may be called from any thread, but a pool runs
/// one loop at a time. A loop called while another thread's loop holds the
/// pool, or from inside a body (of any pool), runs all its items inline on the
/// calling thread: the result is the same and nothing deadlocks, but that loop
/// is single-threaded. Callers that run steps concurrently (one per request
/// thread, say) give each its own pool; busy_inline_loops() counts the loops
/// that lost their threads to another caller.
class thread_pool {
public:
    /// Starts threads - 1 workers (the caller of parallel_for is the last
    /// thread); 0 means std::thread::hardware_concurrency(). Throws
    /// kvcache::error (invalid_argument) naming a negative count.
    explicit thread_pool(int threads) { start(checked(threads)); }
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    /// Joins the workers; no loop may be running on the pool.
    ~thread_pool() { stop(); }

    /// The process-wide pool: what cpu_backend{}, set_thread_count and
    /// thread_count use. Started on first use with every hardware thread.
    static thread_pool& process_wide() {
        static thread_pool pool(0);
        return pool;
    }

    /// Threads taking part in a parallel_for, the caller included.
    int threads() const noexcept { return threads_.load(std::memory_order_relaxed); }

    /// Loops that ran inline on their caller because another thread's loop
    /// held the pool (loops called from inside a body are not counted: their
    /// thread is already one of a loop's). Never reset; compare two readings.
    std::uint64_t busy_inline_loops() const noexcept { return busy_inline_loops_.load(std::memory_order_relaxed); }

    /// Replaces the workers, waiting for a running loop to end; 0 means
    /// std::thread::hardware_concurrency(). Throws kvcache::error
    /// (invalid_argument) for a negative count or when called from inside one
    /// of this pool's bodies, which would wait for itself.
    void resize(int threads) {
        threads = checked(threads);
        require(running_body() != this, error_code::invalid_argument,
                "thread_pool::resize called from inside one of the pool's own loops");
        std::lock_guard<std::mutex> busy(call_mutex_);
        stop();
        start(threads);
    }

    /// Calls body(i) for each i in [0, count), spread over the pool's threads,
    /// and returns when all are done; rethrows the first exception a body
    /// threw. Inline on the calling thread when the pool is busy with
    /// another thread's loop, or when called from inside a body.
    void parallel_for(int count, const std::function<void(int)>& body) {
        if (count <= 0) return;
        // Checked before the lock: the thread running a body of this pool's
        // loop may be the one holding call_mutex_, and must not lock it again.
        if (count == 1 || threads() == 1 || running_body() != nullptr) return run_inline(count, body);
        std::unique_lock<std::mutex> busy(call_mutex_, std::try_to_lock);
        if (!busy.owns_lock()) {
            busy_inline_loops_.fetch_add(1, std::memory_order_relaxed);
            return run_inline(count, body);
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            body_ = &body;
            count_ = count;
            next_.store(0);
            pending_ = int(workers_.size());  // 0 if a resize to one thread came in between: the caller does all
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
    static int checked(int threads) {
        require(threads >= 0, error_code::invalid_argument, "thread count ", threads, " must not be negative");
        return threads == 0 ? int(std::max(1u, std::thread::hardware_concurrency())) : threads;
    }

    // The pool whose loop body this thread is running, if any.
    static const thread_pool*& running_body() {
        thread_local const thread_pool* pool = nullptr;
        return pool;
    }

    static void run_inline(int count, const std::function<void(int)>& body) {
        for (int i = 0; i < count; ++i) body(i);
    }

    void start(int threads) {
        quit_ = false;
        for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
        threads_.store(threads, std::memory_order_relaxed);
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
        const thread_pool* outer = running_body();
        running_body() = this;
        for (int i = next_.fetch_add(1); i < count_; i = next_.fetch_add(1)) {
            try {
                (*body_)(i);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mutex_);
                if (!failure_) failure_ = std::current_exception();
            }
        }
        running_body() = outer;
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

    std::mutex call_mutex_;  // held by the loop that has the workers
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> workers_;
    // Atomic: read without call_mutex_ (by threads() and parallel_for) while a resize may write it.
    std::atomic<int> threads_{1};
    std::atomic<std::uint64_t> busy_inline_loops_{0};
    const std::function<void(int)>* body_ = nullptr;
    int count_ = 0;
    std::atomic<int> next_{0};
    int pending_ = 0;
    std::size_t generation_ = 0;
    bool quit_ = false;
    std::exception_ptr failure_;
};

/// Sets the threads of the process-wide pool (the caller included), which
/// cpu_backend{} runs on; 0 means std::thread::hardware_concurrency(), the
/// default. Waits for a loop running on it.
inline void set_thread_count(int threads) { thread_pool::process_wide().resize(threads); }

/// Threads of the process-wide pool, the caller included.
inline int thread_count() { return thread_pool::process_wide().threads(); }

}  // namespace cpu
}  // namespace kvcache
