// The versioned binary format of saved caches, shared by every owner.
//
//   "KVCACHE\0"  8 bytes magic
//   u32 version (2; 1 still loads), u32 layout_kind, u32 element kinds (encode_kv_kinds: the
//   element_kind, or for keys and values of two types key | (value + 1) << 8),
//   i32 query_heads, kv_heads, head_dim, layers, i32 parameters[3], u32 sequences
//   per sequence: i32 length, i32 present, i32 positions[present],
//                 i32 tokens, i32 token_ids[tokens],
//                 per layer: keys [present][kv_head][key row], values [present][kv_head][value row]
//   u64 checksum over every byte before it: the striped hash (checksum.hpp);
//   FNV-1a in version 1 files
// Little-endian, rows as stored (native element bits; int8 and int4 rows
// with their scales), a row of each side's type. A load reads from
// the stream's position to its end: that is the file, nothing may follow.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <istream>
#include <ostream>
#include <streambuf>
#include <string>
#include <utility>
#include <vector>

#include "kvcache/cache/checksum.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace detail {

inline constexpr char file_magic[8] = {'K', 'V', 'C', 'A', 'C', 'H', 'E', '\0'};
/// The version save writes. Version 1 differs only in its checksum (FNV-1a);
/// it still loads.
inline constexpr std::uint32_t file_version = 2;

/// What a file says about the cache it came from.
struct file_header {
    layout_kind layout = layout_kind::contiguous;
    kv_kinds element = element_kind::fp32;  ///< what keys and values are stored as
    head_shape heads;
    int layers = 0;
    int parameters[3] = {0, 0, 0};  ///< layout-specific: see each owner
    std::uint32_t sequences = 0;
    /// [layer], when either side is a scaled element kind (fp8) only: written
    /// after the layout parameters, a key and a value float per layer.
    std::vector<kv_scales> scales;
};

/// True when a file of these kinds records per-layer scales (either side fp8).
constexpr bool records_scales(kv_kinds kinds) noexcept { return is_scaled_kind(kinds.key) || is_scaled_kind(kinds.value); }

/// One sequence to save: its length, present positions, known token ids and
/// rows, per layer [present][kv_head][row]. (Loads use file_records.)
/// @tparam Element stored element type, or a kv_elements pair
template <class Element>
struct sequence_record {
    int length = 0;
    std::vector<int> positions;
    std::vector<std::int32_t> tokens;
    std::vector<std::vector<key_element_t<Element>>> keys;      ///< [layer]
    std::vector<std::vector<value_element_t<Element>>> values;  ///< [layer]
};

/// Writes bytes and keeps the running checksum.
class checked_writer {
public:
    explicit checked_writer(std::ostream& out) : out_(out) {}
    void bytes(const void* data, std::size_t n) {
        sum_.update(data, n);
        out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
        if (!out_) throw_error(error_code::io_error, "writing ", n, " bytes to the stream failed");
    }
    template <class T>
    void value(T v) { bytes(&v, sizeof v); }
    void finish() {
        const std::uint64_t sum = sum_.value();
        out_.write(reinterpret_cast<const char*>(&sum), sizeof sum);
        out_.flush();
        if (!out_) throw_error(error_code::io_error, "writing the checksum to the stream failed");
    }

private:
    std::ostream& out_;
    file_checksum sum_{file_version};
};

/// Bytes of the fixed header, and of the smallest record (length, present,
/// tokens: three i32).
inline constexpr std::uint64_t file_header_bytes = 52;
inline constexpr std::uint64_t min_record_bytes = 12;
inline constexpr std::uint64_t checksum_bytes = 8;

/// A dynamic_cache may grow by a load to at most its current reservation
/// plus max(that reservation, load_growth_factor x the file's bytes): a small
/// file must not make a contiguous cache reserve slots x its longest record.
inline constexpr std::uint64_t load_growth_factor = 16;

