// Reading the safetensors format: an 8-byte little-endian header length, a
// JSON header naming each tensor's dtype, shape and [begin, end) byte offsets
// into the data that follows. Every field is checked against the file before
// any tensor byte is touched, so a corrupt file gives an error, not a bad read.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvcache/core/error.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache_engine/mapped_file.hpp"

namespace kvcache::examples {

/// One tensor of a safetensors header. Offsets are relative to the data section.
struct tensor_entry {
    std::string dtype;                ///< "F32", "F16", "BF16", ...
    int element_bytes = 0;
    std::vector<std::uint64_t> shape;
    std::uint64_t begin = 0;
    std::uint64_t end = 0;

    std::uint64_t elements() const noexcept {
        std::uint64_t n = 1;
        for (auto d : shape) n *= d;
        return n;
    }
};

/// A parsed, validated header.
struct safetensors_header {
    std::uint64_t data_start = 0;  ///< file offset of the data section
    std::uint64_t data_size = 0;   ///< bytes of the data section
    std::map<std::string, tensor_entry> tensors;
};

namespace detail {

inline int safetensors_element_bytes(const std::string& dtype) noexcept {
    static const std::map<std::string, int> sizes{{"BOOL", 1}, {"U8", 1},   {"I8", 1},   {"F8_E4M3", 1}, {"F8_E5M2", 1},
                                                   {"I16", 2},  {"U16", 2},  {"F16", 2},  {"BF16", 2},    {"I32", 4},
                                                   {"U32", 4},  {"F32", 4},  {"I64", 8},  {"U64", 8},     {"F64", 8}};
    auto it = sizes.find(dtype);
    return it == sizes.end() ? 0 : it->second;
}

// A header above this is not a weights file; refusing it bounds the JSON parser's memory.
constexpr std::uint64_t max_safetensors_header = 100u << 20;

}  // namespace detail

/// Parses and validates the header of a safetensors file whose bytes are bytes[0, size).
/// `file` names the file in error messages. Throws kvcache::error (format_error) naming the
/// file and, where there is one, the tensor.
inline safetensors_header parse_safetensors_header(const unsigned char* bytes, std::size_t size, const std::string& file) {
    require(size >= 8, error_code::format_error, file, ": file is ", size,
            " bytes, too short for the 8-byte safetensors header length");
    std::uint64_t header_size = 0;
    for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
    require(header_size <= detail::max_safetensors_header, error_code::format_error, file, ": header length ",
            header_size, " exceeds the limit of ", detail::max_safetensors_header, " bytes");
    require(header_size <= size - 8, error_code::format_error, file, ": header length ", header_size,
            " runs past the end of the file (", size - 8, " bytes after the length field); the file is truncated");
    safetensors_header header;
    header.data_start = 8 + header_size;
    header.data_size = size - header.data_start;

    nlohmann::json json;
    try {
        json = nlohmann::json::parse(bytes + 8, bytes + 8 + header_size);
    } catch (const nlohmann::json::exception& e) {
        throw_error(error_code::format_error, file, ": header is not valid JSON: ", e.what());
    }
    require(json.is_object(), error_code::format_error, file, ": header is not a JSON object");
    for (auto it = json.begin(); it != json.end(); ++it) {
        const std::string& name = it.key();
        if (name == "__metadata__") {
            require(it->is_object(), error_code::format_error, file, ": __metadata__ is not an object");
            continue;
        }
        const nlohmann::json& value = it.value();
        auto fail = [&](const auto&... parts) {
            throw_error(error_code::format_error, file, ": tensor '", name, "': ", parts...);
        };
        if (!value.is_object()) fail("entry is not an object");
        auto dtype = value.find("dtype");
        auto shape = value.find("shape");
        auto offsets = value.find("data_offsets");
        if (dtype == value.end() || !dtype->is_string()) fail("missing or non-string 'dtype'");
        if (shape == value.end() || !shape->is_array()) fail("missing or non-array 'shape'");
        if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) fail("'data_offsets' is not [begin, end]");
        tensor_entry entry;
        entry.dtype = dtype->get<std::string>();
        entry.element_bytes = detail::safetensors_element_bytes(entry.dtype);
        if (entry.element_bytes == 0) fail("unknown dtype '", entry.dtype, "'");
        std::uint64_t elements = 1;
        bool overflow = false;
        for (const auto& d : *shape) {
            if (!d.is_number_unsigned()) fail("shape has an entry that is not a non-negative integer");
            std::uint64_t extent = d.get<std::uint64_t>();
            if (extent != 0 && elements > UINT64_MAX / extent) overflow = true;
            elements *= extent;
            entry.shape.push_back(extent);
        }
        if (overflow || elements > UINT64_MAX / static_cast<std::uint64_t>(entry.element_bytes))
            fail("shape has more elements than can be addressed");
        for (const auto& o : *offsets)
            if (!o.is_number_unsigned()) fail("data_offsets has an entry that is not a non-negative integer");
        entry.begin = (*offsets)[0].get<std::uint64_t>();
        entry.end = (*offsets)[1].get<std::uint64_t>();
        if (entry.begin > entry.end) fail("data_offsets [", entry.begin, ", ", entry.end, "] has begin after end");
        if (entry.end > header.data_size)
            fail("data_offsets [", entry.begin, ", ", entry.end, "] run past the data section of ", header.data_size,
                 " bytes; the file is truncated or corrupt");
        std::uint64_t bytes_needed = elements * static_cast<std::uint64_t>(entry.element_bytes);
        if (entry.end - entry.begin != bytes_needed)
            fail("data_offsets span ", entry.end - entry.begin, " bytes but dtype ", entry.dtype, " and shape need ",
                 bytes_needed);
        header.tensors.emplace(name, std::move(entry));
    }
    return header;
}

