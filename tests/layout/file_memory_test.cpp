// Loading hostile cache files: a load may only take memory the file's bytes
// justify (docs/layouts.md states the multiples checked here). Heap use is
// measured by replacing the global operator new of this test executable;
// cache storage (aligned_alloc, outside operator new) through bytes_reserved().
#include <doctest/doctest.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>

#include "cache_test_support.hpp"
#include "kvcache/cache.hpp"

namespace {

std::atomic<std::size_t> live_bytes{0}, peak_bytes{0};
constexpr std::size_t header_bytes = alignof(std::max_align_t);

void* counted_new(std::size_t n) {
    void* base = std::malloc(n + header_bytes);
    if (base == nullptr) throw std::bad_alloc();
    *static_cast<std::size_t*>(base) = n;
    const std::size_t now = live_bytes.fetch_add(n) + n;
    std::size_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
    return static_cast<char*>(base) + header_bytes;
}

void counted_delete(void* p) noexcept {
    if (p == nullptr) return;
    void* base = static_cast<char*>(p) - header_bytes;
    live_bytes.fetch_sub(*static_cast<std::size_t*>(base));
    std::free(base);
}

/// Heap bytes allocated beyond what was live when the scope began, at the peak.
class peak_scope {
public:
    peak_scope() : start_(live_bytes.load()) { peak_bytes.store(start_); }
    std::size_t extra() const { return peak_bytes.load() - start_; }

private:
    std::size_t start_;
};

}  // namespace