/// A read-only, seekable stream buffer over bytes this reader owns: the
/// fallback for streams that cannot seek (a file is read twice).
class owned_bytes_buffer : public std::streambuf {
public:
    explicit owned_bytes_buffer(std::string bytes) : bytes_(std::move(bytes)) {
        char* begin = bytes_.data();
        setg(begin, begin, begin + bytes_.size());
    }

protected:
    pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override {
        const off_type base = dir == std::ios_base::beg ? 0 : dir == std::ios_base::cur ? gptr() - eback()
                                                                                         : egptr() - eback();
        return seekpos(pos_type(base + off), std::ios_base::in);
    }
    pos_type seekpos(pos_type pos, std::ios_base::openmode) override {
        const off_type at = off_type(pos);
        if (at < 0 || at > egptr() - eback()) return pos_type(off_type(-1));
        setg(eback(), eback() + at, egptr());
        return pos;
    }

private:
    std::string bytes_;
};

/// Reads a stream whose size is known, keeping the running checksum, so
/// every count can be checked against the bytes that remain before anything
/// is allocated for it. The checksum's algorithm depends on the file's
/// version, so the bytes before it (magic and version) are kept until
/// start_checksum() names it.
class checked_reader {
public:
    checked_reader(std::istream& in, std::uint64_t size) : in_(in), size_(size) {}

    std::uint64_t offset() const noexcept { return offset_; }
    /// Bytes left before the checksum (0 once inside it).
    std::uint64_t payload_left() const noexcept {
        return size_ - offset_ > checksum_bytes ? size_ - offset_ - checksum_bytes : 0;
    }
    std::uint64_t hash() const noexcept { return sum_.value(); }

    /// Hashes what was read so far, and everything after, with the checksum
    /// of format `version`.
    void start_checksum(std::uint32_t version) noexcept {
        sum_ = file_checksum(version);
        sum_.update(prefix_, prefix_bytes_);
        started_ = true;
    }

    void bytes(void* data, std::size_t n) {
        read(data, n);
        if (started_) {
            sum_.update(data, n);
        } else {
            require(prefix_bytes_ + n <= sizeof prefix_, error_code::format_error,
                    "a file's checksum must be chosen within its first ", sizeof prefix_, " bytes");
            std::memcpy(prefix_ + prefix_bytes_, data, n);
            prefix_bytes_ += n;
        }
    }
    /// Reads n bytes through a fixed buffer, hashing them, keeping none.
    void skip(std::uint64_t n) {
        char buffer[16384];
        while (n > 0) {
            const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n, sizeof buffer));
            bytes(buffer, chunk);
            n -= chunk;
        }
    }
    template <class T>
    T value() {
        T v{};
        bytes(&v, sizeof v);
        return v;
    }
    /// Reads the stored checksum (not hashed) and returns it.
    std::uint64_t stored_checksum() {
        if (size_ - offset_ < checksum_bytes)
            throw_error(error_code::format_error, "file truncated: checksum missing at offset ", offset_, " (",
                        size_ - offset_, " of its 8 bytes present)");
        std::uint64_t stored = 0;
        read(&stored, sizeof stored);
        return stored;
    }
    /// Bytes of the stream after what has been read.
    std::uint64_t unread() const noexcept { return size_ - offset_; }

private:
    void read(void* data, std::size_t n) {
        if (n > size_ - offset_)
            throw_error(error_code::format_error, "file truncated: needed ", n, " bytes at offset ", offset_,
                        ", only ", size_ - offset_, " left");
        in_.read(static_cast<char*>(data), static_cast<std::streamsize>(n));
        if (static_cast<std::size_t>(in_.gcount()) != n)
            throw_error(error_code::io_error, "the stream ended at offset ", offset_ + in_.gcount(),
                        " although it reported ", size_, " bytes (was the file changed while loading?)");
        offset_ += n;
    }

    std::istream& in_;
    std::uint64_t size_;
    file_checksum sum_{file_version};
    bool started_ = false;
    unsigned char prefix_[16] = {};
    std::size_t prefix_bytes_ = 0;
    std::uint64_t offset_ = 0;
};

