// Self-tests of the host SIMT emulator: collectives give known results, a
// forgotten barrier is exposed by the schedules, and every fault a GPU would
// punish is reported naming kernel, block and thread.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcache/execution.hpp"
#include "kvcache/testing.hpp"
#include "test_bodies.hpp"

using namespace kvcache_test;
using kvcache::emulate;
using kvcache::emulator_options;
using kvcache::emulator_schedule;
using kvcache::error_code;
using kvcache::index3;


TEST_CASE("block_sum and block_max give every thread the block's result") {
    const int blocks = 3;
    std::vector<float> input(blocks * block_reduce_body::block_threads);
    for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < block_reduce_body::block_threads; ++t)
            input[static_cast<std::size_t>(b * 128 + t)] = static_cast<float>((t * 37) % 128 + b);  // a permutation of b..b+127
    kvcache::for_each_schedule([&](const emulator_options& options) {
        CAPTURE(kvcache::to_string(options.schedule));
        std::vector<float> sums(2 * blocks, -1.0f), maxima(blocks, -1.0f);
        emulate<block_reduce_body>(index3{blocks, 1, 1}, 0, reduce_params{input.data(), sums.data(), maxima.data()},
                                   options);
        for (int b = 0; b < blocks; ++b) {
            // sum of b..b+127 = 128 b + 8128; sum of squares by the closed form, all exact in float
            double squares = 0;
            for (int k = b; k < b + 128; ++k) squares += double(k) * k;
            CHECK(sums[2 * b] == doctest::Approx(128.0 * b + 8128.0));
            CHECK(sums[2 * b + 1] == doctest::Approx(squares));
            CHECK(maxima[b] == static_cast<float>(b + 127));
        }
    });
}

TEST_CASE("sync_block_or tells every thread whether any thread's predicate was true") {
    const int blocks = 4;
    kvcache::for_each_schedule([&](const emulator_options& options) {
        CAPTURE(kvcache::to_string(options.schedule));
        std::vector<int> votes(blocks * block_vote_body::block_threads, -1);
        emulate<block_vote_body>(index3{blocks, 1, 1}, 0, vote_params{votes.data()}, options);
        for (int b = 0; b < blocks; ++b)
            for (int t = 0; t < block_vote_body::block_threads; ++t)
                CHECK(votes[std::size_t(b * block_vote_body::block_threads + t)] == b % 2);  // one thread of odd blocks votes
    });
}

TEST_CASE("warp shuffles, votes and warp reductions give CUDA's results") {
    kvcache::for_each_schedule([&](const emulator_options& options) {
        CAPTURE(kvcache::to_string(options.schedule));
        std::vector<int> out(64 * warp_ops_outputs, -1);
        emulate<warp_ops_body>(index3{1, 1, 1}, 0, warp_ops_params{out.data()}, options);
        for (int t = 0; t < 64; ++t) {
            CAPTURE(t);
            const int lane = t % 32, warp = t / 32;
            const int* o = &out[static_cast<std::size_t>(t * warp_ops_outputs)];
            CHECK(o[0] == (t ^ 1));
            CHECK(o[1] == (lane + 3 < 32 ? t + 3 : t));
            CHECK(o[2] == warp * 32 + 5);
            CHECK(o[3] == 2001 + 2 * (t ^ 16));
            CHECK(o[4] == 1);
            CHECK(o[5] == 0);
            CHECK(static_cast<unsigned>(o[6]) == 0x55555555u);
            CHECK(o[7] == 496);
            CHECK(o[8] == 31);
            CHECK(o[9] == warp * 100 + 21);
        }
    });
}

TEST_CASE("a missing barrier is exposed by the reverse and shuffled schedules") {
    std::vector<float> input(128);
    for (int t = 0; t < 128; ++t) input[static_cast<std::size_t>(t)] = static_cast<float>(t + 1);
    const auto run = [&](auto body, const emulator_schedule& schedule) {
        std::vector<float> out(128, -1.0f);
        emulator_options options;
        options.schedule = schedule;
        emulate<decltype(body)>(index3{}, 128 * sizeof(float), neighbour_params{input.data(), out.data()}, options);
        return out;
    };
    const auto correct = [&](const std::vector<float>& out) {
        for (int t = 1; t < 128; ++t)
            if (out[static_cast<std::size_t>(t)] != static_cast<float>(t)) return false;
        return out[0] == 0.0f;
    };
    SUBCASE("with the barrier every schedule is right") {
        for (const auto& schedule : kvcache::standard_schedules()) {
            CAPTURE(kvcache::to_string(schedule));
            CHECK(correct(run(neighbour_body<true>{}, schedule)));
        }
    }
    SUBCASE("without it, in-order hides the bug and the other schedules show it") {
        CHECK(correct(run(neighbour_body<false>{}, emulator_schedule::in_order())));
        CHECK_FALSE(correct(run(neighbour_body<false>{}, emulator_schedule::reverse())));
        CHECK_FALSE(correct(run(neighbour_body<false>{}, emulator_schedule::shuffled(1))));
        CHECK_FALSE(correct(run(neighbour_body<false>{}, emulator_schedule::shuffled(2))));
    }
    SUBCASE("a shuffled schedule is deterministic per seed") {
        // Compared bit for bit: slots read before they were written hold NaN.
        const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
            return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        const auto first = run(neighbour_body<false>{}, emulator_schedule::shuffled(7));
        CHECK(same(run(neighbour_body<false>{}, emulator_schedule::shuffled(7)), first));
        CHECK_FALSE(same(run(neighbour_body<false>{}, emulator_schedule::shuffled(8)), first));
    }
}

