// The emulator's test bodies on a real GPU, compared with the emulator. The
// .cu half always compiles where nvcc exists; the comparison runs only where
// a device is present, and otherwise says why it was skipped.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "device_runs.hpp"
#include "kvcache/execution.hpp"
#include "kvcache/testing.hpp"
#include "test_bodies.hpp"

using namespace kvcache_test;
using kvcache::index3;

TEST_CASE("the test bodies give the emulator's results on a GPU") {
    std::string why;
    if (!gpu_available(why)) {
        MESSAGE("GPU comparison skipped: " << why);
        CHECK(!why.empty());
        return;
    }
    SUBCASE("block reductions") {
        const int blocks = 4;
        std::vector<float> input(blocks * 128);
        for (std::size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>((i * 37) % 101) * 0.25f - 7.0f;
        std::vector<float> sums(2 * blocks), maxima(blocks), gpu_sums(2 * blocks), gpu_maxima(blocks);
        kvcache::emulate<block_reduce_body>(index3{blocks, 1, 1}, 0, reduce_params{input.data(), sums.data(), maxima.data()});
        gpu_block_reduce(input, blocks, gpu_sums, gpu_maxima);
        for (int i = 0; i < 2 * blocks; ++i) CHECK(gpu_sums[i] == doctest::Approx(sums[i]).epsilon(1e-6));
        CHECK(gpu_maxima == maxima);
    }
    SUBCASE("block vote (sync_block_or)") {
        const int blocks = 4;
        std::vector<int> votes(blocks * 128), gpu(blocks * 128);
        kvcache::emulate<block_vote_body>(index3{blocks, 1, 1}, 0, vote_params{votes.data()});
        gpu_block_vote(blocks, gpu);
        CHECK(gpu == votes);
    }
    SUBCASE("warp collectives") {
        std::vector<int> out(64 * warp_ops_outputs), gpu(64 * warp_ops_outputs);
        kvcache::emulate<warp_ops_body>(index3{}, 0, warp_ops_params{out.data()});
        gpu_warp_ops(gpu);
        CHECK(gpu == out);
    }
    SUBCASE("shared memory with a barrier") {
        std::vector<float> input(128), out(128), gpu(128);
        for (int t = 0; t < 128; ++t) input[static_cast<std::size_t>(t)] = static_cast<float>(3 * t + 1);
        kvcache::emulate<neighbour_body<true>>(index3{}, 128 * sizeof(float), neighbour_params{input.data(), out.data()});
        gpu_neighbour(input, gpu);
        CHECK(gpu == out);
    }
    SUBCASE("16-byte loads and stores") {
        std::vector<unsigned char> source(16 * 32 + 16);
        for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<unsigned char>(i * 29 + 3);
        std::vector<unsigned char> floats(16 * 32), halves(16 * 32), gpu_floats(16 * 32), gpu_halves(16 * 32);
        // The host source must be 16-byte aligned for the emulator: copy into an aligned buffer.
        alignas(16) unsigned char aligned[16 * 32 + 16];
        std::memcpy(aligned, source.data(), source.size());
        alignas(16) unsigned char f[16 * 32], h[16 * 32];
        kvcache::emulate<copy16_body>(index3{}, 0, copy16_params{aligned, f, h, 0});
        floats.assign(f, f + sizeof f);
        halves.assign(h, h + sizeof h);
        gpu_copy16(source, gpu_floats, gpu_halves);
        // NaN payloads may be canonicalised differently by the two float units; the
        // byte pattern above gives none in float lanes that matter for equality of finite values.
        for (std::size_t i = 0; i < floats.size(); i += 4) {
            float a, b;
            std::memcpy(&a, &floats[i], 4);
            std::memcpy(&b, &gpu_floats[i], 4);
            if (a == a) CHECK(a == b);
        }
        for (std::size_t i = 0; i < halves.size(); i += 2) {
            const auto a = static_cast<float>(kvcache::half::from_bits(static_cast<std::uint16_t>(halves[i] | (halves[i + 1] << 8))));
            const auto b = static_cast<float>(kvcache::half::from_bits(static_cast<std::uint16_t>(gpu_halves[i] | (gpu_halves[i + 1] << 8))));
            if (a == a) CHECK(a == b);
        }
    }
    SUBCASE("3-D grid numbering") {
        std::vector<int> out(6 * 12), gpu(6 * 12);
        kvcache::emulate<grid_body>(index3{3, 2, 2}, 0, grid_params{out.data()});
        gpu_grid(3, 2, 2, gpu);
        CHECK(gpu == out);
    }
}