/// The name of a stored layout kind; "unknown" for values no build writes.
inline const char* layout_name(std::uint32_t v) noexcept {
    return v <= 2 ? to_string(static_cast<layout_kind>(v)) : "unknown";
}
/// The name of recorded element kinds ("fp16", "int8+int4"); "unknown" for values no build writes.
inline std::string element_name(std::uint32_t v) { return recorded_kinds_name(v); }

/// What layout parameter i of a header means for that layout.
inline const char* parameter_name(layout_kind layout, int i) noexcept {
    static constexpr const char* paged[3] = {"page_size", "unused parameter 1", "unused parameter 2"};
    static constexpr const char* sliding[3] = {"sinks", "ring", "window"};
    static constexpr const char* contiguous[3] = {"unused parameter 0", "unused parameter 1", "unused parameter 2"};
    return layout == layout_kind::paged ? paged[i] : layout == layout_kind::sliding_window ? sliding[i] : contiguous[i];
}

/// A header's layout parameters as the owner's constructor takes them, e.g.
/// "window 16, sinks 2, max_chunk 4, ring 19" (the ring is what is stored).
inline std::string describe_parameters(layout_kind layout, const int (&p)[3]) {
    if (layout == layout_kind::sliding_window)
        return detail::concat("window ", p[2], ", sinks ", p[0], ", max_chunk ", std::int64_t(p[1]) - p[2] + 1,
                              ", ring ", p[1]);
    if (layout == layout_kind::paged && p[1] == 0 && p[2] == 0) return detail::concat("page_size ", p[0]);
    std::string out;
    for (int i = 0; i < 3; ++i) out += detail::concat(i ? ", " : "", parameter_name(layout, i), " ", p[i]);
    return out;
}

/// Rethrows e with the path of the file it came from in front of its message.
[[noreturn]] inline void rethrow_for_file(const error& e, const std::string& path) {
    std::string message = e.what();
    const std::string prefix = std::string("kvcache: ") + to_string(e.code()) + ": ";
    if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
    throw_error(e.code(), "loading '", path, "': ", message);
}

/// The records of a loaded file, stored compactly: no more memory than the
/// file's own bytes (per record three ints, then its positions, token ids
/// and rows as the file holds them, keys and values each in an array of
/// their own type).
/// @tparam Element stored element type, or a kv_elements pair
template <class Element>
class file_records {
public:
    using key_type = key_element_t<Element>;      ///< what key rows hold
    using value_type = value_element_t<Element>;  ///< what value rows hold

    /// One record; keys(l) and values(l) are [present][kv_head][row].
    struct record {
        int length = 0;
        span<const int> positions;
        span<const std::int32_t> tokens;
        const key_type* key_rows = nullptr;      ///< every layer's keys, layer after layer
        const value_type* value_rows = nullptr;  ///< every layer's values, layer after layer
        std::size_t key_plane = 0;    ///< elements of one layer's keys
        std::size_t value_plane = 0;  ///< elements of one layer's values

        int present() const noexcept { return static_cast<int>(positions.size()); }
        const key_type* keys(int layer) const noexcept { return key_rows + std::size_t(layer) * key_plane; }
        const value_type* values(int layer) const noexcept { return value_rows + std::size_t(layer) * value_plane; }
    };

    /// Walks the records in file order.
    class iterator {
    public:
        record operator*() const {
            const counts& c = owner_->counts_[index_];
            record r;
            r.length = c.length;
            r.positions = {owner_->positions_.data() + positions_, std::size_t(c.present)};
            r.tokens = {owner_->tokens_.data() + tokens_, std::size_t(c.tokens)};
            r.key_plane = std::size_t(c.present) * owner_->key_row_;
            r.value_plane = std::size_t(c.present) * owner_->value_row_;
            r.key_rows = owner_->key_rows_.data() + key_rows_;
            r.value_rows = owner_->value_rows_.data() + value_rows_;
            return r;
        }
        iterator& operator++() {
            const counts& c = owner_->counts_[index_++];
            positions_ += c.present;
            tokens_ += c.tokens;
            key_rows_ += std::size_t(owner_->layers_) * c.present * owner_->key_row_;
            value_rows_ += std::size_t(owner_->layers_) * c.present * owner_->value_row_;
            return *this;
        }
        bool operator!=(const iterator& other) const noexcept { return index_ != other.index_; }

