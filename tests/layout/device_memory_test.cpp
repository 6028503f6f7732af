// The owners instantiated over device_memory, compiled by the host compiler
// with the CUDA runtime headers (the bookkeeping is the same code). Where a
// GPU is present the round trip also runs; without one only the build checks,
// and each GPU case prints "no CUDA device: <why>" (the gpu-labelled ctest entry
// runs this binary under examples/common/run_if_gpu.cmake, which counts that as
// a skip unless nvidia-smi lists a GPU the test failed to use).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cache_test_support.hpp"
#include "kvcache/cache.hpp"
#include "kvcache/core/device_memory.hpp"

static_assert(KVCACHE_HAS_CUDA_RUNTIME, "this test needs the CUDA runtime headers on the include path");

using heads = kvcache::head_config<4, 2, 8>;
template class kvcache::contiguous_cache<float, heads, kvcache::device_memory>;
template class kvcache::contiguous_cache<kvcache::half, heads, kvcache::device_memory>;
template class kvcache::paged_cache<float, heads, kvcache::device_memory>;
template class kvcache::paged_cache<kvcache::half, heads, kvcache::device_memory>;
template class kvcache::sliding_window_cache<float, heads, kvcache::device_memory>;
template class kvcache::sliding_window_cache<kvcache::half, heads, kvcache::device_memory>;

namespace {

/// Why no GPU can be used, or empty when one can.
std::string gpu_missing() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(status);
    return count > 0 ? std::string() : std::string("no CUDA device is present");
}

bool have_gpu() { return gpu_missing().empty(); }

/// Prints the skip line run_if_gpu.cmake looks for; true when the GPU part must be skipped.
bool skip_without_gpu(const char* what) {
    const std::string why = gpu_missing();
    if (why.empty()) return false;
    std::printf("no CUDA device: %s (%s was compiled, not run)\n", why.c_str(), what);
    return true;
}

/// Writes rows through a device-memory owner, reads them back, and compares
/// with the same operations on a host-memory owner via save().
template <class DeviceCache, class HostCache>
void round_trip(DeviceCache device, HostCache host) {
    const auto d = device.add_sequence();
    const auto h = host.add_sequence();
    for (int step = 0; step < 5; ++step) {
        test_support::append_all_layers(device, d, 2, step);
        test_support::append_all_layers(host, h, 2, step);
    }
    const auto f = device.fork(d);
    const auto g = host.fork(h);
    test_support::append_all_layers(device, f, 1, 9);
    test_support::append_all_layers(host, g, 1, 9);
    std::ostringstream from_device, from_host;
    device.save(from_device);
    host.save(from_host);
    CHECK(from_device.str() == from_host.str());
    const auto view = device.view(0, {d, f});
    CHECK(view.sequence_count() == 2);
}

}  // namespace

TEST_CASE("device-memory owners build, and round-trip rows where a GPU exists") {
    CHECK(kvcache::paged_cache<float, heads, kvcache::device_memory>::memory::space == kvcache::memory_space::device);
    CHECK(kvcache::is_layout_view_v<kvcache::paged_cache<float, heads, kvcache::device_memory>::view_type>);
    if (skip_without_gpu("the device-memory owners' round trip")) return;
    round_trip(kvcache::paged_cache<kvcache::half, heads, kvcache::device_memory>(2, 16, 4),
               kvcache::paged_cache<kvcache::half, heads>(2, 16, 4));
    round_trip(kvcache::static_cache<float, heads, kvcache::device_memory>(2, 4, 16),
               kvcache::static_cache<float, heads>(2, 4, 16));
    round_trip(kvcache::sliding_window_cache<float, heads, kvcache::device_memory>(2, 4, 3, 1, 2),
               kvcache::sliding_window_cache<float, heads>(2, 4, 3, 1, 2));
}