/// "[2, 3]"
inline std::string shape_string(const std::vector<std::uint64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

/// A memory-mapped safetensors file with a validated header.
class safetensors_file {
public:
    /// Maps and validates `path`; throws io_error or format_error naming it.
    explicit safetensors_file(const std::string& path)
        : file_(path), header_(parse_safetensors_header(file_.data(), file_.size(), path)) {}

    const std::string& path() const noexcept { return file_.path(); }
    const safetensors_header& header() const noexcept { return header_; }
    bool contains(const std::string& name) const { return header_.tensors.count(name) != 0; }

    /// The tensor converted to float (from F32, F16 or BF16), after checking its shape is `expected`.
    std::vector<float> read_floats(const std::string& name, const std::vector<std::uint64_t>& expected) const {
        auto it = header_.tensors.find(name);
        require(it != header_.tensors.end(), error_code::not_found, path(), ": tensor '", name, "' is missing");
        const tensor_entry& e = it->second;
        require(e.shape == expected, error_code::format_error, path(), ": tensor '", name, "' has shape ",
                shape_string(e.shape), " but the config needs ", shape_string(expected));
        const unsigned char* src = file_.data() + header_.data_start + e.begin;
        std::vector<float> out(e.elements());
        if (e.dtype == "F32") {
            if (!out.empty()) std::memcpy(out.data(), src, out.size() * 4);  // the host is little-endian, as the format
        } else if (e.dtype == "F16") {
            for (std::size_t i = 0; i < out.size(); ++i) {
                std::uint16_t bits = static_cast<std::uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
                out[i] = static_cast<float>(half::from_bits(bits));
            }
        } else if (e.dtype == "BF16") {
            for (std::size_t i = 0; i < out.size(); ++i) {
                std::uint32_t bits = (static_cast<std::uint32_t>(src[2 * i]) | (static_cast<std::uint32_t>(src[2 * i + 1]) << 8)) << 16;
                std::memcpy(&out[i], &bits, 4);
            }
        } else {
            throw_error(error_code::format_error, path(), ": tensor '", name, "' has dtype ", e.dtype,
                        "; only F32, F16 and BF16 weights are supported");
        }
        return out;
    }

private:
    mapped_file file_;
    safetensors_header header_;
};

}  // namespace kvcache::examples
