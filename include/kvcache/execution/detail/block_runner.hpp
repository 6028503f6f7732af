// The emulator's scheduler: runs the threads of one block as fibers and
// implements the block and warp collectives between them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kvcache/core/error.hpp"
#include "kvcache/execution/context.hpp"
#include "kvcache/execution/detail/fiber.hpp"
#include "kvcache/execution/schedule.hpp"

namespace kvcache::detail {

/// The synchronisation points at which an emulated thread can wait.
enum class collective : std::uint8_t {
    none,
    sync_block,
    sync_block_or,
    block_sum,
    block_max,
    shuffle_xor,
    shuffle_down,
    shuffle_index,
    warp_any,
    warp_all,
    warp_ballot,
    warp_sum,
    warp_max,
};

/// The context member that a collective stands for, as named in faults.
inline const char* collective_name(collective c) noexcept {
    switch (c) {
    case collective::none: return "none";
    case collective::sync_block: return "sync_block";
    case collective::sync_block_or: return "sync_block_or";
    case collective::block_sum: return "block_sum";
    case collective::block_max: return "block_max";
    case collective::shuffle_xor: return "shuffle_xor";
    case collective::shuffle_down: return "shuffle_down";
    case collective::shuffle_index: return "shuffle_index";
    case collective::warp_any: return "warp_any";
    case collective::warp_all: return "warp_all";
    case collective::warp_ballot: return "warp_ballot";
    case collective::warp_sum: return "warp_sum";
    case collective::warp_max: return "warp_max";
    }
    return "unknown";
}

/// True for the collectives the whole block takes part in.
constexpr bool is_block_collective(collective c) noexcept {
    return c == collective::sync_block || c == collective::sync_block_or || c == collective::block_sum ||
           c == collective::block_max;
}

/// Thrown into suspended fibers to unwind them after a fault; deliberately not
/// a std::exception so kernel code cannot mistake it for its own error.
struct fiber_unwind {};

/// splitmix64: a tiny, portable generator, so shuffles are identical everywhere.
struct schedule_random {
    std::uint64_t state;
    std::uint64_t next() noexcept {
        std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    /// Fisher-Yates with this generator.
    void shuffle(std::vector<int>& values) noexcept {
        for (std::size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[next() % i]);
    }
};

/// Runs blocks of one kernel launch, one at a time, each thread a fiber. One
/// runner per OS thread taking part in the launch.
class block_runner {
public:
    /// Runs the body for one thread: builds the context and calls Body{}.
    using invoke_function = void (*)(const void* params, block_runner& runner, int thread);

    block_runner(const char* kernel_name, int block_threads, index3 grid, std::size_t shared_bytes,
                 const emulator_options& options, invoke_function invoke, const void* params)
        : kernel_name_(kernel_name),
          block_threads_(block_threads),
          grid_(grid),
          shared_bytes_(shared_bytes),
          options_(options),
          invoke_(invoke),
          params_(params),
          threads_(static_cast<std::size_t>(block_threads)),
          warps_(static_cast<std::size_t>(block_threads / warp_threads)),
          block_values_(static_cast<std::size_t>(block_threads)),
          order_(static_cast<std::size_t>(block_threads)),
          shared_memory_(new (std::align_val_t{64}) unsigned char[shared_allocation(shared_bytes)]) {
        // The stack pool of this OS thread is in use while a runner lives: no nesting.
        if (runner_alive())
            throw_error(error_code::invalid_argument, "emulate called from inside an emulated kernel body");
        thread_stack_pool().reserve(block_threads, options.stack_bytes);
        runner_alive() = true;
    }
    ~block_runner() { runner_alive() = false; }

    block_runner(const block_runner&) = delete;
    block_runner& operator=(const block_runner&) = delete;

    /// Runs every thread of block `block` to completion; throws the first
    /// fault or exception of the block after unwinding all of its fibers.
    void run_block(index3 block) {
        block_ = block;
        begin_block();
        std::exception_ptr failure;
        try {
            run_rounds();
        } catch (...) {
            failure = std::current_exception();
        }
        if (!failure) failure = pending_;
        if (failure) {
            unwind_all();
            std::rethrow_exception(failure);
        }
    }

    // ---- what the emulated context uses ------------------------------------

    index3 block_index() const noexcept { return block_; }
    index3 grid_size() const noexcept { return grid_; }
    int block_threads() const noexcept { return block_threads_; }
    std::size_t shared_bytes() const noexcept { return shared_bytes_; }
    unsigned char* shared_memory() const noexcept { return shared_memory_.get(); }

    /// Throws kernel_fault naming kernel, block and thread, then the parts.
    template <class... Parts>
    [[noreturn]] void fault(int thread, Parts&&... parts) const {
        throw_error(error_code::kernel_fault, "kernel ", kernel_name_, ", block (", block_.x, ",", block_.y, ",",
                    block_.z, "), thread ", thread, " (warp ", thread / warp_threads, ", lane ",
                    thread % warp_threads, "): ", std::forward<Parts>(parts)...);
    }

