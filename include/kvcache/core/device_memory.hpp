// RAII buffers in device memory through the CUDA runtime, and the device
// memory-space policy. Available where the CUDA runtime headers are (nvcc, or
// a host target linked to CUDA::cudart); see KVCACHE_HAS_CUDA_RUNTIME.
#pragma once

#include "kvcache/core/config.hpp"
#include "kvcache/core/memory.hpp"

#if KVCACHE_HAS_CUDA_RUNTIME
#include <cuda_runtime_api.h>

#include "kvcache/core/cuda_error.hpp"

namespace kvcache {

/// Owning, move-only array in device memory, zero-initialised.
/// @tparam T a trivially copyable element type
template <class T>
class device_buffer {
    static_assert(std::is_trivially_copyable_v<T>, "kvcache::device_buffer holds trivially copyable elements only");

public:
    device_buffer() noexcept = default;

    /// Allocates count zeroed elements with cudaMalloc; throws error_code::out_of_memory naming the size.
    explicit device_buffer(std::size_t count) : count_(count) {
        if (count == 0) return;
        const std::size_t bytes = detail::checked_bytes(count, sizeof(T));
        void* memory = nullptr;
        const cudaError_t status = cudaMalloc(&memory, bytes);
        if (status != cudaSuccess) {
            (void)cudaGetLastError();  // allocation failures are not sticky; clear them so later calls start clean
            throw_error(status == cudaErrorMemoryAllocation ? error_code::out_of_memory : error_code::cuda_error,
                        "device allocation of ", bytes, " bytes (", count, " elements) failed: ",
                        cudaGetErrorString(status));
        }
        const cudaError_t cleared = cudaMemset(memory, 0, bytes);
        if (cleared != cudaSuccess) {
            cudaFree(memory);
            KVCACHE_CUDA_CHECK(cleared);
        }
        data_ = static_cast<T*>(memory);
    }

    device_buffer(device_buffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}

    device_buffer& operator=(device_buffer&& other) noexcept {
        if (this != &other) {
            if (data_) cudaFree(data_);
            data_ = std::exchange(other.data_, nullptr);
            count_ = std::exchange(other.count_, 0);
        }
        return *this;
    }

    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;

    ~device_buffer() {
        if (data_) cudaFree(data_);
    }

    T* data() noexcept { return data_; }
    const T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return count_; }
    std::size_t bytes() const noexcept { return count_ * sizeof(T); }
    bool empty() const noexcept { return count_ == 0; }
    span<T> view() noexcept { return {data_, count_}; }
    span<const T> view() const noexcept { return {data_, count_}; }

private:
    T* data_ = nullptr;
    std::size_t count_ = 0;
};

/// Owning, move-only array in page-locked host memory (cudaMallocHost),
/// zero-initialised: what copies between the device and the host need to be
/// asynchronous.
/// @tparam T a trivially copyable element type
template <class T>
class pinned_host_buffer {
    static_assert(std::is_trivially_copyable_v<T>, "kvcache::pinned_host_buffer holds trivially copyable elements only");

public:
    pinned_host_buffer() noexcept = default;

    /// Allocates count zeroed elements with cudaMallocHost; throws error_code::out_of_memory naming the size.
    explicit pinned_host_buffer(std::size_t count) : count_(count) {
        if (count == 0) return;
        const std::size_t bytes = detail::checked_bytes(count, sizeof(T));
        void* memory = nullptr;
        const cudaError_t status = cudaMallocHost(&memory, bytes);
        if (status != cudaSuccess) {
            (void)cudaGetLastError();
            throw_error(error_code::out_of_memory, "page-locked host allocation of ", bytes, " bytes (", count,
                        " elements) failed: ", cudaGetErrorString(status));
        }
        std::memset(memory, 0, bytes);
        data_ = static_cast<T*>(memory);
    }

    pinned_host_buffer(pinned_host_buffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
    pinned_host_buffer& operator=(pinned_host_buffer&& other) noexcept {
        if (this != &other) {
            if (data_) cudaFreeHost(data_);
            data_ = std::exchange(other.data_, nullptr);
            count_ = std::exchange(other.count_, 0);
        }
        return *this;
    }
    pinned_host_buffer(const pinned_host_buffer&) = delete;
    pinned_host_buffer& operator=(const pinned_host_buffer&) = delete;
    ~pinned_host_buffer() {
        if (data_) cudaFreeHost(data_);
    }

    T* data() noexcept { return data_; }
    const T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return count_; }
    T& operator[](std::size_t i) noexcept { return data_[i]; }
    const T& operator[](std::size_t i) const noexcept { return data_[i]; }

private:
    T* data_ = nullptr;
    std::size_t count_ = 0;
};

