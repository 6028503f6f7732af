// The versioned binary format of saved caches, shared by every owner.
//
//   "KVCACHE\0"  8 bytes magic
//   u32 version (1), u32 layout_kind, u32 element_kind,
//   i32 query_heads, kv_heads, head_dim, layers, i32 parameters[3], u32 sequences
//   per sequence: i32 length, i32 present, i32 positions[present],
//                 i32 tokens, i32 token_ids[tokens],
//                 per layer: keys [present][kv_head][head_dim], values likewise
//   u64 checksum: FNV-1a over every byte before it
// Little-endian, native element bits (fp32 or binary16).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace detail {

inline constexpr char file_magic[8] = {'K', 'V', 'C', 'A', 'C', 'H', 'E', '\0'};
inline constexpr std::uint32_t file_version = 1;

/// What a file says about the cache it came from.
struct file_header {
    layout_kind layout = layout_kind::contiguous;
    element_kind element = element_kind::fp32;
    head_shape heads;
    int layers = 0;
    int parameters[3] = {0, 0, 0};  ///< layout-specific: see each owner
    std::uint32_t sequences = 0;
};

/// One saved sequence: its length, present positions, known token ids and
/// rows, per layer [present][kv_head][head_dim].
/// @tparam Element stored element type
template <class Element>
struct sequence_record {
    int length = 0;
    std::vector<int> positions;
    std::vector<std::int32_t> tokens;
    std::vector<std::vector<Element>> keys, values;  ///< [layer]
};

/// FNV-1a, 64 bit: cheap, and catches flipped or missing bytes.
inline std::uint64_t fnv1a(std::uint64_t hash, const void* data, std::size_t bytes) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
    return hash;
}
inline constexpr std::uint64_t fnv1a_seed = 14695981039346656037ull;

/// Writes bytes and keeps the running checksum.
class checked_writer {
public:
    explicit checked_writer(std::ostream& out) : out_(out) {}
    void bytes(const void* data, std::size_t n) {
        hash_ = fnv1a(hash_, data, n);
        out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
        if (!out_) throw_error(error_code::io_error, "writing ", n, " bytes to the stream failed");
    }
    template <class T>
    void value(T v) { bytes(&v, sizeof v); }
    void finish() {
        const std::uint64_t sum = hash_;
        out_.write(reinterpret_cast<const char*>(&sum), sizeof sum);
        out_.flush();
        if (!out_) throw_error(error_code::io_error, "writing the checksum to the stream failed");
    }

private:
    std::ostream& out_;
    std::uint64_t hash_ = fnv1a_seed;
};

/// Reads bytes, keeps the running checksum, and reports a short file by value.
class checked_reader {
public:
    explicit checked_reader(std::istream& in) : in_(in) {}
    void bytes(void* data, std::size_t n) {
        in_.read(static_cast<char*>(data), static_cast<std::streamsize>(n));
        const auto got = static_cast<std::size_t>(in_.gcount());
        if (got != n)
            throw_error(error_code::format_error, "file truncated: needed ", n, " bytes at offset ", offset_,
                        ", only ", got, " left");
        hash_ = fnv1a(hash_, data, n);
        offset_ += n;
    }
    template <class T>
    T value() {
        T v{};
        bytes(&v, sizeof v);
        return v;
    }
    /// A count in [0, limit]; format_error naming both otherwise.
    int count(const char* what, long long limit) {
        const auto v = value<std::int32_t>();
        if (v < 0 || v > limit)
            throw_error(error_code::format_error, what, " = ", v, " at offset ", offset_ - 4, " is outside [0, ",
                        limit, "]");
        return v;
    }
    void finish() {
        const std::uint64_t expected = hash_;
        std::uint64_t stored = 0;
        in_.read(reinterpret_cast<char*>(&stored), sizeof stored);
        if (static_cast<std::size_t>(in_.gcount()) != sizeof stored)
            throw_error(error_code::format_error, "file truncated: checksum missing at offset ", offset_);
        if (stored != expected)
            throw_error(error_code::format_error, "checksum ", stored, " does not match contents (", expected, ")");
    }

private:
    std::istream& in_;
    std::uint64_t hash_ = fnv1a_seed;
    std::size_t offset_ = 0;
};