    /// A block-wide collective: waits until every thread of the block arrives,
    /// and returns the block's sum or max for block_sum / block_max (sync_block_or
    /// passes its predicate as 0 or 1 and takes the max: any thread's true gives 1).
    float block_collective(int thread, collective op, float value) {
        if (aborting_) throw fiber_unwind{};
        if (block_arrived_ == 0) {
            block_op_ = op;
            block_first_ = thread;
        } else if (block_op_ != op) {
            fault(thread, "divergent barrier: calls ", collective_name(op), " while thread ", block_first_,
                  " waits at ", collective_name(block_op_));
        }
        block_values_[static_cast<std::size_t>(thread)] = value;
        wait(thread, op);
        if (++block_arrived_ == block_threads_) release_block();
        yield(thread);
        return block_result_;
    }

    /// A full-warp collective: waits for all 32 lanes of the warp and returns
    /// this lane's result (raw bits; the context converts).
    std::uint64_t warp_collective(int thread, collective op, std::uint64_t bits, int argument) {
        if (aborting_) throw fiber_unwind{};
        warp_slots& warp = warps_[static_cast<std::size_t>(thread / warp_threads)];
        const int lane = thread % warp_threads;
        if (warp.arrived == 0) {
            warp.op = op;
            warp.first_lane = lane;
        } else if (warp.op != op) {
            fault(thread, "divergent warp: calls ", collective_name(op), " while lane ", warp.first_lane,
                  " of the warp waits at ", collective_name(warp.op));
        }
        warp.input[lane] = bits;
        warp.argument[lane] = argument;
        wait(thread, op);
        if (++warp.arrived == warp_threads) release_warp(thread / warp_threads);
        yield(thread);
        return warp.output[lane];
    }

    /// Entered on a fresh fiber stack by the first switch to a thread.
    static void fiber_entry() {
        block_runner& runner = *current_runner();
        const int thread = runner.current_;
        runner.arrived_on_fiber();
        try {
            runner.invoke_(runner.params_, runner, thread);
        } catch (const fiber_unwind&) {
            // unwound after a fault elsewhere in the block: nothing to report
        } catch (...) {
            if (!runner.pending_) runner.pending_ = std::current_exception();
        }
        runner.threads_[static_cast<std::size_t>(thread)].state = thread_state::finished;
        ++runner.finished_;
        runner.leave(thread, true);
        std::terminate();  // a finished fiber is never resumed
    }

private:
    enum class thread_state : std::uint8_t { ready, waiting, finished };

    struct thread_slot {
        machine_context context;
        thread_state state = thread_state::ready;
        collective waiting_at = collective::none;
        bool started = false;
        void* fake_stack = nullptr;
    };

    struct warp_slots {
        std::uint64_t input[warp_threads];
        std::uint64_t output[warp_threads];
        int argument[warp_threads];
        collective op = collective::none;
        int first_lane = 0;
        int arrived = 0;
    };

    static std::size_t shared_allocation(std::size_t bytes) noexcept { return (bytes + 63u) / 64u * 64u + 64u; }

    static bool& runner_alive() noexcept {
        static thread_local bool alive = false;
        return alive;
    }

    static block_runner*& current_runner() noexcept {
        static thread_local block_runner* runner = nullptr;
        return runner;
    }

    void begin_block() {
        for (auto& t : threads_) t = thread_slot{};
        for (auto& w : warps_) {
            w.op = collective::none;
            w.arrived = 0;
        }
        block_arrived_ = 0;
        finished_ = 0;
        aborting_ = false;
        pending_ = nullptr;
        // Shared memory starts as garbage on a GPU; NaN-filled here, so a read before a write shows.
        std::memset(shared_memory_.get(), 0xff, shared_allocation(shared_bytes_));
        std::iota(order_.begin(), order_.end(), 0);
        if (options_.schedule.order == emulator_schedule::kind::reverse) std::reverse(order_.begin(), order_.end());
        random_.state = options_.schedule.seed ^ (linear_index(block_, grid_) * 0x2545f4914f6cdd1dull);
    }

    // A round resumes every ready thread once, in order_. The scheduler starts
    // the first; each thread that yields switches straight to the next ready
    // one (one stack switch per yield), and the last returns to the scheduler.
    void run_rounds() {
        const bool shuffled = options_.schedule.order == emulator_schedule::kind::shuffled;
        while (finished_ < block_threads_) {
            if (shuffled) random_.shuffle(order_);
            const int first = next_ready(0);
            if (first < 0) diagnose_stall();
            resume(first);
            if (pending_) return;
        }
    }