TEST_CASE("load8 and store8 move 8 bytes in memory order") {
    alignas(8) unsigned char source[8 * 32], out[8 * 32];
    for (int i = 0; i < 8 * 32; ++i) source[i] = static_cast<unsigned char>(3 * i + 1);
    kvcache::for_each_schedule([&](const emulator_options& options) {
        std::memset(out, 0, sizeof out);
        emulate<copy8_body>(index3{}, 0, copy8_params{source, out, 0}, options);
        for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < 8; ++i) CHECK(out[8 * lane + i] == source[8 * lane + 7 - i]);
    }, {emulator_schedule::in_order(), emulator_schedule::shuffled(3)});
}

TEST_CASE("load16 and store16 move 16 bytes as 4 floats or 8 halves") {
    alignas(16) unsigned char source[16 * 32 + 16];
    for (int i = 0; i < 32 * 4; ++i) {
        const float f = static_cast<float>(i) - 20.0f;
        std::memcpy(source + 4 * i, &f, 4);
    }
    alignas(16) unsigned char floats[16 * 32], halves[16 * 32];
    kvcache::for_each_schedule([&](const emulator_options& options) {
        emulate<copy16_body>(index3{}, 0, copy16_params{source, floats, halves, 0}, options);
        for (int i = 0; i < 32 * 4; ++i) {
            float f;
            std::memcpy(&f, floats + 4 * i, 4);
            CHECK(f == 2.0f * (static_cast<float>(i) - 20.0f));
        }
        for (int i = 0; i < 32 * 8; ++i) {
            std::uint16_t in_bits, out_bits;
            std::memcpy(&in_bits, source + 2 * i, 2);
            std::memcpy(&out_bits, halves + 2 * i, 2);
            const float in = static_cast<float>(kvcache::half::from_bits(in_bits));
            CHECK(kvcache::same_bits(kvcache::half::from_bits(out_bits), kvcache::half(0.5f * in)));
        }
    }, {emulator_schedule::in_order(), emulator_schedule::shuffled(3)});
}

TEST_CASE("a 3-D grid visits every block once with CUDA's numbering") {
    const index3 grid{3, 2, 2};
    std::vector<int> out(6 * 12, -1);
    kvcache::for_each_schedule([&](const emulator_options& options) {
        emulate<grid_body>(grid, 0, grid_params{out.data()}, options);
        for (int z = 0; z < 2; ++z)
            for (int y = 0; y < 2; ++y)
                for (int x = 0; x < 3; ++x) {
                    const int* o = &out[static_cast<std::size_t>(6 * ((z * 2 + y) * 3 + x))];
                    CHECK(o[0] == x);
                    CHECK(o[1] == y);
                    CHECK(o[2] == z);
                    CHECK(o[3] == 3);
                    CHECK(o[4] == 2);
                    CHECK(o[5] == 2);
                }
    }, {emulator_schedule::in_order(), emulator_schedule::shuffled(4)});
}

TEST_CASE("several worker threads give the same results as one") {
    const int blocks = 9;
    std::vector<float> input(blocks * 128);
    for (std::size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>(i % 97);
    std::vector<float> sums1(2 * blocks), max1(blocks), sums2(2 * blocks), max2(blocks);
    emulator_options options;
    emulate<block_reduce_body>(index3{blocks, 1, 1}, 0, reduce_params{input.data(), sums1.data(), max1.data()}, options);
    options.worker_threads = 2;
    options.schedule = emulator_schedule::shuffled(5);
    emulate<block_reduce_body>(index3{blocks, 1, 1}, 0, reduce_params{input.data(), sums2.data(), max2.data()}, options);
    CHECK(sums1 == sums2);
    CHECK(max1 == max2);
    CHECK(max1[0] == 96.0f);
}