TEST_CASE("a device cache's host tier (page-locked) swaps a sequence out and back on a stream") {
    if (skip_without_gpu("the host tier over device memory")) {
        CHECK(!have_gpu());
        return;
    }
    kvcache::paged_cache<float, heads, kvcache::device_memory> device(2, 8, 4);
    kvcache::paged_cache<float, heads> host(2, 8, 4);
    device.attach_host_tier(4);
    const auto d = device.add_sequence();
    const auto h = host.add_sequence();
    test_support::append_all_layers(device, d, 7, 3);
    test_support::append_all_layers(host, h, 7, 3);
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    device.swap_out(d, stream);
    std::ostringstream swapped, expected;
    device.save(swapped);  // reads the tier, after waiting for the swap's copies
    host.save(expected);
    CHECK(swapped.str() == expected.str());
    const auto other = device.add_sequence();  // takes the freed pages
    test_support::append_all_layers(device, other, 8, 5);
    device.swap_in(d, stream);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    device.remove_sequence(other);
    std::ostringstream back;
    device.save(back);
    CHECK(back.str() == expected.str());
    cudaStreamDestroy(stream);
}

namespace {

/// Appends tokens to a sequence of a prefix-caching cache, with their ids,
/// and writes each layer's rows as test_support::token_rows gives them.
template <class Cache>
void append_token_rows(Cache& cache, kvcache::sequence_id id, const std::vector<std::int32_t>& tokens, int layers,
                       int row) {
    const int n = static_cast<int>(tokens.size());
    const int first = cache.begin_append(id, n, tokens);
    for (int l = 0; l < layers; ++l) {
        const auto keys = test_support::token_rows(tokens, first, l, false, row);
        const auto values = test_support::token_rows(tokens, first, l, true, row);
        cache.write(id, l, first, keys, values, n);
    }
}

/// Spills a prompt's cached pages to the host tier (a filler evicts them from
/// the pool), matches the prompt again, and reads the rows back. With a disk
/// directory the host tier holds one page and the other two go to page files.
template <class Cache>
void spill_and_match(const std::string& disk_directory = {}) {
    constexpr int layers = 2, page = 4, row = heads::kv_heads() * heads::head_dim;
    Cache cache(layers, 4, page, true);
    cache.attach_host_tier(disk_directory.empty() ? 4 : 1);
    if (!disk_directory.empty()) cache.attach_disk_tier(disk_directory, 4, 2);
    const auto append = [&](kvcache::sequence_id id, const std::vector<std::int32_t>& tokens) {
        append_token_rows(cache, id, tokens, layers, row);
    };
    const auto tokens_from = [](int first, int n) {
        std::vector<std::int32_t> out(n);
        for (int i = 0; i < n; ++i) out[i] = first + i;
        return out;
    };
    const auto prompt = tokens_from(500, 3 * page + 1);  // three full pages and one more token
    const auto a = cache.add_sequence();
    append(a, prompt);
    cache.remove_sequence(a);  // its three full pages stay cached in the pool
    const auto b = cache.add_sequence();
    append(b, tokens_from(900, 4 * page));  // every page: the cached ones are spilled to the host tier
    auto st = cache.statistics();
    CHECK(st.pages_spilled == 3);
    CHECK(st.host_pages_cached == (disk_directory.empty() ? 3 : 1));
    CHECK(st.pages_written_to_disk == (disk_directory.empty() ? 0 : 2));
    cache.remove_sequence(b);
    const auto c = cache.add_sequence();
    const std::vector<std::int32_t> lookup(prompt.begin(), prompt.end() - 1);
    REQUIRE(cache.match_prefix(c, lookup) == 3 * page);
    st = cache.statistics();
    CHECK(st.host_prefix_hit_pages == (disk_directory.empty() ? 3 : 1));
    CHECK(st.disk_prefix_hit_pages == (disk_directory.empty() ? 0 : 2));
    const int n = 3 * page;
    for (int l = 0; l < layers; ++l) {
        INFO("layer " << l);
        std::vector<float> keys(std::size_t(n) * row), values(keys.size());
        cache.read(c, l, 0, n, keys, values);  // from the cache's memory (device memory: copied back)
        CHECK(keys == test_support::token_rows(lookup, 0, l, false, row));
        CHECK(values == test_support::token_rows(lookup, 0, l, true, row));
    }
}

/// Spills a prompt's cached pages to the host tier from a plan on stream
/// `first` and brings them back with a match on stream `second`; then swaps
/// a sequence out on `first` and in on `second`. Each page's event orders the
/// second stream's copies after the first's; wait_second waits for `second`
/// before the rows are read back.
template <class Cache, class Wait>
void cross_streams(typename Cache::memory::stream_type first, typename Cache::memory::stream_type second,
                   Wait wait_second) {
    constexpr int layers = 2, page = 4, row = heads::kv_heads() * heads::head_dim;
    Cache cache(layers, 4, page, true);
    cache.attach_host_tier(4);
    const auto append = [&](kvcache::sequence_id id, const std::vector<std::int32_t>& tokens) {
        append_token_rows(cache, id, tokens, layers, row);
    };
    const auto check_rows = [&](kvcache::sequence_id id, const std::vector<std::int32_t>& tokens) {
        const int n = static_cast<int>(tokens.size());
        for (int l = 0; l < layers; ++l) {
            INFO("sequence " << id << ", layer " << l);
            std::vector<float> keys(std::size_t(n) * row), values(keys.size());
            cache.read(id, l, 0, n, keys, values);
            CHECK(keys == test_support::token_rows(tokens, 0, l, false, row));
            CHECK(values == test_support::token_rows(tokens, 0, l, true, row));
        }
    };
    std::vector<std::int32_t> prompt(3 * page + 1), swapped_tokens(page + 1);
    for (int i = 0; i < 3 * page + 1; ++i) prompt[std::size_t(i)] = 500 + i;
    for (int i = 0; i < page + 1; ++i) swapped_tokens[std::size_t(i)] = 800 + i;
    const auto a = cache.add_sequence();
    append(a, prompt);
    cache.remove_sequence(a);  // its three full pages stay cached in the pool
    const auto filler = cache.add_sequence();
    (void)cache.plan({filler}, {4 * page}, first);  // the whole pool: the cached pages spill, on `first`
    cache.remove_sequence(filler);
    CHECK(cache.statistics().pages_spilled == 3);
    const auto c = cache.add_sequence();
    const std::vector<std::int32_t> lookup(prompt.begin(), prompt.end() - 1);
    REQUIRE(cache.match_prefix(c, lookup, second) == 3 * page);  // returns with the copies in flight
    CHECK(cache.statistics().host_prefix_hit_pages == 3);
    wait_second();
    check_rows(c, lookup);
    cache.remove_sequence(c);
    const auto d = cache.add_sequence();
    append(d, swapped_tokens);
    cache.swap_out(d, first);
    cache.swap_in(d, second);  // reads host pages `first` may still be filling
    wait_second();
    check_rows(d, swapped_tokens);
}

}  // namespace