    // The first thread at or after `position` in order_ that is ready; moves position_ there.
    int next_ready(std::size_t position) noexcept {
        for (; position < order_.size(); ++position) {
            const int thread = order_[position];
            if (threads_[static_cast<std::size_t>(thread)].state == thread_state::ready) {
                position_ = position;
                return thread;
            }
        }
        return -1;
    }

    // The context to switch to for `thread`, set up on its stack at its first run.
    machine_context& context_of(int thread) {
        thread_slot& slot = threads_[static_cast<std::size_t>(thread)];
        if (!slot.started) {
            slot.started = true;
            asan_unpoison_stack(thread_stack_pool().bottom(thread), thread_stack_pool().stack_bytes());
            prepare_context(slot.context, thread_stack_pool().bottom(thread), thread_stack_pool().stack_bytes(),
                            &block_runner::fiber_entry);
        }
        return slot.context;
    }

    // From the scheduler's stack into a thread; returns when the round ends.
    void resume(int thread) {
        machine_context& target = context_of(thread);
        current_runner() = this;
        current_ = thread;
        from_scheduler_ = true;
        void* fake_stack = nullptr;
        asan_start_switch(&fake_stack, thread_stack_pool().bottom(thread), thread_stack_pool().stack_bytes());
        switch_context(scheduler_, target);
        asan_finish_switch(fake_stack, nullptr, nullptr);
    }

    // Run on a fiber right after it is switched to; learns the scheduler's stack from ASan.
    void arrived_on_fiber() noexcept {
        if (from_scheduler_) {
            asan_finish_switch(threads_[static_cast<std::size_t>(current_)].fake_stack, &scheduler_stack_bottom_,
                               &scheduler_stack_size_);
            from_scheduler_ = false;
        } else {
            asan_finish_switch(threads_[static_cast<std::size_t>(current_)].fake_stack, nullptr, nullptr);
        }
    }

    // Suspends (or, when finished, abandons) `thread`, switching to the next
    // ready thread of the round or back to the scheduler.
    void leave(int thread, bool finished) {
        thread_slot& slot = threads_[static_cast<std::size_t>(thread)];
        void** fake_stack = finished ? nullptr : &slot.fake_stack;
        const int next = (aborting_ || pending_) ? -1 : next_ready(position_ + 1);
        if (next < 0) {
            asan_start_switch(fake_stack, scheduler_stack_bottom_, scheduler_stack_size_);
            switch_context(slot.context, scheduler_);
        } else {
            machine_context& target = context_of(next);
            current_ = next;
            asan_start_switch(fake_stack, thread_stack_pool().bottom(next), thread_stack_pool().stack_bytes());
            switch_context(slot.context, target);
        }
        arrived_on_fiber();
    }

    void wait(int thread, collective op) noexcept {
        thread_slot& slot = threads_[static_cast<std::size_t>(thread)];
        slot.state = thread_state::waiting;
        slot.waiting_at = op;
    }

    void yield(int thread) {
        leave(thread, false);
        if (aborting_) throw fiber_unwind{};
    }

    void make_ready(int thread) noexcept {
        thread_slot& slot = threads_[static_cast<std::size_t>(thread)];
        slot.state = thread_state::ready;
        slot.waiting_at = collective::none;
    }

    // CUB's order: a pairwise tree inside each warp, then the warp results left to right.
    static float warp_tree(float* values, bool maximum) noexcept {
        for (int width = warp_threads / 2; width >= 1; width /= 2)
            for (int i = 0; i < width; ++i)
                values[i] = maximum ? (values[2 * i + 1] > values[2 * i] ? values[2 * i + 1] : values[2 * i])
                                    : values[2 * i] + values[2 * i + 1];
        return values[0];
    }

    void release_block() {
        if (block_op_ != collective::sync_block) {
            const bool maximum = block_op_ == collective::block_max || block_op_ == collective::sync_block_or;
            float result = 0.0f;
            for (std::size_t w = 0; w < warps_.size(); ++w) {
                const float partial = warp_tree(&block_values_[w * warp_threads], maximum);
                result = w == 0 ? partial : maximum ? (partial > result ? partial : result) : result + partial;
            }
            block_result_ = result;
        }
        for (int t = 0; t < block_threads_; ++t) make_ready(t);
        block_arrived_ = 0;
    }

