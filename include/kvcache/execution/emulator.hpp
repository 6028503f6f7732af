// emulate<Body>: runs a kernel body on the host, every thread of every block,
// with the checks a GPU would punish turned into kernel_fault errors.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "kvcache/core/error.hpp"
#include "kvcache/execution/context.hpp"
#include "kvcache/execution/detail/block_runner.hpp"
#include "kvcache/execution/emulated_context.hpp"
#include "kvcache/execution/schedule.hpp"

namespace kvcache {
namespace detail {

/// Blocks in the order the schedule asks for, as linear block numbers.
inline std::vector<std::size_t> block_order(std::size_t blocks, const emulator_schedule& schedule) {
    std::vector<std::size_t> order(blocks);
    std::iota(order.begin(), order.end(), std::size_t{0});
    if (schedule.order == emulator_schedule::kind::reverse) std::reverse(order.begin(), order.end());
    if (schedule.order == emulator_schedule::kind::shuffled) {
        schedule_random random{~schedule.seed};
        for (std::size_t i = blocks; i > 1; --i) std::swap(order[i - 1], order[random.next() % i]);
    }
    return order;
}

inline index3 block_at(std::size_t linear, index3 grid) noexcept {
    const auto x = static_cast<std::size_t>(grid.x), y = static_cast<std::size_t>(grid.y);
    return {static_cast<int>(linear % x), static_cast<int>(linear / x % y), static_cast<int>(linear / (x * y))};
}

/// Throws kernel_fault for a launch no GPU would accept, invalid_argument for bad options.
inline void check_launch(const char* name, int block_threads, index3 grid, std::size_t shared_bytes,
                         const emulator_options& options) {
    if (!valid_block_threads(block_threads))
        throw_error(error_code::kernel_fault, "kernel ", name, ": block_threads ", block_threads,
                    " must be a positive multiple of ", warp_threads, " no larger than ", max_block_threads);
    if (shared_bytes > options.shared_memory_limit)
        throw_error(error_code::kernel_fault, "kernel ", name, ": dynamic shared memory of ", shared_bytes,
                    " bytes exceeds the limit of ", options.shared_memory_limit, " bytes");
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535)
        throw_error(error_code::kernel_fault, "kernel ", name, ": grid (", grid.x, ",", grid.y, ",", grid.z,
                    ") must be at least 1 in each dimension and at most 65535 in y and z");
    if (options.stack_bytes < 16u * 1024u)
        throw_error(error_code::invalid_argument, "emulator stack_bytes ", options.stack_bytes,
                    " is below the minimum of 16384");
    if (options.worker_threads < 1)
        throw_error(error_code::invalid_argument, "emulator worker_threads ", options.worker_threads,
                    " must be at least 1");
}

}  // namespace detail

/// Runs kernel Body on the host over `grid` blocks of Body::block_threads
/// threads each, one fiber per thread, and returns when every block is done.
/// Faults (divergent barriers, missing shuffle lanes, shared-memory and
/// alignment errors, impossible launches) throw kvcache::error with
/// error_code::kernel_fault naming the kernel, block and thread; an exception
/// thrown by the body itself is rethrown here. The emulator is reusable after
/// any error. When several blocks fail, the first in schedule order is reported.
/// @tparam Body a kernel body (see kvcache/execution/context.hpp)
/// @tparam Params the trivially copyable params struct passed to every thread
template <class Body, class Params>
void emulate(index3 grid, std::size_t shared_bytes, const Params& params, const emulator_options& options = {}) {
    detail::check_kernel_body<Body>();
    detail::check_launch(Body::name, Body::block_threads, grid, shared_bytes, options);
    const auto invoke = [](const void* p, detail::block_runner& runner, int thread) {
        emulated_context context(runner, thread);
        Body{}(context, *static_cast<const Params*>(p));
    };
    const std::vector<std::size_t> order = detail::block_order(volume(grid), options.schedule);
    const int workers = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(options.worker_threads), order.size()));

    std::atomic<std::size_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex failure_mutex;
    std::size_t failure_position = order.size();
    std::exception_ptr failure;
    const auto work = [&] {
        try {
            detail::block_runner runner(Body::name, Body::block_threads, grid, shared_bytes, options, invoke, &params);
            for (std::size_t position = next++; position < order.size() && !stop; position = next++) {
                try {
                    runner.run_block(detail::block_at(order[position], grid));
                } catch (...) {
                    std::lock_guard<std::mutex> lock(failure_mutex);
                    if (position < failure_position) {
                        failure_position = position;
                        failure = std::current_exception();
                    }
                    stop = true;
                }
            }
        } catch (...) {  // the runner could not be built (stacks, shared memory)
            std::lock_guard<std::mutex> lock(failure_mutex);
            if (!failure) failure = std::current_exception();
            stop = true;
        }
    };
    std::vector<std::thread> helpers;
    for (int i = 1; i < workers; ++i) helpers.emplace_back(work);
    work();
    for (std::thread& helper : helpers) helper.join();
    if (failure) std::rethrow_exception(failure);
}

}  // namespace kvcache
