// The files' checksums: version 2's striped hash against its definition in
// docs/layouts.md (written again in the test support), however the bytes
// arrive; version 1 files (FNV-1a) still load; the version picks the checksum.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>

#include "cache_test_support.hpp"
#include "kvcache/cache.hpp"

using test_support::append_all_layers;
using test_support::as_version;
using test_support::documented_striped_hash;
using test_support::with_checksum;

namespace {

using heads = kvcache::head_config<4, 2, 8>;

/// Bytes from a small linear congruential generator: varied, repeatable.
std::string varied_bytes(std::size_t n, std::uint32_t seed) {
    std::string out(n, '\0');
    for (auto& c : out) {
        seed = seed * 1664525u + 1013904223u;
        c = static_cast<char>(seed >> 24);
    }
    return out;
}

std::uint64_t library_hash(const std::string& bytes, std::size_t first_cut, std::size_t second_cut) {
    kvcache::detail::striped_hash h;
    h.update(bytes.data(), first_cut);
    h.update(bytes.data() + first_cut, second_cut - first_cut);
    h.update(bytes.data() + second_cut, bytes.size() - second_cut);
    return h.value();
}

}  // namespace

TEST_CASE("checksum: the striped hash is its documented definition, however the bytes are split") {
    for (std::size_t n : {0u, 1u, 7u, 8u, 31u, 32u, 33u, 64u, 95u, 200u}) {
        const std::string bytes = varied_bytes(n, 7u + std::uint32_t(n));
        const std::uint64_t expected = documented_striped_hash(bytes);
        for (std::size_t a = 0; a <= n; ++a)
            for (std::size_t b = a; b <= n; b += 5) {
                INFO("length ", n, ", cut at ", a, " and ", b);
                REQUIRE(library_hash(bytes, a, b) == expected);
            }
        kvcache::detail::striped_hash bytewise;  // one byte per call: every stripe through the buffer
        for (char c : bytes) bytewise.update(&c, 1);
        CHECK(bytewise.value() == expected);
    }
}

TEST_CASE("checksum: every one-bit change, a dropped or an appended byte changes the striped hash") {
    const std::string bytes = varied_bytes(150, 3);  // four stripes, two words and six bytes past them
    const std::uint64_t original = documented_striped_hash(bytes);
    kvcache::detail::striped_hash whole;
    whole.update(bytes.data(), bytes.size());
    REQUIRE(whole.value() == original);
    for (std::size_t i = 0; i < bytes.size(); ++i)
        for (int bit = 0; bit < 8; ++bit) {
            std::string changed = bytes;
            changed[i] = static_cast<char>(changed[i] ^ (1 << bit));
            kvcache::detail::striped_hash h;
            h.update(changed.data(), changed.size());
            INFO("byte ", i, " bit ", bit);
            REQUIRE(h.value() != original);
        }
    for (const std::string& other : {bytes.substr(0, 149), bytes + '\0', std::string(1, '\0') + bytes}) {
        kvcache::detail::striped_hash h;
        h.update(other.data(), other.size());
        CHECK(h.value() != original);
    }
    // Runs of zero bytes differ only in their length, which is mixed in.
    std::uint64_t previous = 0;
    for (std::size_t n = 0; n <= 70; ++n) {
        const std::uint64_t h = documented_striped_hash(std::string(n, '\0'));
        CHECK(h != previous);
        previous = h;
    }
}

TEST_CASE_TEMPLATE("files: save writes version 2 with the striped hash; version 1 (FNV-1a) still loads", Element,
                   float, kvcache::half) {
    kvcache::paged_cache<Element, heads> source(2, 16, 4);
    append_all_layers(source, source.add_sequence(), 6, 1);
    append_all_layers(source, source.add_sequence(), 3, 2);
    std::ostringstream out;
    source.save(out);
    const std::string file = out.str();
    std::uint32_t version = 0;
    std::memcpy(&version, file.data() + 8, 4);
    CHECK(version == 2);
    std::uint64_t stored = 0;
    std::memcpy(&stored, file.data() + file.size() - 8, 8);
    CHECK(stored == documented_striped_hash(file.substr(0, file.size() - 8)));

    auto load_and_save = [&](const std::string& bytes) {
        kvcache::paged_cache<Element, heads> target(2, 16, 4);
        std::istringstream in(bytes);
        const auto ids = target.load(in);
        std::ostringstream again;
        target.save(again, ids);
        return again.str();
    };
    // A version 1 file of the same caches loads the same rows, saved again as version 2.
    const std::string version_1 = as_version(file, 1);
    CHECK(version_1 != file);
    CHECK(load_and_save(version_1) == file);
    CHECK(load_and_save(file) == file);

    // The version picks the checksum: each header with the other's checksum is damaged.
    kvcache::paged_cache<Element, heads> target(2, 16, 4);
    const std::string payload_1 = version_1.substr(0, version_1.size() - 8);
    const std::string payload_2 = file.substr(0, file.size() - 8);
    for (const std::string& mixed : {with_checksum(payload_1, 2), with_checksum(payload_2, 1)}) {
        std::istringstream in(mixed);
        CHECK_THROWS_WITH_AS(target.load(in), doctest::Contains("checksum"), kvcache::error);
    }
    for (std::uint32_t unknown : {0u, 3u}) {
        std::istringstream in(as_version(file, unknown));
        const std::string needle = "version " + std::to_string(unknown) + " is not supported";
        CHECK_THROWS_WITH_AS(target.load(in), doctest::Contains(needle.c_str()), kvcache::error);
    }
    CHECK(target.sequence_count() == 0);
}