    void release_warp(int warp_index) {
        warp_slots& warp = warps_[static_cast<std::size_t>(warp_index)];
        const auto as_float = [](std::uint64_t bits) { return bit_copy<float>(static_cast<std::uint32_t>(bits)); };
        switch (warp.op) {
        case collective::shuffle_xor:
        case collective::shuffle_down:
        case collective::shuffle_index:
            for (int lane = 0; lane < warp_threads; ++lane) {
                const int argument = warp.argument[lane];
                int source = warp.op == collective::shuffle_xor    ? lane ^ argument
                             : warp.op == collective::shuffle_down ? lane + argument
                                                                   : (argument & (warp_threads - 1));
                if (source < 0 || source >= warp_threads) source = lane;
                warp.output[lane] = warp.input[source];
            }
            break;
        case collective::warp_any:
        case collective::warp_all:
        case collective::warp_ballot: {
            std::uint64_t ballot = 0;
            for (int lane = 0; lane < warp_threads; ++lane) ballot |= (warp.input[lane] & 1u) << lane;
            const std::uint64_t result = warp.op == collective::warp_ballot ? ballot
                                         : warp.op == collective::warp_any  ? (ballot != 0 ? 1u : 0u)
                                                                            : (ballot == 0xffffffffull ? 1u : 0u);
            std::fill(std::begin(warp.output), std::end(warp.output), result);
            break;
        }
        default: {  // warp_sum, warp_max
            float values[warp_threads];
            for (int lane = 0; lane < warp_threads; ++lane) values[lane] = as_float(warp.input[lane]);
            const float result = warp_tree(values, warp.op == collective::warp_max);
            std::fill(std::begin(warp.output), std::end(warp.output), bit_copy<std::uint32_t>(result));
            break;
        }
        }
        for (int lane = 0; lane < warp_threads; ++lane) make_ready(warp_index * warp_threads + lane);
        warp.arrived = 0;
    }

    // No thread can run, yet some have not finished: name what a GPU would hang or misbehave on.
    [[noreturn]] void diagnose_stall() const {
        int at_block = -1, at_warp = -1, exited = -1;
        for (int t = 0; t < block_threads_; ++t) {
            const thread_slot& slot = threads_[static_cast<std::size_t>(t)];
            if (slot.state == thread_state::finished) {
                if (exited < 0) exited = t;
            } else if (is_block_collective(slot.waiting_at)) {
                if (at_block < 0) at_block = t;
            } else if (at_warp < 0) {
                at_warp = t;
            }
        }
        const auto waiting_at = [this](int t) { return collective_name(threads_[static_cast<std::size_t>(t)].waiting_at); };
        if (at_block < 0 && at_warp < 0) fault(0, "stalled with no thread waiting");  // bookkeeping bug
        if (at_block >= 0 && at_warp >= 0)
            fault(at_block, "divergent barrier: waits at ", waiting_at(at_block), " while thread ", at_warp,
                  " waits at ", waiting_at(at_warp));
        if (at_block >= 0)
            fault(exited < 0 ? at_block : exited, "exited while thread ", at_block, " waits at ", waiting_at(at_block),
                  " (every thread of the block must reach the barrier)");
        // Only warp collectives wait: find the first lane missing from a partly arrived warp.
        const int warp_begin = at_warp / warp_threads * warp_threads;
        for (int t = warp_begin; t < warp_begin + warp_threads; ++t)
            if (threads_[static_cast<std::size_t>(t)].state == thread_state::finished)
                fault(at_warp, waiting_at(at_warp), " with lanes missing: lane ", t - warp_begin, " (thread ", t,
                      ") has exited");
        fault(at_warp, "stalled at ", waiting_at(at_warp));  // unreachable when the bookkeeping is right
    }

    // After a fault: resume every suspended fiber so that its pending collective
    // throws fiber_unwind and its frames are destroyed; nothing stays suspended.
    void unwind_all() noexcept {
        aborting_ = true;
        for (int t = 0; t < block_threads_; ++t) {
            thread_slot& slot = threads_[static_cast<std::size_t>(t)];
            if (slot.state == thread_state::finished) continue;
            if (!slot.started) {
                slot.state = thread_state::finished;
                ++finished_;
                continue;
            }
            while (slot.state != thread_state::finished) resume(t);
        }
        aborting_ = false;
    }

    const char* kernel_name_;
    int block_threads_;
    index3 grid_;
    std::size_t shared_bytes_;
    emulator_options options_;
    invoke_function invoke_;
    const void* params_;

    std::vector<thread_slot> threads_;
    std::vector<warp_slots> warps_;
    std::vector<float> block_values_;
    std::vector<int> order_;
    struct aligned_delete {
        void operator()(unsigned char* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
    };
    std::unique_ptr<unsigned char[], aligned_delete> shared_memory_;

    index3 block_{};
    machine_context scheduler_{};
    const void* scheduler_stack_bottom_ = nullptr;
    std::size_t scheduler_stack_size_ = 0;
    schedule_random random_{0};
    std::exception_ptr pending_;
    collective block_op_ = collective::none;
    int block_first_ = 0;
    int block_arrived_ = 0;
    float block_result_ = 0.0f;
    int finished_ = 0;
    int current_ = 0;
    std::size_t position_ = 0;
    bool from_scheduler_ = false;
    bool aborting_ = false;
};

}  // namespace kvcache::detail
