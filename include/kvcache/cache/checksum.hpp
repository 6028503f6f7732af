// Checksums of cache files: FNV-1a (format version 1) and the striped hash of
// version 2. FNV-1a multiplies once per byte in one dependency chain, about
// 0.7 GB/s, which made reading a disk-tier page cost ten times its copy; the
// striped hash keeps four independent 64-bit lanes over 32-byte stripes, so
// its multiplies overlap (several GB/s on one core).
#pragma once

#include <cstdint>
#include <cstring>

namespace kvcache {
namespace detail {

/// FNV-1a, 64 bit: cheap to state, catches flipped or missing bytes; byte-serial.
inline std::uint64_t fnv1a(std::uint64_t hash, const void* data, std::size_t bytes) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
    return hash;
}
inline constexpr std::uint64_t fnv1a_seed = 14695981039346656037ull;

/// A streaming 64-bit hash over 32-byte stripes in four lanes. Each lane's
/// round (add the word times an odd constant, rotate, times another odd
/// constant) is a bijection of the lane for a fixed word and of the word for
/// a fixed lane, so a change confined to one word always changes the result;
/// the length is mixed in, so dropped or appended bytes change it too. The
/// result does not depend on how the bytes are split across update() calls.
class striped_hash {
public:
    void update(const void* data, std::size_t bytes) noexcept {
        if (bytes == 0) return;  // data may be null then (an empty vector's)
        const auto* p = static_cast<const unsigned char*>(data);
        total_ += bytes;
        if (buffered_ > 0) {  // complete the stripe a previous call began
            const std::size_t take = bytes < stripe - buffered_ ? bytes : stripe - buffered_;
            std::memcpy(buffer_ + buffered_, p, take);
            buffered_ += take;
            p += take;
            bytes -= take;
            if (buffered_ < stripe) return;
            consume(buffer_);
            buffered_ = 0;
        }
        for (; bytes >= stripe; p += stripe, bytes -= stripe) consume(p);
        std::memcpy(buffer_, p, bytes);
        buffered_ = bytes;
    }

    /// The hash of every byte so far (the state is unchanged: more may follow).
    std::uint64_t value() const noexcept {
        std::uint64_t h = rotate(lanes_[0], 1) + rotate(lanes_[1], 7) + rotate(lanes_[2], 12) + rotate(lanes_[3], 18);
        h = (h ^ total_) * second;
        std::size_t i = 0;
        for (; i + 8 <= buffered_; i += 8) h = rotate(h ^ round(0, word(buffer_ + i)), 27) * first + fourth;
        for (; i < buffered_; ++i) h = rotate(h ^ (buffer_[i] * fifth), 11) * first;
        h ^= h >> 33;  // spread every bit over the whole word
        h *= second;
        h ^= h >> 29;
        h *= third;
        return h ^ (h >> 32);
    }

private:
    static constexpr std::size_t stripe = 32;
    static constexpr std::uint64_t first = 0x9e3779b185ebca87ull, second = 0xc2b2ae3d27d4eb4full,
                                   third = 0x165667b19e3779f9ull, fourth = 0x85ebca77c2b2ae63ull,
                                   fifth = 0x27d4eb2f165667c5ull;

    static std::uint64_t rotate(std::uint64_t x, int r) noexcept { return (x << r) | (x >> (64 - r)); }
    static std::uint64_t word(const unsigned char* p) noexcept {
        std::uint64_t w;
        std::memcpy(&w, p, 8);  // files are little-endian, as is every host kvcache builds for
        return w;
    }
    static std::uint64_t round(std::uint64_t lane, std::uint64_t w) noexcept {
        return rotate(lane + w * second, 31) * first;
    }
    void consume(const unsigned char* p) noexcept {
        lanes_[0] = round(lanes_[0], word(p));
        lanes_[1] = round(lanes_[1], word(p + 8));
        lanes_[2] = round(lanes_[2], word(p + 16));
        lanes_[3] = round(lanes_[3], word(p + 24));
    }

    std::uint64_t lanes_[4] = {first + second, second, 0, 0 - first};
    std::uint64_t total_ = 0;
    unsigned char buffer_[stripe] = {};
    std::size_t buffered_ = 0;
};

/// The checksum a file of format `version` carries: FNV-1a for version 1,
/// the striped hash from version 2 on.
class file_checksum {
public:
    explicit file_checksum(std::uint32_t version) noexcept : fnv_(version <= 1) {}
    void update(const void* data, std::size_t bytes) noexcept {
        if (fnv_) fnv_hash_ = fnv1a(fnv_hash_, data, bytes);
        else striped_.update(data, bytes);
    }
    std::uint64_t value() const noexcept { return fnv_ ? fnv_hash_ : striped_.value(); }

private:
    bool fnv_;
    std::uint64_t fnv_hash_ = fnv1a_seed;
    striped_hash striped_;
};

}  // namespace detail
}  // namespace kvcache
