// Every failing operation throws the documented error, names the bad value
// and the limit, and leaves the cache exactly as it was (strong guarantee).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>

#include "cache_test_support.hpp"
#include "kvcache/cache.hpp"

using test_support::append_all_layers;
using test_support::snapshot;

namespace {

using heads = kvcache::head_config<4, 2, 8>;

/// Runs f, which must throw `code` with every `needle` in its message, and
/// checks the snapshot is unchanged.
template <class Cache, class F>
void check_fails(int line, const Cache& cache, kvcache::error_code code, std::initializer_list<const char*> needles, F&& f) {
    INFO("check at line ", line);
    const std::string before = snapshot(cache);
    bool thrown = false;
    try {
        f();
    } catch (const kvcache::error& e) {
        thrown = true;
        INFO(std::string(e.what()));
        CHECK(e.code() == code);
        for (const char* needle : needles) CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
    CHECK(thrown);
    CHECK(snapshot(cache) == before);
}

}  // namespace

TEST_CASE_TEMPLATE("contiguous: capacity, slots, ids, truncate, fork", Element, float, kvcache::half) {
    kvcache::static_cache<Element, heads> cache(2, 2, 10);
    const auto a = cache.add_sequence();
    append_all_layers(cache, a, 7, 1);
    const auto b = cache.add_sequence();
    append_all_layers(cache, b, 3, 2);
    const auto k = test_support::rows<Element, heads>(4, 9);
    using E = kvcache::error_code;
    check_fails(__LINE__, cache, E::capacity_exceeded, {"append of 4", "length 7", "capacity 10"},
                [&] { cache.append(a, 0, k, k, 4); });
    check_fails(__LINE__, cache, E::capacity_exceeded, {"capacity 10"}, [&] { cache.begin_append(a, 4); });
    check_fails(__LINE__, cache, E::capacity_exceeded, {"2 slots"}, [&] { cache.add_sequence(); });
    check_fails(__LINE__, cache, E::capacity_exceeded, {"2 slots"}, [&] { cache.fork(a); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { cache.fork(99); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { cache.remove_sequence(99); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { cache.append(99, 0, k, k, 1); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { cache.view(0, {a, 99}); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { cache.keep_only({a, 99}); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] {
        std::ostringstream out;
        cache.save(out, {99});
    });
    check_fails(__LINE__, cache, E::out_of_range, {"to 8", "[0, 7]"}, [&] { cache.truncate(a, 8); });
    check_fails(__LINE__, cache, E::out_of_range, {"to -1"}, [&] { cache.truncate(a, -1); });
    check_fails(__LINE__, cache, E::out_of_range, {"layer 2", "[0, 2)"}, [&] { cache.append(a, 2, k, k, 1); });
    check_fails(__LINE__, cache, E::out_of_range, {"4 tokens to layer 1", "3 positions"},
                [&] { cache.append(b, 1, k, k, 4); });
    check_fails(__LINE__, cache, E::out_of_range, {"[6, 8)", "length 7"}, [&] { cache.write(a, 0, 6, k, k, 2); });
    check_fails(__LINE__, cache, E::invalid_argument, {"-1"}, [&] { cache.begin_append(a, -1); });
    // The failures changed nothing, and valid work still goes through.
    cache.truncate(a, 2);
    CHECK(cache.length(a) == 2);
}

TEST_CASE("constructors reject impossible sizes") {
    using E = kvcache::error_code;
    auto code_of = [](auto&& f) {
        try {
            f();
        } catch (const kvcache::error& e) {
            return e.code();
        }
        return E::kernel_fault;  // "no error"; never thrown by these constructors
    };
    CHECK(code_of([] { kvcache::static_cache<float, heads>(0, 1, 1); }) == E::invalid_argument);
    CHECK(code_of([] { kvcache::static_cache<float, heads>(1, 0, 1); }) == E::invalid_argument);
    CHECK(code_of([] { kvcache::paged_cache<float, heads>(1, 4, 0); }) == E::invalid_argument);
    CHECK(code_of([] { kvcache::paged_cache<float, heads>(1, 0, 4); }) == E::invalid_argument);
    CHECK(code_of([] { kvcache::sliding_window_cache<float, heads>(1, 1, 0, 0); }) == E::invalid_argument);
    CHECK(code_of([] { kvcache::sliding_window_cache<float, heads>(1, 1, 4, -1); }) == E::invalid_argument);
    CHECK(code_of([] { kvcache::sliding_window_cache<float, heads>(1, 1, 4, 0, 0); }) == E::invalid_argument);
}

TEST_CASE_TEMPLATE("paged: a dry pool refuses before evicting anything", Element, float, kvcache::half) {
    // 6 pages of 4 tokens.
    kvcache::paged_cache<Element, heads> cache(2, 6, 4);
    using E = kvcache::error_code;
    std::vector<std::int32_t> tokens(8);
    for (int i = 0; i < 8; ++i) tokens[i] = 40 + i;
    const auto cached = cache.add_sequence();
    const auto k8 = test_support::rows<Element, heads>(8, 3);
    cache.append(cached, k8, k8, tokens);
    for (int l = 1; l < 2; ++l) cache.append(cached, l, k8, k8, 8);
    cache.remove_sequence(cached);  // two full pages stay cached, evictable
    CHECK(cache.statistics().pages_evictable == 2);
    const auto a = cache.add_sequence();
    append_all_layers(cache, a, 13, 1);  // 4 pages: the pool had 4 free, so nothing is evicted yet
    CHECK(cache.statistics().evictions == 0);
    // 13 + 12 tokens need 3 more pages; 0 free + 2 evictable: refused, and the cached pages survive.
    check_fails(__LINE__, cache, E::capacity_exceeded, {"needs 3 pages", "0 free", "2 evictable"},
                [&] { cache.begin_append(a, 12); });
    CHECK(cache.statistics().pages_cached == 2);
    // Copy-on-write needs a page too: fork, and write into the shared partial page.
    const auto b = cache.fork(a);
    append_all_layers(cache, b, 3, 5);  // copies one page (2 evictable -> 1 left after eviction)
    CHECK(cache.statistics().evictions == 1);
    append_all_layers(cache, b, 4, 6);  // one new page: evicts the last cached page
    CHECK(cache.statistics().evictions == 2);
    const auto k = test_support::rows<Element, heads>(1, 7);
    check_fails(__LINE__, cache, E::capacity_exceeded, {"needs 1 pages"}, [&] { cache.write(a, 0, 0, k, k, 1); });
    check_fails(__LINE__, cache, E::capacity_exceeded, {"needs 1 pages"}, [&] { cache.begin_append(a, 4); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { cache.match_prefix(99, tokens); });
    check_fails(__LINE__, cache, E::invalid_argument, {"length 13"}, [&] { cache.match_prefix(a, tokens); });
    check_fails(__LINE__, cache, E::invalid_argument, {"got 8 token ids"}, [&] { cache.begin_append(a, 2, tokens); });
    check_fails(__LINE__, cache, E::out_of_range, {"to 14", "[0, 13]"}, [&] { cache.truncate(a, 14); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { cache.fork(99); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { cache.truncate(99, 0); });
    check_fails(__LINE__, cache, E::not_found, {"sequence id 99"}, [&] { (void)cache.length(99); });
}

TEST_CASE_TEMPLATE("sliding window: chunk limit, evicted positions, truncate after eviction", Element, float,
                   kvcache::half) {
    // window 4, 2 sinks, chunks of up to 2: ring of 5.
    kvcache::sliding_window_cache<Element, heads> cache(1, 1, 4, 2, 2);
    CHECK(cache.ring() == 5);
    const auto a = cache.add_sequence();
    using E = kvcache::error_code;
    check_fails(__LINE__, cache, E::capacity_exceeded, {"append of 3", "max_chunk 2"}, [&] { cache.begin_append(a, 3); });
    for (int i = 0; i < 5; ++i) append_all_layers(cache, a, 2, i);  // length 10: positions 2..4 evicted
    CHECK(cache.present_positions(a) == std::vector<int>{0, 1, 5, 6, 7, 8, 9});
    const auto k = test_support::rows<Element, heads>(2, 1);
    check_fails(__LINE__, cache, E::out_of_range, {"[3, 4)", "[5, 10)"}, [&] { cache.write(a, 0, 3, k, k, 1); });
    check_fails(__LINE__, cache, E::out_of_range, {"[1, 3)"}, [&] { cache.write(a, 0, 1, k, k, 2); });
    std::vector<Element> out(k.size());
    check_fails(__LINE__, cache, E::out_of_range, {"[4, 6)"}, [&] { cache.read(a, 0, 4, 2, out, out); });
    check_fails(__LINE__, cache, E::out_of_range, {"to 9", "evicted"}, [&] { cache.truncate(a, 9); });
    check_fails(__LINE__, cache, E::capacity_exceeded, {"1 slots"}, [&] { cache.add_sequence(); });
    check_fails(__LINE__, cache, E::capacity_exceeded, {"1 slots"}, [&] { cache.fork(a); });
    // Before anything is evicted a truncate works.
    kvcache::sliding_window_cache<Element, heads> small(1, 1, 4, 2, 2);
    const auto b = small.add_sequence();
    append_all_layers(small, b, 2, 0);
    small.truncate(b, 1);
    CHECK(small.length(b) == 1);
}

TEST_CASE_TEMPLATE("files: magic, version, configuration, checksum, truncation", Element, float, kvcache::half,
                   kvcache::bfloat16) {
    kvcache::paged_cache<Element, heads> source(2, 16, 4);
    const auto a = source.add_sequence();
    append_all_layers(source, a, 6, 1);
    const auto b = source.add_sequence();
    append_all_layers(source, b, 3, 2);
    std::ostringstream out;
    source.save(out);
    const std::string file = out.str();

    kvcache::paged_cache<Element, heads> target(2, 16, 4);
    const auto t = target.add_sequence();
    append_all_layers(target, t, 5, 3);
    using E = kvcache::error_code;
    auto load = [&](const std::string& bytes) {
        std::istringstream in(bytes);
        return target.load(in);
    };
    auto patched = [&](std::size_t offset, std::uint32_t value) {
        std::string bytes = file;
        std::memcpy(&bytes[offset], &value, 4);
        return bytes;
    };
    check_fails(__LINE__, target, E::format_error, {"bad magic"}, [&] {
        std::string bytes = file;
        bytes[0] = 'X';
        load(bytes);
    });
    check_fails(__LINE__, target, E::format_error, {"version 7"}, [&] { load(patched(8, 7)); });
    check_fails(__LINE__, target, E::format_error, {"saved by a contiguous cache", "this is a paged cache"}, [&] { load(patched(12, 0)); });
    const std::uint32_t other_element = kvcache::element_traits<Element>::kind == kvcache::element_kind::fp32 ? 1 : 0;
    check_fails(__LINE__, target, E::format_error, {"element kind"}, [&] { load(patched(16, other_element)); });
    check_fails(__LINE__, target, E::format_error, {"8q/2kv/d8", "4q/2kv/d8"}, [&] { load(patched(20, 8)); });
    check_fails(__LINE__, target, E::format_error, {"3 layers", "has 2"}, [&] { load(patched(32, 3)); });
    check_fails(__LINE__, target, E::format_error, {"page_size 8", "page_size 4"}, [&] { load(patched(36, 8)); });
    // A flipped data byte (past the header) only the checksum can see.
    check_fails(__LINE__, target, E::format_error, {"checksum"}, [&] {
        std::string bytes = file;
        bytes[bytes.size() - 20] ^= 0x10;
        load(bytes);
    });
    // Every truncation point, from an empty file to one missing its last byte.
    for (std::size_t cut = 0; cut < file.size(); ++cut) {
        INFO("cut at ", cut, " of ", file.size());
        check_fails(__LINE__, target, E::format_error, {"truncated"}, [&] { load(file.substr(0, cut)); });
    }
    // Other caches: other layout, other element type, other heads.
    kvcache::static_cache<Element, heads> contiguous(2, 4, 16);
    check_fails(__LINE__, contiguous, E::format_error, {"saved by a paged cache", "this is a contiguous cache"}, [&] {
        std::istringstream in(file);
        contiguous.load(in);
    });
    kvcache::paged_cache<Element, kvcache::head_config<2, 2, 8>> other_heads(2, 16, 4);
    check_fails(__LINE__, other_heads, E::format_error, {"4q/2kv/d8", "2q/2kv/d8"}, [&] {
        std::istringstream in(file);
        other_heads.load(in);
    });
    // Too little room: a pool of 2 pages cannot take 2 + 1 pages.
    kvcache::paged_cache<Element, heads> tiny(2, 2, 4);
    check_fails(__LINE__, tiny, E::capacity_exceeded, {"needs 3 pages"}, [&] {
        std::istringstream in(file);
        tiny.load(in);
    });
    // The intact file loads, with the right contents.
    const auto ids = load(file);
    REQUIRE(ids.size() == 2);
    CHECK(target.length(ids[0]) == 6);
    CHECK(target.length(ids[1]) == 3);
    std::ostringstream again;
    target.save(again, ids);
    CHECK(again.str() == file);
}

TEST_CASE_TEMPLATE("files: round trip through a file for every layout", Element, float, kvcache::half,
                   kvcache::bfloat16) {
    const std::string path = "kvcache_layout_roundtrip_test.bin";
    kvcache::sliding_window_cache<Element, heads> window(2, 2, 3, 1, 2);
    const auto a = window.add_sequence();
    for (int i = 0; i < 6; ++i) append_all_layers(window, a, 2, i);
    window.save_file(path);
    kvcache::sliding_window_cache<Element, heads> loaded(2, 2, 3, 1, 2);
    const auto ids = loaded.load_file(path);
    REQUIRE(ids.size() == 1);
    CHECK(snapshot(loaded) == snapshot(window));
    // A window of another size is another configuration.
    kvcache::sliding_window_cache<Element, heads> other(2, 2, 4, 1, 2);
    check_fails(__LINE__, other, kvcache::error_code::format_error, {"window 3", "window 4"}, [&] { other.load_file(path); });

    kvcache::dynamic_cache<Element, heads> dynamic(2, 1, 2);
    const auto d = dynamic.add_sequence();
    append_all_layers(dynamic, d, 9, 4);
    dynamic.save_file(path);
    kvcache::static_cache<Element, heads> fixed(2, 1, 8);
    check_fails(__LINE__, fixed, kvcache::error_code::capacity_exceeded, {"9 stored positions", "capacity 8"},
                [&] { fixed.load_file(path); });
    kvcache::static_cache<Element, heads> roomy(2, 1, 9);
    CHECK(roomy.load_file(path).size() == 1);
    CHECK(snapshot(roomy) == snapshot(dynamic));
    std::remove(path.c_str());
    check_fails(__LINE__, roomy, kvcache::error_code::io_error, {"cannot open"}, [&] { roomy.load_file(path); });
}

TEST_CASE_TEMPLATE("files: bytes after the checksum are refused, the whole rest of the stream is the file", Element,
                   float, kvcache::half) {
    kvcache::paged_cache<Element, heads> source(2, 16, 4);
    append_all_layers(source, source.add_sequence(), 6, 1);
    std::ostringstream out;
    source.save(out);
    const std::string file = out.str();
    kvcache::paged_cache<Element, heads> target(2, 16, 4);
    append_all_layers(target, target.add_sequence(), 5, 3);
    using E = kvcache::error_code;
    auto load = [&](const std::string& bytes) {
        std::istringstream in(bytes);
        return target.load(in);
    };
    check_fails(__LINE__, target, E::format_error, {"3 bytes follow the checksum"}, [&] { load(file + "abc"); });
    check_fails(__LINE__, target, E::format_error, {"1 bytes follow the checksum"},
                [&] { load(file + std::string(1, '\0')); });
    // Two files back to back are not one file.
    const std::string twice = std::to_string(file.size()) + " bytes follow the checksum";
    check_fails(__LINE__, target, E::format_error, {twice.c_str()}, [&] { load(file + file); });
    // A stream positioned past other data: the file is what remains.
    std::istringstream embedded("prefix" + file);
    embedded.seekg(6);
    CHECK(target.load(embedded).size() == 1);
    std::istringstream followed("prefix" + file + "suffix");
    followed.seekg(6);
    check_fails(__LINE__, target, E::format_error, {"6 bytes follow the checksum"}, [&] { target.load(followed); });
    // A stream that cannot seek (as a pipe) is held to the same rule.
    struct forward_only : std::streambuf {
        explicit forward_only(std::string bytes) : bytes_(std::move(bytes)) {
            setg(bytes_.data(), bytes_.data(), bytes_.data() + bytes_.size());
        }
        std::string bytes_;
    };
    forward_only pipe_ok(file), pipe_long(file + "xy");
    std::istream piped_ok(&pipe_ok), piped_long(&pipe_long);
    REQUIRE(piped_ok.tellg() == std::istream::pos_type(-1));
    CHECK(target.load(piped_ok).size() == 1);
    check_fails(__LINE__, target, E::format_error, {"2 bytes follow the checksum"}, [&] { target.load(piped_long); });
}

TEST_CASE_TEMPLATE("files: configuration mismatches name the parameters and both values", Element, float,
                   kvcache::half, kvcache::bfloat16) {
    using E = kvcache::error_code;
    auto saved = [](const auto& cache) {
        std::ostringstream out;
        cache.save(out);
        return out.str();
    };
    auto loading = [](auto& cache, const std::string& bytes) {
        return [&cache, bytes] {
            std::istringstream in(bytes);
            cache.load(in);
        };
    };
    // window 16 -> ring 19 vs window 8 -> ring 11, same sinks and max_chunk.
    kvcache::sliding_window_cache<Element, heads> w16(1, 1, 16, 2, 4), w8(1, 1, 8, 2, 4);
    check_fails(__LINE__, w8, E::format_error, {"sliding_window", "window 16", "window 8", "ring 19", "ring 11"},
                loading(w8, saved(w16)));
    kvcache::sliding_window_cache<Element, heads> sinks1(1, 1, 8, 1, 4);
    check_fails(__LINE__, w8, E::format_error, {"sinks 1", "sinks 2"}, loading(w8, saved(sinks1)));
    kvcache::sliding_window_cache<Element, heads> chunk2(1, 1, 8, 2, 2);
    check_fails(__LINE__, w8, E::format_error, {"max_chunk 2", "max_chunk 4", "ring 9", "ring 11"},
                loading(w8, saved(chunk2)));
    kvcache::paged_cache<Element, heads> page8(1, 4, 8), page4(1, 4, 4);
    check_fails(__LINE__, page4, E::format_error, {"page_size 8", "page_size 4"}, loading(page4, saved(page8)));
    // Kinds by name, with the file's value and the cache's.
    kvcache::static_cache<Element, heads> contiguous(1, 2, 8);
    check_fails(__LINE__, page4, E::format_error, {"contiguous", "paged"}, loading(page4, saved(contiguous)));
    check_fails(__LINE__, contiguous, E::format_error, {"sliding_window", "contiguous"}, loading(contiguous, saved(w8)));
    using other = std::conditional_t<std::is_same_v<Element, float>, kvcache::half, float>;
    kvcache::paged_cache<other, heads> other_page4(1, 4, 4);
    const char* mine = kvcache::element_traits<Element>::name;
    const char* theirs = kvcache::element_traits<other>::name;
    check_fails(__LINE__, page4, E::format_error, {mine, theirs}, loading(page4, saved(other_page4)));
    // half and bfloat16 rows have the same size: only the recorded kind tells them apart.
    using same_size = std::conditional_t<std::is_same_v<Element, kvcache::bfloat16>, kvcache::half, kvcache::bfloat16>;
    kvcache::paged_cache<same_size, heads> same_size_page4(1, 4, 4);
    check_fails(__LINE__, page4, E::format_error, {mine, kvcache::element_traits<same_size>::name},
                loading(page4, saved(same_size_page4)));
    // Values no build knows are printed as numbers, marked unknown.
    std::string bytes = saved(page4);
    const std::uint32_t nine = 9;
    std::memcpy(&bytes[12], &nine, 4);
    check_fails(__LINE__, page4, E::format_error, {"9", "unknown", "paged"}, loading(page4, bytes));
    std::memcpy(&bytes[12], "\1\0\0\0", 4);
    std::memcpy(&bytes[16], &nine, 4);
    check_fails(__LINE__, page4, E::format_error, {"9", "unknown", mine}, loading(page4, bytes));
    // load_file names the path.
    const std::string path = "kvcache_layout_mismatch_test.bin";
    w16.save_file(path);
    check_fails(__LINE__, w8, E::format_error, {path.c_str(), "window 16", "window 8"}, [&] { w8.load_file(path); });
    std::remove(path.c_str());
}

TEST_CASE("owners take float rows into a half cache and round each to binary16 on the way in") {
    using namespace kvcache;
    using heads = head_config<4, 2, 16>;
    constexpr int row = heads::kv_heads() * heads::head_dim;
    std::vector<float> keys(3 * row), values(3 * row);
    for (int i = 0; i < 3 * row; ++i) keys[i] = 0.001f * float(i) + 1.0f / 3.0f, values[i] = -0.002f * float(i);
    auto check = [&](auto& cache) {
        const sequence_id id = cache.add_sequence();
        cache.append(id, 0, keys, values, 3);  // float rows, half storage
        std::vector<half> k(3 * row), v(3 * row);
        cache.read(id, 0, 0, 3, k, v);
        int mismatches = 0;
        for (int i = 0; i < 3 * row; ++i)
            mismatches += (k[i].bits != half(keys[i]).bits) + (v[i].bits != half(values[i]).bits);
        CHECK(mismatches == 0);
        const std::vector<float> one(row, 2.5f);
        cache.write(id, 0, 1, one, one, 1);
        cache.read(id, 0, 0, 3, k, v);
        CHECK(float(k[row]) == 2.5f);
        CHECK(k[0].bits == half(keys[0]).bits);
        const std::vector<float> short_rows(row - 1);
        CHECK_THROWS_AS(cache.write(id, 0, 0, short_rows, one, 1), kvcache::error);
    };
    paged_cache<half, heads> paged(1, 4, 4);
    contiguous_cache<half, heads> contiguous(1, 1, 8);
    check(paged);
    check(contiguous);
}
