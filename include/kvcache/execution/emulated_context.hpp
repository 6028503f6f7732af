// The execution context of a thread under the host SIMT emulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvcache/execution/context.hpp"
#include "kvcache/execution/detail/block_runner.hpp"

// nvcc may instantiate a body's __host__ __device__ operator() with this
// context from host code (a .cu file that emulates), and then insists that
// every member be callable from both sides. The members are therefore
// __host__ __device__, with their host-only work removed from the device pass,
// where they are never called.
#if KVCACHE_DEVICE_PASS
#define KVCACHE_EMULATOR_RETURN(...) return {};
#define KVCACHE_EMULATOR_DO(...)
#else
#define KVCACHE_EMULATOR_RETURN(...) return __VA_ARGS__;
#define KVCACHE_EMULATOR_DO(...) __VA_ARGS__;
#endif

namespace kvcache {

/// The emulator's shared_array: like shared_view, but every index is checked
/// against the count, and a bad one is reported as a kernel fault.
/// @tparam T a trivially copyable element type
template <class T>
class checked_shared_array {
public:
    checked_shared_array() = default;
    checked_shared_array(T* pointer, std::size_t count, std::size_t byte_offset, const detail::block_runner& runner,
                         int thread) noexcept
        : pointer_(pointer), count_(count), byte_offset_(byte_offset), runner_(&runner), thread_(thread) {}

    /// Element i; reports i outside [0, size()).
    KVCACHE_HOST_DEVICE T& operator[](std::size_t i) const {
        KVCACHE_EMULATOR_DO(if (i >= count_) runner_->fault(thread_, "shared_array index ", static_cast<std::ptrdiff_t>(i),
                                                            " is outside its ", count_, " elements (at byte offset ",
                                                            byte_offset_, " of ", runner_->shared_bytes(),
                                                            " launch shared bytes)"))
        return pointer_[i];
    }
    KVCACHE_HOST_DEVICE T* data() const noexcept { return pointer_; }
    KVCACHE_HOST_DEVICE std::size_t size() const noexcept { return count_; }

private:
    T* pointer_ = nullptr;
    std::size_t count_ = 0;
    std::size_t byte_offset_ = 0;
    const detail::block_runner* runner_ = nullptr;
    int thread_ = 0;
};

/// The context a kernel body receives under the emulator: one per emulated
/// thread, on that thread's fiber stack. Members are documented in context.hpp.
class emulated_context {
public:
    static constexpr int warp_size = warp_threads;
    static constexpr bool is_emulated = true;

    emulated_context(detail::block_runner& runner, int thread) noexcept : runner_(&runner), thread_(thread) {}

    KVCACHE_HOST_DEVICE index3 block_index() const { KVCACHE_EMULATOR_RETURN(runner_->block_index()) }
    KVCACHE_HOST_DEVICE index3 grid_size() const { KVCACHE_EMULATOR_RETURN(runner_->grid_size()) }
    KVCACHE_HOST_DEVICE int thread_index() const noexcept { return thread_; }
    KVCACHE_HOST_DEVICE int block_size() const { KVCACHE_EMULATOR_RETURN(runner_->block_threads()) }
    KVCACHE_HOST_DEVICE int lane() const noexcept { return thread_ % warp_size; }
    KVCACHE_HOST_DEVICE int warp() const noexcept { return thread_ / warp_size; }
    KVCACHE_HOST_DEVICE int warp_count() const { KVCACHE_EMULATOR_RETURN(runner_->block_threads() / warp_size) }

    KVCACHE_HOST_DEVICE void sync_block() {
        KVCACHE_EMULATOR_DO(runner_->block_collective(thread_, detail::collective::sync_block, 0.0f))
    }
    KVCACHE_HOST_DEVICE bool sync_block_or(bool predicate) {
        KVCACHE_EMULATOR_RETURN(
            runner_->block_collective(thread_, detail::collective::sync_block_or, predicate ? 1.0f : 0.0f) > 0.0f)
    }

    template <class T>
    KVCACHE_HOST_DEVICE T shuffle_xor(T value, int lane_mask) {
        KVCACHE_EMULATOR_RETURN(exchange(detail::collective::shuffle_xor, value, lane_mask))
    }
    template <class T>
    KVCACHE_HOST_DEVICE T shuffle_down(T value, int delta) {
        KVCACHE_EMULATOR_RETURN(exchange(detail::collective::shuffle_down, value, delta))
    }
    template <class T>
    KVCACHE_HOST_DEVICE T shuffle_index(T value, int source_lane) {
        KVCACHE_EMULATOR_RETURN(exchange(detail::collective::shuffle_index, value, source_lane))
    }