    private:
        friend file_records;
        iterator(const file_records* owner, std::size_t index) : owner_(owner), index_(index) {}
        const file_records* owner_;
        std::size_t index_, positions_ = 0, tokens_ = 0, key_rows_ = 0, value_rows_ = 0;
    };

    std::size_t size() const noexcept { return counts_.size(); }
    iterator begin() const { return iterator(this, 0); }
    iterator end() const { return iterator(this, counts_.size()); }
    /// Bytes of the file they came from, checksum included.
    std::uint64_t file_bytes() const noexcept { return file_bytes_; }

    // Filled by read_sized_file; owners only iterate.
    struct counts {
        std::int32_t length, present, tokens;
    };
    std::vector<counts> counts_;
    std::vector<int> positions_;
    std::vector<std::int32_t> tokens_;
    std::vector<key_type> key_rows_;
    std::vector<value_type> value_rows_;
    std::size_t key_row_ = 0, value_row_ = 0;  ///< elements of one position's keys (values) in one layer
    int layers_ = 0;
    std::uint64_t file_bytes_ = 0;
};

/// Writes the header, the records and the checksum.
/// @tparam Element stored element type, or a kv_elements pair
template <class Element>
void write_file(std::ostream& out, const file_header& header, const std::vector<sequence_record<Element>>& records) {
    checked_writer w(out);
    w.bytes(file_magic, sizeof file_magic);
    w.value<std::uint32_t>(file_version);
    w.value<std::uint32_t>(static_cast<std::uint32_t>(header.layout));
    w.value<std::uint32_t>(encode_kv_kinds(header.element));
    w.value<std::int32_t>(header.heads.query_heads);
    w.value<std::int32_t>(header.heads.kv_heads);
    w.value<std::int32_t>(header.heads.head_dim);
    w.value<std::int32_t>(header.layers);
    for (int p : header.parameters) w.value<std::int32_t>(p);
    if (records_scales(header.element))
        for (const kv_scales& s : header.scales) {
            w.value<float>(s.key);
            w.value<float>(s.value);
        }
    w.value<std::uint32_t>(static_cast<std::uint32_t>(records.size()));
    for (const auto& r : records) {
        w.value<std::int32_t>(r.length);
        w.value<std::int32_t>(static_cast<std::int32_t>(r.positions.size()));
        w.bytes(r.positions.data(), r.positions.size() * sizeof(int));
        w.value<std::int32_t>(static_cast<std::int32_t>(r.tokens.size()));
        w.bytes(r.tokens.data(), r.tokens.size() * sizeof(std::int32_t));
        for (int l = 0; l < header.layers; ++l) {
            w.bytes(r.keys[l].data(), r.keys[l].size() * sizeof(key_element_t<Element>));
            w.bytes(r.values[l].data(), r.values[l].size() * sizeof(value_element_t<Element>));
        }
    }
    w.finish();
}