/// Writes the header, the records and the checksum.
/// @tparam Element stored element type
template <class Element>
void write_file(std::ostream& out, const file_header& header, const std::vector<sequence_record<Element>>& records) {
    checked_writer w(out);
    w.bytes(file_magic, sizeof file_magic);
    w.value<std::uint32_t>(file_version);
    w.value<std::uint32_t>(static_cast<std::uint32_t>(header.layout));
    w.value<std::uint32_t>(static_cast<std::uint32_t>(header.element));
    w.value<std::int32_t>(header.heads.query_heads);
    w.value<std::int32_t>(header.heads.kv_heads);
    w.value<std::int32_t>(header.heads.head_dim);
    w.value<std::int32_t>(header.layers);
    for (int p : header.parameters) w.value<std::int32_t>(p);
    w.value<std::uint32_t>(static_cast<std::uint32_t>(records.size()));
    for (const auto& r : records) {
        w.value<std::int32_t>(r.length);
        w.value<std::int32_t>(static_cast<std::int32_t>(r.positions.size()));
        w.bytes(r.positions.data(), r.positions.size() * sizeof(int));
        w.value<std::int32_t>(static_cast<std::int32_t>(r.tokens.size()));
        w.bytes(r.tokens.data(), r.tokens.size() * sizeof(std::int32_t));
        for (int l = 0; l < header.layers; ++l) {
            w.bytes(r.keys[l].data(), r.keys[l].size() * sizeof(Element));
            w.bytes(r.values[l].data(), r.values[l].size() * sizeof(Element));
        }
    }
    w.finish();
}

/// Reads a file written for a cache configured like `expected` (the
/// parameters are compared too); every mismatch is a format_error naming the
/// file's value and the cache's.
/// @tparam Element stored element type
template <class Element>
std::vector<sequence_record<Element>> read_file(std::istream& in, const file_header& expected) {
    checked_reader r(in);
    char magic[8];
    r.bytes(magic, sizeof magic);
    if (std::memcmp(magic, file_magic, sizeof magic) != 0)
        throw_error(error_code::format_error, "bad magic: not a kvcache file (expected \"KVCACHE\\0\")");
    const auto version = r.value<std::uint32_t>();
    require(version == file_version, error_code::format_error, "file format version ", version,
            " is not supported (this build reads version ", file_version, ")");
    const auto layout = r.value<std::uint32_t>();
    require(layout == static_cast<std::uint32_t>(expected.layout), error_code::format_error, "file layout ", layout,
            " does not match the cache's layout ", static_cast<int>(expected.layout), " (", to_string(expected.layout),
            ")");
    const auto element = r.value<std::uint32_t>();
    require(element == static_cast<std::uint32_t>(expected.element), error_code::format_error, "file element kind ",
            element, " does not match the cache's ", static_cast<int>(expected.element), " (",
            to_string(expected.element), ")");
    head_shape heads;
    heads.query_heads = r.value<std::int32_t>();
    heads.kv_heads = r.value<std::int32_t>();
    heads.head_dim = r.value<std::int32_t>();
    require(heads == expected.heads, error_code::format_error, "file head configuration ", heads.to_string(),
            " does not match the cache's ", expected.heads.to_string());
    const int layers = r.value<std::int32_t>();
    require(layers == expected.layers, error_code::format_error, "file has ", layers,
            " layers, the cache has ", expected.layers);
    for (int i = 0; i < 3; ++i) {
        const int p = r.value<std::int32_t>();
        require(p == expected.parameters[i], error_code::format_error, "file layout parameter ", i, " = ", p,
                " does not match the cache's ", expected.parameters[i]);
    }
    const auto sequences = r.value<std::uint32_t>();
    const std::size_t row = std::size_t(heads.kv_heads) * heads.head_dim;
    std::vector<sequence_record<Element>> records;
    for (std::uint32_t s = 0; s < sequences; ++s) {
        sequence_record<Element> rec;
        rec.length = r.count("sequence length", 0x7fffffff);
        const int present = r.count("present positions", rec.length);
        // Read piecewise so a corrupt count cannot make us allocate past the file.
        for (int i = 0; i < present; ++i) {
            const int p = r.value<std::int32_t>();
            require(p >= 0 && p < rec.length && (i == 0 || p > rec.positions.back()), error_code::format_error,
                    "saved position ", p, " is not ascending inside [0, ", rec.length, ")");
            rec.positions.push_back(p);
        }
        const int tokens = r.count("token ids", rec.length);
        for (int i = 0; i < tokens; ++i) rec.tokens.push_back(r.value<std::int32_t>());
        rec.keys.resize(layers);
        rec.values.resize(layers);
        std::vector<Element> buffer(row);
        for (int l = 0; l < layers; ++l)
            for (auto* plane : {&rec.keys[l], &rec.values[l]})
                for (int i = 0; i < present; ++i) {
                    r.bytes(buffer.data(), row * sizeof(Element));
                    plane->insert(plane->end(), buffer.begin(), buffer.end());
                }
        records.push_back(std::move(rec));
    }
    r.finish();
    return records;
}

/// Opens a file for binary writing; io_error naming the path on failure.
inline std::ofstream open_for_save(const std::string& path) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    require(static_cast<bool>(out), error_code::io_error, "cannot open '", path, "' for writing");
    return out;
}
/// Opens a file for binary reading; io_error naming the path on failure.
inline std::ifstream open_for_load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    require(static_cast<bool>(in), error_code::io_error, "cannot open '", path, "' for reading");
    return in;
}

}  // namespace detail
}  // namespace kvcache