void* operator new(std::size_t n) { return counted_new(n); }
void* operator new[](std::size_t n) { return counted_new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    try {
        return counted_new(n);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](std::size_t n, const std::nothrow_t& tag) noexcept { return operator new(n, tag); }
void operator delete(void* p) noexcept { counted_delete(p); }
void operator delete[](void* p) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_delete(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_delete(p); }

namespace {

using heads = kvcache::head_config<4, 2, 8>;
using test_support::file_builder;
constexpr std::uint32_t contiguous = 0, paged = 1, sliding = 2, fp32 = 0;

/// Loads bytes into cache, expecting `code` with every needle in the message;
/// returns the peak heap bytes the load took beyond what was live before.
template <class Cache>
std::size_t failing_load(Cache& cache, const std::string& bytes, kvcache::error_code code,
                         std::initializer_list<const char*> needles) {
    std::istringstream in(bytes);
    const std::string before = test_support::snapshot(cache);
    const std::size_t reserved = cache.bytes_reserved();
    bool thrown = false;
    std::size_t extra = 0;
    {
        peak_scope scope;
        try {
            cache.load(in);
        } catch (const kvcache::error& e) {
            extra = scope.extra();
            thrown = true;
            INFO(std::string(e.what()));
            CHECK(e.code() == code);
            for (const char* needle : needles) CHECK(std::string(e.what()).find(needle) != std::string::npos);
        }
        if (!thrown) extra = scope.extra();
    }
    CHECK(thrown);
    CHECK(cache.bytes_reserved() == reserved);
    CHECK(test_support::snapshot(cache) == before);
    return extra;
}

/// A file of `count` empty records for a cache of `layers` layers and `heads`.
std::string empty_records(std::uint32_t layout, int layers, int p0, int p1, int p2, std::uint32_t count) {
    file_builder f(layout, fp32, heads::query_heads(), heads::kv_heads(), heads::head_dim, layers, p0, p1, p2, count);
    for (std::uint32_t i = 0; i < count; ++i) f.empty_record();
    return f.finish();
}

}  // namespace

TEST_CASE("the counting allocator sees allocations") {
    peak_scope scope;
    {
        std::vector<char> block(1 << 20);
        CHECK(block.size() == std::size_t(1) << 20);
    }
    CHECK(scope.extra() >= std::size_t(1) << 20);
    CHECK(scope.extra() < std::size_t(1) << 21);
}

TEST_CASE("many empty records into a 32-layer cache: refused within 1.25x the file, before the checksum too") {
    const int layers = 32;
    const std::uint32_t count = 100000;
    const std::string file = empty_records(contiguous, layers, 0, 0, 0, count);  // 1.2 MB
    kvcache::static_cache<float, heads> cache(layers, 2, 4);
    const auto a = cache.add_sequence();
    test_support::append_all_layers(cache, a, 3, 1);
    const std::size_t refused = failing_load(cache, file, kvcache::error_code::capacity_exceeded,
                                             {"100000 sequences", "1 are free"});
    MESSAGE("100000 empty records (", file.size(), " bytes), refused for slots: peak ", refused, " bytes, ",
            double(refused) / file.size(), "x the file");
    CHECK(refused <= file.size() * 5 / 4);
    // A corrupt copy never gets past the checksum, so nothing of its size is kept.
    std::string corrupt = file;
    corrupt[file.size() / 2] ^= 0x01;
    const std::size_t rejected = failing_load(cache, corrupt, kvcache::error_code::format_error, {"checksum"});
    MESSAGE("the same file with one flipped bit: peak ", rejected, " bytes");
    CHECK(rejected <= 256 * 1024);
}

TEST_CASE("many empty records into a 32-layer paged cache: the load takes at most 16x the file") {
    const int layers = 32;
    const std::uint32_t count = 100000;
    const std::string file = empty_records(paged, layers, 4, 0, 0, count);
    kvcache::paged_cache<float, heads> cache(layers, 4, 4);
    std::istringstream in(file);
    std::size_t extra = 0;
    std::vector<kvcache::sequence_id> ids;
    {
        peak_scope scope;
        ids = cache.load(in);
        extra = scope.extra();
    }
    CHECK(ids.size() == count);
    CHECK(cache.sequence_count() == count);
    MESSAGE("100000 empty records (", file.size(), " bytes) loaded into a paged cache: peak ", extra, " bytes, ",
            double(extra) / file.size(), "x the file (the sequences' own bookkeeping included)");
    CHECK(extra <= 16 * file.size());
}

TEST_CASE("many empty records and one long one: a dynamic cache grows at most by 16x the file") {
    const int longest = 2000;
    file_builder f(contiguous, fp32, heads::query_heads(), heads::kv_heads(), heads::head_dim, 1, 0, 0, 0, 601);
    for (int i = 0; i < 600; ++i) f.empty_record();
    f.record(longest, test_support::iota(longest));
    const std::string file = f.finish();  // ~270 KB
    kvcache::dynamic_cache<float, heads> cache(1, 1, 16);
    const std::size_t before = cache.bytes_reserved();
    // Accepting it would reserve 601 slots x 2000 positions (~150 MB).
    const std::size_t extra = failing_load(cache, file, kvcache::error_code::capacity_exceeded,
                                           {"601 sequences", "longest 2000", "16 x"});
    CHECK(cache.bytes_reserved() <= before + 16 * file.size());
    MESSAGE("600 empty + 1 of 2000 (", file.size(), " bytes) into a dynamic cache: refused, peak heap ", extra,
            " bytes, ", double(extra) / file.size(), "x the file");
    CHECK(extra <= file.size() * 5 / 4);

    // A file whose rows justify the growth loads, and grows the cache by no more.
    file_builder g(contiguous, fp32, heads::query_heads(), heads::kv_heads(), heads::head_dim, 1, 0, 0, 0, 4);
    for (int n : {100, 200, 300, 400}) g.record(n, test_support::iota(n));
    const std::string fair = g.finish();
    std::istringstream in(fair);
    const auto ids = cache.load(in);
    REQUIRE(ids.size() == 4);
    CHECK(cache.length(ids[3]) == 400);
    CHECK(cache.bytes_reserved() <= before + 16 * fair.size());
    MESSAGE("4 sequences of 100..400 (", fair.size(), " bytes): reservation ", before, " -> ",
            cache.bytes_reserved(), " bytes");
}

TEST_CASE("a small file may still take a dynamic cache one doubling further") {
    // One short sequence into a full cache of long slots: the new slot costs far
    // more than 16x the file, but no more than the reservation already made.
    kvcache::dynamic_cache<float, heads> cache(1, 1, 4096);
    const auto a = cache.add_sequence();
    test_support::append_all_layers(cache, a, 1, 1);
    std::stringstream file;
    cache.save(file, {a});
    const std::size_t before = cache.bytes_reserved();
    REQUIRE(before > 16 * file.str().size());
    const auto ids = cache.load(file);
    REQUIRE(ids.size() == 1);
    CHECK(cache.slot_count() == 2);
    CHECK(cache.bytes_reserved() == 2 * before);
}

TEST_CASE("a header claiming huge counts with few bytes is refused before allocating") {
    kvcache::paged_cache<float, heads> cache(1, 8, 4);
    const auto a = cache.add_sequence();
    test_support::append_all_layers(cache, a, 5, 1);
    auto header = [](std::uint32_t sequences) {
        return file_builder(paged, fp32, heads::query_heads(), heads::kv_heads(), heads::head_dim, 1, 4, 0, 0, sequences);
    };
    using E = kvcache::error_code;
    {
        const std::string file = header(0xffffffffu).finish();
        CHECK(failing_load(cache, file, E::format_error, {"truncated", "4294967295 sequences"}) <= 64 * 1024);
    }
    {  // length and present positions at INT_MAX, and no rows behind them
        auto f = header(1);
        f.put<std::int32_t>(INT_MAX);
        f.put<std::int32_t>(INT_MAX);
        f.put<std::int32_t>(0);  // one position: the record is no shorter than an empty one
        const std::string file = f.finish();
        CHECK(failing_load(cache, file, E::format_error, {"truncated", "2147483647 present positions"}) <= 64 * 1024);
    }
    {  // INT_MAX token ids behind an empty record of length INT_MAX
        auto f = header(1);
        f.put<std::int32_t>(INT_MAX);
        f.put<std::int32_t>(0);
        f.put<std::int32_t>(INT_MAX);
        const std::string file = f.finish();
        CHECK(failing_load(cache, file, E::format_error, {"truncated", "2147483647 token ids"}) <= 64 * 1024);
    }
}

TEST_CASE("lengths near INT_MAX") {
    // A sliding window keeps only sinks + ring positions, so a record of
    // length INT_MAX - 1 is small and valid.
    const int length = INT_MAX - 1;
    kvcache::sliding_window_cache<float, heads> window(1, 1, 4, 1, 1);  // ring 4
    file_builder f(sliding, fp32, heads::query_heads(), heads::kv_heads(), heads::head_dim, 1, 1, 4, 4, 1);
    f.record(length, {0, length - 4, length - 3, length - 2, length - 1});
    std::istringstream in(f.finish());
    const auto ids = window.load(in);
    REQUIRE(ids.size() == 1);
    CHECK(window.length(ids[0]) == length);
    CHECK(window.begin_append(ids[0], 1) == length);
    CHECK_THROWS_AS(window.begin_append(ids[0], 1), kvcache::error);  // INT_MAX + 1 overflows

    // A contiguous record of INT_MAX present positions cannot be in 200 bytes.
    kvcache::dynamic_cache<float, heads> dynamic(1, 1, 16);
    file_builder g(contiguous, fp32, heads::query_heads(), heads::kv_heads(), heads::head_dim, 1, 0, 0, 0, 1);
    g.put<std::int32_t>(INT_MAX);
    g.put<std::int32_t>(INT_MAX);
    for (int i = 0; i < 40; ++i) g.put<std::int32_t>(i);
    CHECK(failing_load(dynamic, g.finish(), kvcache::error_code::format_error,
                       {"truncated", "2147483647 present positions"}) <= 64 * 1024);
}