/// Reads the header and checks it against `expected` (the parameters are
/// compared too); every mismatch is a format_error naming the file's value
/// and the cache's. Returns the number of sequences, checked against the
/// bytes left.
inline std::uint32_t read_header(checked_reader& r, const file_header& expected) {
    char magic[8];
    r.bytes(magic, sizeof magic);
    if (std::memcmp(magic, file_magic, sizeof magic) != 0)
        throw_error(error_code::format_error, "bad magic: not a kvcache file (expected \"KVCACHE\\0\")");
    const auto version = r.value<std::uint32_t>();
    require(version >= 1 && version <= file_version, error_code::format_error, "file format version ", version,
            " is not supported (this build reads versions 1 to ", file_version, ")");
    r.start_checksum(version);
    const auto layout = r.value<std::uint32_t>();
    const auto cache_layout = static_cast<std::uint32_t>(expected.layout);
    require(layout == cache_layout, error_code::format_error, "file was saved by a ", layout_name(layout),
            " cache (layout kind ", layout, "), this is a ", layout_name(cache_layout), " cache (layout kind ",
            cache_layout, ")");
    const auto element = r.value<std::uint32_t>();
    const auto cache_element = encode_kv_kinds(expected.element);
    require(element == cache_element, error_code::format_error, "file holds ", element_name(element),
            " elements (element kind ", element, "), the cache stores ", element_name(cache_element),
            " (element kind ", cache_element, ")");
    head_shape heads;
    heads.query_heads = r.value<std::int32_t>();
    heads.kv_heads = r.value<std::int32_t>();
    heads.head_dim = r.value<std::int32_t>();
    require(heads == expected.heads, error_code::format_error, "file head configuration ", heads.to_string(),
            " does not match the cache's ", expected.heads.to_string());
    const int layers = r.value<std::int32_t>();
    require(layers == expected.layers, error_code::format_error, "file has ", layers,
            " layers, the cache has ", expected.layers);
    int parameters[3];
    for (int& p : parameters) p = r.value<std::int32_t>();
    if (!std::equal(parameters, parameters + 3, expected.parameters)) {
        std::string differing;
        for (int i = 0; i < 3; ++i)
            if (parameters[i] != expected.parameters[i])
                differing += detail::concat(differing.empty() ? "" : ", ", parameter_name(expected.layout, i), " ",
                                            parameters[i], " vs ", expected.parameters[i]);
        throw_error(error_code::format_error, "file's ", to_string(expected.layout), " parameters ",
                    describe_parameters(expected.layout, parameters), " do not match the cache's ",
                    describe_parameters(expected.layout, expected.parameters), " (differing: ", differing, ")");
    }
    // The same element kind, so the same layers of scales (or none) follow;
    // rows narrowed with other scales would read as other numbers.
    if (records_scales(expected.element))
        for (int l = 0; l < layers; ++l) {
            const float key = r.value<float>(), value = r.value<float>();
            const kv_scales want = l < int(expected.scales.size()) ? expected.scales[std::size_t(l)] : kv_scales{};
            require(key == want.key && value == want.value, error_code::format_error, "file's scales of layer ", l,
                    " (key ", key, ", value ", value, ") do not match the cache's (key ", want.key, ", value ",
                    want.value, "): set_scales before load as the saving cache had them");
        }
    const auto sequences = r.value<std::uint32_t>();
    require(sequences * min_record_bytes <= r.payload_left(), error_code::format_error,
            "file truncated or corrupt: the header declares ", sequences, " sequences, which take at least ",
            sequences * min_record_bytes, " bytes, only ", r.payload_left(), " bytes remain before the checksum");
    return sequences;
}

/// What the records of a file add up to.
struct record_totals {
    std::uint64_t positions = 0, tokens = 0;
    std::uint64_t key_rows = 0, value_rows = 0;  ///< in elements of each side's type
    bool operator==(const record_totals& o) const noexcept {
        return positions == o.positions && tokens == o.tokens && key_rows == o.key_rows && value_rows == o.value_rows;
    }
};

