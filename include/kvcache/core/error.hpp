// The one exception type of kvcache, with an error code and a message that
// names the offending value and the limit it broke.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvcache {

/// What kind of failure an error reports; stable for programmatic handling.
enum class error_code {
    invalid_argument,          ///< a value outside its documented domain
    out_of_range,              ///< an index or position past an end
    capacity_exceeded,         ///< a fixed-size store has no room left
    out_of_memory,             ///< an allocation failed
    not_found,                 ///< an unknown id or key
    unsupported_configuration, ///< a runtime choice with no compiled instantiation
    io_error,                  ///< a stream or file could not be read or written
    format_error,              ///< a file or header is malformed
    cuda_error,                ///< a CUDA runtime call failed
    kernel_fault,              ///< the SIMT emulator caught a kernel misbehaving
};

/// The name of an error code, as printed in messages.
inline const char* to_string(error_code code) noexcept {
    switch (code) {
    case error_code::invalid_argument: return "invalid_argument";
    case error_code::out_of_range: return "out_of_range";
    case error_code::capacity_exceeded: return "capacity_exceeded";
    case error_code::out_of_memory: return "out_of_memory";
    case error_code::not_found: return "not_found";
    case error_code::unsupported_configuration: return "unsupported_configuration";
    case error_code::io_error: return "io_error";
    case error_code::format_error: return "format_error";
    case error_code::cuda_error: return "cuda_error";
    case error_code::kernel_fault: return "kernel_fault";
    }
    return "unknown";
}

/// The exception thrown by every failing kvcache operation. The message
/// starts with "kvcache: <code>: " so logs are easy to grep.
class error : public std::runtime_error {
public:
    error(error_code code, const std::string& message)
        : std::runtime_error(std::string("kvcache: ") + to_string(code) + ": " + message), code_(code) {}

    /// The kind of failure.
    error_code code() const noexcept { return code_; }

private:
    error_code code_;
};

namespace detail {

template <class... Parts>
std::string concat(Parts&&... parts) {
    std::ostringstream out;
    (out << ... << std::forward<Parts>(parts));
    return out.str();
}

}  // namespace detail

/// Throws kvcache::error with a message made by streaming every part in order,
/// e.g. throw_error(error_code::out_of_range, "position ", p, " is past length ", n).
template <class... Parts>
[[noreturn]] void throw_error(error_code code, Parts&&... parts) {
    throw error(code, detail::concat(std::forward<Parts>(parts)...));
}

/// Throws error_code::invalid_argument (or the given code) when the condition is false.
template <class... Parts>
void require(bool condition, error_code code, Parts&&... parts) {
    if (!condition) throw_error(code, std::forward<Parts>(parts)...);
}

namespace detail {

/// Throws invalid_argument unless a buffer of `size` elements holds the
/// `rows` x `row` elements a call needs, naming the buffer and what it holds:
/// "keys holds 127 elements but 2 tokens x (kv_heads x head_dim) 64 = 128 are needed".
template <class... Context>
void require_elements(std::size_t size, std::int64_t rows, std::int64_t row, const char* field, const char* rows_name,
                      Context&&... context) {
    const std::int64_t needed = rows * row;
    require(std::int64_t(size) >= needed, error_code::invalid_argument, field, " holds ", size, " elements but ", rows,
            " ", rows_name, " ", row, " = ", needed, " are needed", std::forward<Context>(context)...);
}

}  // namespace detail
}  // namespace kvcache
