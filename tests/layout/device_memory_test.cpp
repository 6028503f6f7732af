// The owners instantiated over device_memory, compiled by the host compiler
// with the CUDA runtime headers (the bookkeeping is the same code). Where a
// GPU is present the round trip also runs; without one only the build checks.
#include <doctest/doctest.h>

#include <sstream>
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

bool have_gpu() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
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
    if (!have_gpu()) {
        MESSAGE("no GPU: device-memory owners were compiled, not run");
        return;
    }
    round_trip(kvcache::paged_cache<kvcache::half, heads, kvcache::device_memory>(2, 16, 4),
               kvcache::paged_cache<kvcache::half, heads>(2, 16, 4));
    round_trip(kvcache::static_cache<float, heads, kvcache::device_memory>(2, 4, 16),
               kvcache::static_cache<float, heads>(2, 4, 16));
    round_trip(kvcache::sliding_window_cache<float, heads, kvcache::device_memory>(2, 4, 3, 1, 2),
               kvcache::sliding_window_cache<float, heads>(2, 4, 3, 1, 2));
}

TEST_CASE("a device cache's host tier (page-locked) swaps a sequence out and back on a stream") {
    if (!have_gpu()) {
        MESSAGE("no GPU: the host tier over device memory was compiled, not run");
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