/// One walk over the records. Each count is checked against the bytes left
/// before the checksum, so no claim can exceed the file. Without `into` the
/// walk keeps nothing and sums the counts; with it, it fills arrays the first
/// walk sized, and checks the positions.
/// key_row and value_row: elements of one position's keys (values) in one layer.
/// @tparam Element stored element type, or a kv_elements pair
template <class Element>
record_totals read_records(checked_reader& r, std::uint32_t sequences, int layers, std::size_t key_row,
                           std::size_t value_row, file_records<Element>* into) {
    using key_type = key_element_t<Element>;
    using value_type = value_element_t<Element>;
    // Bytes of one position's rows, every layer's K and V.
    const std::uint64_t rows_per_position =
        std::uint64_t(layers) * (key_row * sizeof(key_type) + value_row * sizeof(value_type));
    const std::uint64_t position_bytes = 4 + rows_per_position;
    record_totals t;
    // Only a stream changed between the walks can make the second one disagree.
    auto room = [&](std::uint64_t used, std::uint64_t wanted, std::size_t have) {
        require(used + wanted <= have, error_code::io_error,
                "the stream changed between the two passes of the load (a record grew)");
    };
    for (std::uint32_t s = 0; s < sequences; ++s) {
        if (r.payload_left() < min_record_bytes)
            throw_error(error_code::format_error, "file truncated: sequence ", s, " of ", sequences,
                        " needs at least ", min_record_bytes, " bytes at offset ", r.offset(), ", only ",
                        r.payload_left(), " remain before the checksum");
        const std::uint64_t at = r.offset();
        const int length = r.value<std::int32_t>();
        require(length >= 0, error_code::format_error, "sequence ", s, " of ", sequences, ": length ", length,
                " at offset ", at, " is negative");
        const int present = r.value<std::int32_t>();
        require(present >= 0 && present <= length, error_code::format_error, "sequence ", s, " of ", sequences,
                ": present positions = ", present, " at offset ", at + 4, " is outside [0, ", length, "]");
        require(present * position_bytes + 4 <= r.payload_left(), error_code::format_error,
                "file truncated: sequence ", s, " of ", sequences, " claims ", present, " present positions (",
                present * position_bytes, " bytes with their rows), only ", r.payload_left(),
                " bytes remain before the checksum");
        if (into) {
            room(t.positions, present, into->positions_.size());
            int* positions = into->positions_.data() + t.positions;
            r.bytes(positions, std::size_t(present) * sizeof(int));
            for (int i = 0; i < present; ++i)
                require(positions[i] >= 0 && positions[i] < length && (i == 0 || positions[i] > positions[i - 1]),
                        error_code::format_error, "sequence ", s, " of ", sequences, ": saved position ",
                        positions[i], " is not ascending inside [0, ", length, ")");
        } else {
            r.skip(std::uint64_t(present) * sizeof(int));
        }
        const int tokens = r.value<std::int32_t>();
        require(tokens >= 0 && tokens <= length, error_code::format_error, "sequence ", s, " of ", sequences,
                ": token ids = ", tokens, " is outside [0, ", length, "]");
        const std::uint64_t row_bytes = present * rows_per_position;
        require(std::uint64_t(tokens) * 4 + row_bytes <= r.payload_left(), error_code::format_error,
                "file truncated: sequence ", s, " of ", sequences, " claims ", tokens, " token ids and ", present,
                " present positions (", std::uint64_t(tokens) * 4 + row_bytes, " bytes), only ", r.payload_left(),
                " bytes remain before the checksum");
        const std::uint64_t key_plane = std::uint64_t(present) * key_row, value_plane = std::uint64_t(present) * value_row;
        if (into) {
            room(t.tokens, tokens, into->tokens_.size());
            r.bytes(into->tokens_.data() + t.tokens, std::size_t(tokens) * sizeof(std::int32_t));
            room(t.key_rows, layers * key_plane, into->key_rows_.size());
            room(t.value_rows, layers * value_plane, into->value_rows_.size());
            for (int l = 0; l < layers; ++l) {  // the file interleaves each layer's keys and values
                r.bytes(into->key_rows_.data() + t.key_rows + l * key_plane, std::size_t(key_plane) * sizeof(key_type));
                r.bytes(into->value_rows_.data() + t.value_rows + l * value_plane,
                        std::size_t(value_plane) * sizeof(value_type));
            }
            into->counts_[s] = {length, present, tokens};
        } else {
            r.skip(std::uint64_t(tokens) * 4 + row_bytes);
        }
        t.positions += present;
        t.tokens += tokens;
        t.key_rows += layers * key_plane;
        t.value_rows += layers * value_plane;
    }
    return t;
}

/// Elements of one position's rows of a side (every KV head) in one layer.
/// @tparam Side the element type a side's rows hold
template <class Side>
std::size_t position_row_elements(const head_shape& heads) noexcept {
    return std::size_t(heads.kv_heads) * row_elements<Side>(heads.head_dim);
}