    KVCACHE_HOST_DEVICE bool warp_any(bool predicate) {
        KVCACHE_EMULATOR_RETURN(runner_->warp_collective(thread_, detail::collective::warp_any, predicate, 0) != 0)
    }
    KVCACHE_HOST_DEVICE bool warp_all(bool predicate) {
        KVCACHE_EMULATOR_RETURN(runner_->warp_collective(thread_, detail::collective::warp_all, predicate, 0) != 0)
    }
    KVCACHE_HOST_DEVICE unsigned warp_ballot(bool predicate) {
        KVCACHE_EMULATOR_RETURN(
            static_cast<unsigned>(runner_->warp_collective(thread_, detail::collective::warp_ballot, predicate, 0)))
    }

    KVCACHE_HOST_DEVICE float warp_sum(float value) {
        KVCACHE_EMULATOR_RETURN(exchange(detail::collective::warp_sum, value, 0))
    }
    KVCACHE_HOST_DEVICE float warp_max(float value) {
        KVCACHE_EMULATOR_RETURN(exchange(detail::collective::warp_max, value, 0))
    }
    KVCACHE_HOST_DEVICE float block_sum(float value) {
        KVCACHE_EMULATOR_RETURN(runner_->block_collective(thread_, detail::collective::block_sum, value))
    }
    KVCACHE_HOST_DEVICE float block_max(float value) {
        KVCACHE_EMULATOR_RETURN(runner_->block_collective(thread_, detail::collective::block_max, value))
    }

    /// `count` T's of dynamic shared memory from `byte_offset`; reports a range
    /// past the launch's shared bytes or an offset misaligned for T.
    template <class T>
    KVCACHE_HOST_DEVICE checked_shared_array<T> shared_array(std::size_t byte_offset, std::size_t count) const {
        static_assert(std::is_trivially_copyable_v<T>, "shared memory holds trivially copyable types only");
        KVCACHE_EMULATOR_RETURN(make_shared_array<T>(byte_offset, count))
    }
    KVCACHE_HOST_DEVICE std::size_t shared_bytes() const { KVCACHE_EMULATOR_RETURN(runner_->shared_bytes()) }

    /// 16-byte load; reports a misaligned or null address.
    KVCACHE_HOST_DEVICE vector16 load16(const void* address) const {
        KVCACHE_EMULATOR_RETURN(load<vector16>(address, "load16"))
    }
    /// 16-byte store; reports a misaligned or null address.
    KVCACHE_HOST_DEVICE void store16(void* address, const vector16& v) const {
        KVCACHE_EMULATOR_DO(store(address, v, "store16"))
    }
    /// 8-byte load (8 fp8 elements); reports a misaligned or null address.
    KVCACHE_HOST_DEVICE vector8 load8(const void* address) const {
        KVCACHE_EMULATOR_RETURN(load<vector8>(address, "load8"))
    }
    /// 8-byte store; reports a misaligned or null address.
    KVCACHE_HOST_DEVICE void store8(void* address, const vector8& v) const {
        KVCACHE_EMULATOR_DO(store(address, v, "store8"))
    }

private:
    template <class T>
    checked_shared_array<T> make_shared_array(std::size_t byte_offset, std::size_t count) const {
        const std::size_t limit = runner_->shared_bytes();
        if (byte_offset > limit || count > (limit - byte_offset) / sizeof(T))
            runner_->fault(thread_, "shared_array of ", count, " x ", sizeof(T), " bytes at byte offset ", byte_offset,
                           " exceeds the ", limit, " shared bytes of the launch");
        if (byte_offset % alignof(T) != 0)
            runner_->fault(thread_, "shared_array at byte offset ", byte_offset, " is not aligned to ", alignof(T));
        return {reinterpret_cast<T*>(runner_->shared_memory() + byte_offset), count, byte_offset, *runner_, thread_};
    }

    template <class T>
    T exchange(detail::collective op, T value, int argument) {
        static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                      "warp shuffles move trivially copyable values of 4 or 8 bytes");
        using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
        const std::uint64_t result = runner_->warp_collective(thread_, op, detail::bit_copy<bits_type>(value), argument);
        return detail::bit_copy<T>(static_cast<bits_type>(result));
    }

    // A vector access of sizeof(Vector) bytes, which must be its alignment too.
    template <class Vector>
    Vector load(const void* address, const char* what) const {
        check_aligned(address, sizeof(Vector), what);
        Vector v;
        std::memcpy(&v, address, sizeof v);
        return v;
    }
    template <class Vector>
    void store(void* address, const Vector& v, const char* what) const {
        check_aligned(address, sizeof(Vector), what);
        std::memcpy(address, &v, sizeof v);
    }

    void check_aligned(const void* address, std::uintptr_t bytes, const char* what) const {
        const auto at = reinterpret_cast<std::uintptr_t>(address);
        if (address == nullptr) runner_->fault(thread_, what, " of a null address");
        if (at % bytes != 0)
            runner_->fault(thread_, what, " at address 0x", std::hex, at, std::dec, " is not ", bytes,
                           "-byte aligned (off by ", at % bytes, ")");
    }

    detail::block_runner* runner_;
    int thread_;
};

}  // namespace kvcache

#undef KVCACHE_EMULATOR_RETURN
#undef KVCACHE_EMULATOR_DO