/// A CUDA event (timing off), made when first recorded and destroyed with its
/// owner; move-only. device_memory marks each host-tier page's last copies in
/// or out with one, so a reader or refill waits for those copies and no others.
class cuda_event {
public:
    cuda_event() noexcept = default;
    cuda_event(cuda_event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    cuda_event& operator=(cuda_event&& other) noexcept {
        if (this != &other) {
            if (handle_) (void)cudaEventDestroy(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    cuda_event(const cuda_event&) = delete;
    cuda_event& operator=(const cuda_event&) = delete;
    ~cuda_event() {
        if (handle_) (void)cudaEventDestroy(handle_);
    }

    /// Records the event after the work issued on stream so far.
    void record(cudaStream_t stream) {
        if (!handle_) KVCACHE_CUDA_CHECK(cudaEventCreateWithFlags(&handle_, cudaEventDisableTiming));
        KVCACHE_CUDA_CHECK(cudaEventRecord(handle_, stream));
    }
    /// Waits on the host for the work before the last record (returns at once if never recorded).
    void wait() const {
        if (handle_) KVCACHE_CUDA_CHECK(cudaEventSynchronize(handle_));
    }
    /// Makes the stream's later work wait for the work before the last record.
    void order(cudaStream_t stream) const {
        if (handle_) KVCACHE_CUDA_CHECK(cudaStreamWaitEvent(stream, handle_, 0));
    }

private:
    cudaEvent_t handle_ = nullptr;
};

/// Memory-space policy for device memory (see host_memory).
struct device_memory {
    static constexpr memory_space space = memory_space::device;
    /// What orders copies: a CUDA stream.
    using stream_type = cudaStream_t;

    /// @tparam T element type
    template <class T>
    using buffer = device_buffer<T>;
    /// Page-locked, so the tier's copies are asynchronous on the caller's stream.
    /// @tparam T element type
    template <class T>
    using host_tier_buffer = pinned_host_buffer<T>;

    static void copy_from_host(void* destination, const void* source, std::size_t bytes) {
        if (bytes) KVCACHE_CUDA_CHECK(cudaMemcpy(destination, source, bytes, cudaMemcpyHostToDevice));
    }
    /// Ordered on the stream; the source may be reused on return (pageable
    /// memory is staged before cudaMemcpyAsync returns).
    static void copy_from_host_async(void* destination, const void* source, std::size_t bytes, stream_type stream) {
        if (bytes) KVCACHE_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyHostToDevice, stream));
    }
    static void copy_to_host(void* destination, const void* source, std::size_t bytes) {
        if (bytes) KVCACHE_CUDA_CHECK(cudaMemcpy(destination, source, bytes, cudaMemcpyDeviceToHost));
    }
    /// Ordered on the stream; asynchronous when the destination is page-locked.
    static void copy_to_host_async(void* destination, const void* source, std::size_t bytes, stream_type stream) {
        if (bytes) KVCACHE_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToHost, stream));
    }
    static void copy_within(void* destination, const void* source, std::size_t bytes) {
        if (bytes) KVCACHE_CUDA_CHECK(cudaMemcpy(destination, source, bytes, cudaMemcpyDeviceToDevice));
    }
    /// Waits for the work issued on every stream: what a host read of a pool
    /// page needs, since any plan's stream may still be writing it.
    static void synchronize() { KVCACHE_CUDA_CHECK(cudaDeviceSynchronize()); }
    /// Waits for the work issued on one stream.
    static void synchronize(stream_type stream) { KVCACHE_CUDA_CHECK(cudaStreamSynchronize(stream)); }
    /// What marks the end of a stream's copies into or out of one host-tier page.
    using event_type = cuda_event;
    /// Records `event` after the work issued on the stream so far.
    static void record_event(event_type& event, stream_type stream) { event.record(stream); }
    /// Waits on the host for the work before `event`.
    static void wait_event(const event_type& event) { event.wait(); }
    /// Makes the stream's later work wait for the work before `event` (cudaStreamWaitEvent: no host wait).
    static void order_after(stream_type stream, const event_type& event) { event.order(stream); }
    /// copy_within ordered on the stream: what a plan's copy on write uses,
    /// so a step's copies, uploads and kernels all run on the caller's stream.
    static void copy_within_async(void* destination, const void* source, std::size_t bytes, stream_type stream) {
        if (bytes) KVCACHE_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream));
    }
};

}  // namespace kvcache

#endif  // KVCACHE_HAS_CUDA_RUNTIME