/// Empty records of `sequences` sequences whose arrays are sized for
/// `totals`, ready for read_records to fill.
/// @tparam Element stored element type, or a kv_elements pair
template <class Element>
file_records<Element> sized_records(std::uint32_t sequences, const record_totals& totals, const file_header& header) {
    file_records<Element> out;
    out.counts_.resize(sequences);
    out.positions_.resize(totals.positions);
    out.tokens_.resize(totals.tokens);
    out.key_rows_.resize(totals.key_rows);
    out.value_rows_.resize(totals.value_rows);
    out.key_row_ = position_row_elements<key_element_t<Element>>(header.heads);
    out.value_row_ = position_row_elements<value_element_t<Element>>(header.heads);
    out.layers_ = header.layers;
    return out;
}

/// read_file on a stream that can seek back to `start`, `size` bytes long.
/// @tparam Element stored element type, or a kv_elements pair
template <class Element>
file_records<Element> read_sized_file(std::istream& in, std::istream::pos_type start, std::uint64_t size,
                                      const file_header& expected) {
    const std::size_t key_row = position_row_elements<key_element_t<Element>>(expected.heads);
    const std::size_t value_row = position_row_elements<value_element_t<Element>>(expected.heads);
    // First pass: header, counts and checksum, with no more memory than a
    // small buffer, so nothing is allocated for a file that is not intact.
    checked_reader first(in, size);
    const std::uint32_t sequences = read_header(first, expected);
    const record_totals totals = read_records<Element>(first, sequences, expected.layers, key_row, value_row, nullptr);
    const std::uint64_t stored = first.stored_checksum();
    require(stored == first.hash(), error_code::format_error, "checksum ", stored, " does not match contents (",
            first.hash(), ")");
    // The checksum covers the file, so the file must be all the stream holds:
    // anything after it would be accepted unverified.
    require(first.unread() == 0, error_code::format_error, first.unread(),
            " bytes follow the checksum (the file ends at offset ", first.offset(), " of the ", size,
            " bytes left in the stream; a load takes the whole rest of the stream as one file)");

    // Second pass: into arrays sized exactly by the first, so a load holds
    // no more than the file's bytes.
    file_records<Element> out = sized_records<Element>(sequences, totals, expected);
    out.file_bytes_ = first.offset();
    in.clear();
    in.seekg(start);
    require(static_cast<bool>(in), error_code::io_error, "cannot seek the stream back to where the file starts");
    checked_reader second(in, size);
    (void)read_header(second, expected);
    const bool same = read_records<Element>(second, sequences, expected.layers, key_row, value_row, &out) == totals &&
                      second.stored_checksum() == stored && second.hash() == stored;
    require(same, error_code::io_error, "the stream changed between the two passes of the load");
    return out;
}

/// Reads a file written for a cache configured like `expected`: the whole
/// rest of the stream, checked (configuration, every count against the
/// bytes left, checksum) before more than a small buffer is allocated, then
/// kept in no more memory than the file's size. A stream that cannot seek is
/// first copied into memory (the file's size again).
/// @tparam Element stored element type, or a kv_elements pair
template <class Element>
file_records<Element> read_file(std::istream& in, const file_header& expected) {
    require(static_cast<bool>(in), error_code::io_error, "the stream to load from is not readable");
    const std::istream::pos_type start = in.tellg();
    if (start != std::istream::pos_type(-1)) {
        in.seekg(0, std::ios::end);
        const std::istream::pos_type stop = in.tellg();
        in.clear();
        in.seekg(start);
        if (stop != std::istream::pos_type(-1) && stop >= start && in)
            return read_sized_file<Element>(in, start, static_cast<std::uint64_t>(stop - start), expected);
    }
    in.clear();
    std::string bytes;
    char chunk[16384];
    while (in.read(chunk, sizeof chunk) || in.gcount() > 0) bytes.append(chunk, static_cast<std::size_t>(in.gcount()));
    require(!in.bad(), error_code::io_error, "reading the stream failed after ", bytes.size(), " bytes");
    const std::uint64_t size = bytes.size();
    owned_bytes_buffer buffer(std::move(bytes));
    std::istream copy(&buffer);
    return read_sized_file<Element>(copy, 0, size, expected);
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