TEST_CASE("pages a plan spills on one stream come back on another, and a swap crosses streams too") {
    cross_streams<kvcache::paged_cache<float, heads>>(nullptr, nullptr, [] {});  // host memory, run everywhere
    if (skip_without_gpu("the host tier's events across two streams")) return;
    cudaStream_t first = nullptr, second = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking) == cudaSuccess);
    cross_streams<kvcache::paged_cache<float, heads, kvcache::device_memory>>(
        first, second, [&] { REQUIRE(cudaStreamSynchronize(second) == cudaSuccess); });
    cudaStreamDestroy(first);
    cudaStreamDestroy(second);
}

TEST_CASE("a device cache spills evicted prefix pages to its host tier and a match brings their rows back") {
    spill_and_match<kvcache::paged_cache<float, heads>>();  // the same steps in host memory, run everywhere
    if (skip_without_gpu("the prefix spill to a device cache's host tier")) return;
    spill_and_match<kvcache::paged_cache<float, heads, kvcache::device_memory>>();
}

TEST_CASE("a device cache reads spilled prefix pages back from page files, head-major, on a stream") {
    const auto directory = std::filesystem::temp_directory_path() / "kvcache_device_memory_test_disk";
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory);
    spill_and_match<kvcache::paged_cache<float, heads>>(directory.string());  // host memory, run everywhere
    if (skip_without_gpu("the prefix spill to a device cache's disk tier")) return;
    spill_and_match<kvcache::paged_cache<float, heads, kvcache::device_memory>>(directory.string());
}
