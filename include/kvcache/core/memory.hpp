// RAII buffers in host memory, and the memory-space tags that cache owners
// take as a template parameter so the same bookkeeping serves host and device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>

#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"

namespace kvcache {

/// Where a buffer lives.
enum class memory_space { host, device };

/// The name of a memory space.
inline const char* to_string(memory_space space) noexcept { return space == memory_space::host ? "host" : "device"; }

namespace detail {

/// count * element_size, or an error naming both when the product overflows.
inline std::size_t checked_bytes(std::size_t count, std::size_t element_size) {
    if (element_size != 0 && count > std::numeric_limits<std::size_t>::max() / element_size)
        throw_error(error_code::out_of_memory, "buffer of ", count, " elements of ", element_size,
                    " bytes overflows size_t");
    return count * element_size;
}

}  // namespace detail

/// Owning, move-only array in host memory, 64-byte aligned (a cache line and a
/// whole number of 16-byte vectors), zero-initialised.
/// @tparam T a trivially copyable element type
template <class T>
class host_buffer {
    static_assert(std::is_trivially_copyable_v<T>, "kvcache::host_buffer holds trivially copyable elements only");

public:
    static constexpr std::size_t alignment = 64;  ///< byte alignment of data()

    host_buffer() noexcept = default;

    /// Allocates count zeroed elements; throws error_code::out_of_memory naming the size on failure.
    explicit host_buffer(std::size_t count) : count_(count) {
        if (count == 0) return;
        std::size_t bytes = detail::checked_bytes(count, sizeof(T));
        std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
        if (rounded < bytes) throw_error(error_code::out_of_memory, "host allocation of ", bytes, " bytes overflows");
        void* memory = std::aligned_alloc(alignment, rounded);
        if (memory == nullptr)
            throw_error(error_code::out_of_memory, "host allocation of ", bytes, " bytes (", count,
                        " elements) failed");
        std::memset(memory, 0, rounded);
        data_ = static_cast<T*>(memory);
    }

    host_buffer(host_buffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}

    host_buffer& operator=(host_buffer&& other) noexcept {
        if (this != &other) {
            std::free(data_);
            data_ = std::exchange(other.data_, nullptr);
            count_ = std::exchange(other.count_, 0);
        }
        return *this;
    }

    host_buffer(const host_buffer&) = delete;
    host_buffer& operator=(const host_buffer&) = delete;

    ~host_buffer() { std::free(data_); }

    T* data() noexcept { return data_; }
    const T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return count_; }
    std::size_t bytes() const noexcept { return count_ * sizeof(T); }
    bool empty() const noexcept { return count_ == 0; }
    T& operator[](std::size_t i) noexcept { return data_[i]; }
    const T& operator[](std::size_t i) const noexcept { return data_[i]; }
    span<T> view() noexcept { return {data_, count_}; }
    span<const T> view() const noexcept { return {data_, count_}; }

private:
    T* data_ = nullptr;
    std::size_t count_ = 0;
};

/// Memory-space policy for host memory: the buffer type and the copies the
/// cache owners need. Owners are templates over such a policy.
struct host_memory {
    static constexpr memory_space space = memory_space::host;
    /// What orders copies: nothing, host copies are done when they return.
    using stream_type = std::nullptr_t;

    /// @tparam T element type
    template <class T>
    using buffer = host_buffer<T>;
    /// Host memory a second tier keeps pages in (see paged_cache::attach_host_tier).
    /// @tparam T element type
    template <class T>
    using host_tier_buffer = host_buffer<T>;

    /// Copies bytes from host memory into this space.
    static void copy_from_host(void* destination, const void* source, std::size_t bytes) {
        if (bytes) std::memcpy(destination, source, bytes);
    }
    /// copy_from_host ordered on a stream (for host memory: done on return).
    static void copy_from_host_async(void* destination, const void* source, std::size_t bytes, stream_type) {
        copy_from_host(destination, source, bytes);
    }
    /// Copies bytes from this space into host memory.
    static void copy_to_host(void* destination, const void* source, std::size_t bytes) {
        if (bytes) std::memcpy(destination, source, bytes);
    }
    /// copy_to_host ordered on a stream (for host memory: done on return).
    static void copy_to_host_async(void* destination, const void* source, std::size_t bytes, stream_type) {
        copy_to_host(destination, source, bytes);
    }
    /// Copies bytes within this space.
    static void copy_within(void* destination, const void* source, std::size_t bytes) {
        if (bytes) std::memmove(destination, source, bytes);
    }
    /// Waits for every copy issued on any stream (for host memory: nothing to wait for).
    static void synchronize() noexcept {}
    /// Waits for the copies issued on one stream (for host memory: nothing to wait for).
    static void synchronize(stream_type) noexcept {}
    /// Marks where a stream's copies into or out of one host-tier page end, so
    /// a reader or refill of that page waits for those copies alone (for host
    /// memory: nothing to mark, a copy is done when it returns).
    struct event_type {};
    /// Records `event` after the copies issued on the stream so far.
    /// @tparam Stream the policy's stream_type (a template, so a policy deriving from this one may change it)
    template <class Stream>
    static void record_event(event_type&, const Stream&) noexcept {}
    /// Waits on the host until the copies before `event` are done.
    static void wait_event(const event_type&) noexcept {}
    /// Makes the stream's later work wait for the copies before `event`, without waiting on the host.
    /// @tparam Stream the policy's stream_type
    template <class Stream>
    static void order_after(const Stream&, const event_type&) noexcept {}
    /// copy_within ordered on a stream (for host memory: done on return).
    static void copy_within_async(void* destination, const void* source, std::size_t bytes, stream_type) {
        copy_within(destination, source, bytes);
    }
};

}  // namespace kvcache
