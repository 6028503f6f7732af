// The execution context of a thread under the host SIMT emulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvcache/execution/context.hpp"
#include "kvcache/execution/detail/block_runner.hpp"

namespace kvcache {

/// The emulator's shared_array: like shared_view, but every index is checked
/// against the count, and a bad one is reported as a kernel fault.
/// @tparam T a trivially copyable element type
template <class T>
class checked_shared_array {
public:
    checked_shared_array(T* pointer, std::size_t count, std::size_t byte_offset, const detail::block_runner& runner,
                         int thread) noexcept
        : pointer_(pointer), count_(count), byte_offset_(byte_offset), runner_(&runner), thread_(thread) {}

    /// Element i; reports i outside [0, size()).
    T& operator[](std::size_t i) const {
        if (i >= count_)
            runner_->fault(thread_, "shared_array index ", static_cast<std::ptrdiff_t>(i), " is outside its ", count_,
                           " elements (at byte offset ", byte_offset_, " of ", runner_->shared_bytes(),
                           " launch shared bytes)");
        return pointer_[i];
    }
    T* data() const noexcept { return pointer_; }
    std::size_t size() const noexcept { return count_; }

private:
    T* pointer_;
    std::size_t count_;
    std::size_t byte_offset_;
    const detail::block_runner* runner_;
    int thread_;
};

/// The context a kernel body receives under the emulator: one per emulated
/// thread, on that thread's fiber stack. Members are documented in context.hpp.
class emulated_context {
public:
    static constexpr int warp_size = warp_threads;
    static constexpr bool is_emulated = true;

    emulated_context(detail::block_runner& runner, int thread) noexcept : runner_(&runner), thread_(thread) {}

    index3 block_index() const noexcept { return runner_->block_index(); }
    index3 grid_size() const noexcept { return runner_->grid_size(); }
    int thread_index() const noexcept { return thread_; }
    int block_size() const noexcept { return runner_->block_threads(); }
    int lane() const noexcept { return thread_ % warp_size; }
    int warp() const noexcept { return thread_ / warp_size; }
    int warp_count() const noexcept { return runner_->block_threads() / warp_size; }

    void sync_block() { runner_->block_collective(thread_, detail::collective::sync_block, 0.0f); }

    template <class T>
    T shuffle_xor(T value, int lane_mask) {
        return exchange(detail::collective::shuffle_xor, value, lane_mask);
    }
    template <class T>
    T shuffle_down(T value, int delta) {
        return exchange(detail::collective::shuffle_down, value, delta);
    }
    template <class T>
    T shuffle_index(T value, int source_lane) {
        return exchange(detail::collective::shuffle_index, value, source_lane);
    }

    bool warp_any(bool predicate) { return runner_->warp_collective(thread_, detail::collective::warp_any, predicate, 0) != 0; }
    bool warp_all(bool predicate) { return runner_->warp_collective(thread_, detail::collective::warp_all, predicate, 0) != 0; }
    unsigned warp_ballot(bool predicate) {
        return static_cast<unsigned>(runner_->warp_collective(thread_, detail::collective::warp_ballot, predicate, 0));
    }

    float warp_sum(float value) { return exchange(detail::collective::warp_sum, value, 0); }
    float warp_max(float value) { return exchange(detail::collective::warp_max, value, 0); }
    float block_sum(float value) { return runner_->block_collective(thread_, detail::collective::block_sum, value); }
    float block_max(float value) { return runner_->block_collective(thread_, detail::collective::block_max, value); }

    /// `count` T's of dynamic shared memory from `byte_offset`; reports a range
    /// past the launch's shared bytes or an offset misaligned for T.
    template <class T>
    checked_shared_array<T> shared_array(std::size_t byte_offset, std::size_t count) const {
        static_assert(std::is_trivially_copyable_v<T>, "shared memory holds trivially copyable types only");
        const std::size_t limit = runner_->shared_bytes();
        if (byte_offset > limit || count > (limit - byte_offset) / sizeof(T))
            runner_->fault(thread_, "shared_array of ", count, " x ", sizeof(T), " bytes at byte offset ", byte_offset,
                           " exceeds the ", limit, " shared bytes of the launch");
        if (byte_offset % alignof(T) != 0)
            runner_->fault(thread_, "shared_array at byte offset ", byte_offset, " is not aligned to ", alignof(T));
        return {reinterpret_cast<T*>(runner_->shared_memory() + byte_offset), count, byte_offset, *runner_, thread_};
    }
    std::size_t shared_bytes() const noexcept { return runner_->shared_bytes(); }

    /// 16-byte load; reports a misaligned or null address.
    vector16 load16(const void* address) const {
        check16(address, "load16");
        vector16 v;
        std::memcpy(&v, address, sizeof v);
        return v;
    }
    /// 16-byte store; reports a misaligned or null address.
    void store16(void* address, const vector16& v) const {
        check16(address, "store16");
        std::memcpy(address, &v, sizeof v);
    }

private:
    template <class T>
    T exchange(detail::collective op, T value, int argument) {
        static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                      "warp shuffles move trivially copyable values of 4 or 8 bytes");
        using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
        const std::uint64_t result = runner_->warp_collective(thread_, op, detail::bit_copy<bits_type>(value), argument);
        return detail::bit_copy<T>(static_cast<bits_type>(result));
    }

    void check16(const void* address, const char* what) const {
        const auto at = reinterpret_cast<std::uintptr_t>(address);
        if (address == nullptr) runner_->fault(thread_, what, " of a null address");
        if (at % 16 != 0)
            runner_->fault(thread_, what, " at address 0x", std::hex, at, std::dec, " is not 16-byte aligned (off by ",
                           at % 16, ")");
    }

    detail::block_runner* runner_;
    int thread_;
};

}  // namespace kvcache
