// A read-only memory mapping of a whole file (POSIX), so checkpoint weights
// are read straight from the page cache without a copy into the heap first.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "kvcache/core/error.hpp"

namespace kvcache::examples {

/// A file mapped read-only into memory for the lifetime of the object.
class mapped_file {
public:
    mapped_file() = default;

    /// Maps `path`; throws io_error naming the path when it cannot be opened or mapped.
    explicit mapped_file(const std::string& path) : path_(path) {
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw_error(error_code::io_error, path, ": cannot open: ", std::strerror(errno));
        struct stat info {};
        if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
            ::close(fd);
            throw_error(error_code::io_error, path, ": not a regular file");
        }
        size_ = static_cast<std::size_t>(info.st_size);
        if (size_ > 0) {
            void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                int err = errno;
                ::close(fd);
                throw_error(error_code::io_error, path, ": cannot map ", size_, " bytes: ", std::strerror(err));
            }
            data_ = static_cast<const unsigned char*>(p);
        }
        ::close(fd);  // the mapping stays valid without the descriptor
    }

    mapped_file(mapped_file&& other) noexcept { swap(other); }
    mapped_file& operator=(mapped_file&& other) noexcept {
        mapped_file moved(std::move(other));
        swap(moved);
        return *this;
    }
    mapped_file(const mapped_file&) = delete;
    mapped_file& operator=(const mapped_file&) = delete;

    ~mapped_file() {
        if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
    }

    const unsigned char* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    const std::string& path() const noexcept { return path_; }

private:
    void swap(mapped_file& other) noexcept {
        std::swap(path_, other.path_);
        std::swap(data_, other.data_);
        std::swap(size_, other.size_);
    }

    std::string path_;
    const unsigned char* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace kvcache::examples
