// A small persistent pool of worker threads for the example model's loops.
// Decode steps run dozens of short matmuls per token; starting threads for
// each one would cost more than the work, so the workers stay parked.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvcache::examples {

/// Runs a body over an index range split across a fixed set of threads.
class thread_pool {
public:
    /// threads <= 0 means std::thread::hardware_concurrency().
    explicit thread_pool(int threads = 0) {
        if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        size_ = threads;
        for (int worker = 1; worker < size_; ++worker) workers_.emplace_back([this, worker] { run_worker(worker); });
    }

    ~thread_pool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (auto& thread : workers_) thread.join();
    }

    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    /// Threads that share the work, the caller included.
    int size() const noexcept { return size_; }

    /// Calls body(begin, end) on disjoint chunks covering [0, count) and waits for all of them.
    /// Chunks are at least `grain` long so tiny loops stay on the calling thread.
    void parallel_for(int count, const std::function<void(int, int)>& body, int grain = 1) {
        if (count <= 0) return;
        int chunks = std::min(size_, std::max(1, count / std::max(1, grain)));
        if (chunks <= 1) {
            body(0, count);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            job_ = &body;
            job_count_ = count;
            job_chunks_ = chunks;
            pending_ = chunks - 1;
            ++generation_;
        }
        wake_.notify_all();
        run_chunk(0, body, count, chunks);
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [this] { return pending_ == 0; });
        job_ = nullptr;
    }

private:
    static void run_chunk(int chunk, const std::function<void(int, int)>& body, int count, int chunks) {
        int begin = static_cast<int>(static_cast<std::int64_t>(count) * chunk / chunks);
        int end = static_cast<int>(static_cast<std::int64_t>(count) * (chunk + 1) / chunks);
        if (begin < end) body(begin, end);
    }

    void run_worker(int worker) {
        std::uint64_t seen = 0;
        for (;;) {
            const std::function<void(int, int)>* job = nullptr;
            int count = 0, chunks = 0;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
                if (stopping_) return;
                seen = generation_;
                job = job_;
                count = job_count_;
                chunks = job_chunks_;
            }
            if (worker < chunks) {
                run_chunk(worker, *job, count, chunks);
                std::lock_guard<std::mutex> lock(mutex_);
                if (--pending_ == 0) done_.notify_one();
            }
        }
    }

    int size_ = 1;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_;
    const std::function<void(int, int)>* job_ = nullptr;
    int job_count_ = 0;
    int job_chunks_ = 0;
    int pending_ = 0;
    std::uint64_t generation_ = 0;
    bool stopping_ = false;
};

}  // namespace kvcache::examples
