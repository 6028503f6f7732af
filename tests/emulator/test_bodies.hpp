// Kernel bodies of the emulator self-tests that are also valid CUDA: the same
// source is run by the emulator (emulator_test.cpp) and compiled by nvcc into
// real kernels (device_bodies.cu).
#pragma once

#include <cstdint>

#include "kvcache/core/config.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/execution/context.hpp"

namespace kvcache_test {

using kvcache::index3;
using kvcache::vector16;
using kvcache::vector8;

/// Per-block sum and max of `input` (block_threads values per block), twice in
/// a row so the reduction's scratch reuse is exercised.
struct reduce_params {
    const float* input;
    float* sums;     // 2 per block
    float* maxima;   // 1 per block
};
struct block_reduce_body {
    static constexpr const char* name = "block_reduce";
    static constexpr int block_threads = 128;
    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const reduce_params& p) const {
        const int block = ctx.block_index().x;
        const float v = p.input[block * block_threads + ctx.thread_index()];
        const float sum = ctx.block_sum(v);
        const float sum_of_squares = ctx.block_sum(v * v);
        const float maximum = ctx.block_max(v);
        if (ctx.thread_index() == block_threads - 1) {  // every thread has the result, not just thread 0
            p.sums[2 * block] = sum;
            p.sums[2 * block + 1] = sum_of_squares;
            p.maxima[block] = maximum;
        }
    }
};

/// sync_block_or over a block: true in block b only when b is odd, where one
/// thread (b * 37 % 128) votes true; every thread writes what it got.
struct vote_params {
    int* votes;  // block_threads per block
};
struct block_vote_body {
    static constexpr const char* name = "block_vote";
    static constexpr int block_threads = 128;
    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const vote_params& p) const {
        const int block = ctx.block_index().x;
        const bool mine = block % 2 == 1 && ctx.thread_index() == block * 37 % block_threads;
        p.votes[block * block_threads + ctx.thread_index()] = ctx.sync_block_or(mine) ? 1 : 0;
    }
};

/// Every warp collective once; each thread writes warp_ops_outputs ints.
constexpr int warp_ops_outputs = 10;
struct warp_ops_params {
    int* out;  // block_threads * warp_ops_outputs
};
struct warp_ops_body {
    static constexpr const char* name = "warp_ops";
    static constexpr int block_threads = 64;
    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const warp_ops_params& p) const {
        const int t = ctx.thread_index();
        const int lane = ctx.lane();
        int* out = p.out + t * warp_ops_outputs;
        out[0] = ctx.shuffle_xor(t, 1);
        out[1] = ctx.shuffle_down(t, 3);
        out[2] = ctx.shuffle_index(t, 5);
        const double wide = ctx.shuffle_xor(1000.5 + t, 16);  // an 8-byte value
        out[3] = static_cast<int>(wide * 2.0);
        out[4] = ctx.warp_any(lane == 7) ? 1 : 0;
        out[5] = ctx.warp_all(lane < 31) ? 1 : 0;
        out[6] = static_cast<int>(ctx.warp_ballot(lane % 2 == 0));
        out[7] = static_cast<int>(ctx.warp_sum(static_cast<float>(lane)));
        out[8] = static_cast<int>(ctx.warp_max(static_cast<float>((lane * 7) % 32)));
        out[9] = ctx.warp() * 100 + ctx.warp_count() * 10 + (ctx.block_size() == block_threads ? 1 : 0);
    }
};

/// Thread t stores input[t] in shared memory and reads its neighbour's slot;
/// WithBarrier false forgets the barrier in between.
struct neighbour_params {
    const float* input;
    float* out;
};
template <bool WithBarrier>
struct neighbour_body {
    static constexpr const char* name = WithBarrier ? "neighbour" : "neighbour_missing_barrier";
    static constexpr int block_threads = 128;
    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const neighbour_params& p) const {
        auto slots = ctx.template shared_array<float>(0, block_threads);
        const int t = ctx.thread_index();
        slots[t] = p.input[t];
        if constexpr (WithBarrier) ctx.sync_block();
        p.out[t] = t > 0 ? slots[t - 1] : 0.0f;
    }
};

/// Copies 16 bytes per thread with load16 / store16, scaling the floats by 2
/// and the halves by 0.5 in between; `offset` bytes shift the source.
struct copy16_params {
    const unsigned char* source;  // 16 * block_threads (+ offset) bytes
    unsigned char* float_out;
    unsigned char* half_out;
    int offset;
};
struct copy16_body {
    static constexpr const char* name = "copy16";
    static constexpr int block_threads = 32;
    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const copy16_params& p) const {
        const int t = ctx.thread_index();
        const vector16 v = ctx.load16(p.source + p.offset + 16 * t);
        vector16 floats = v, halves = v;
        for (int i = 0; i < 4; ++i) kvcache::set_float(floats, i, 2.0f * kvcache::vector16_float(v, i));
        for (int i = 0; i < 8; ++i)
            kvcache::set_half(halves, i, kvcache::half(0.5f * static_cast<float>(kvcache::vector16_half(v, i))));
        ctx.store16(p.float_out + 16 * t, floats);
        ctx.store16(p.half_out + 16 * t, halves);
    }
};

/// Each lane loads 8 bytes from source + offset + 8 * lane (load8) and stores
/// them in reverse byte order to out + 8 * lane (store8): 8 fp8 elements' access.
struct copy8_params {
    const unsigned char* source;
    unsigned char* out;
    int offset;  ///< bytes added to source: not a multiple of 8 to provoke a fault
};
struct copy8_body {
    static constexpr const char* name = "copy8";
    static constexpr int block_threads = 32;
    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const copy8_params& p) const {
        const int t = ctx.thread_index();
        const vector8 v = ctx.load8(p.source + p.offset + 8 * t);
        vector8 reversed{};
        for (int i = 0; i < 8; ++i) kvcache::set_byte(reversed, i, kvcache::vector8_byte(v, 7 - i));
        ctx.store8(p.out + 8 * t, reversed);
    }
};

/// Writes each block's coordinates and the grid size (6 ints per block).
struct grid_params {
    int* out;
};
struct grid_body {
    static constexpr const char* name = "grid";
    static constexpr int block_threads = 32;
    template <class Context>
    KVCACHE_HOST_DEVICE void operator()(Context& ctx, const grid_params& p) const {
        const index3 b = ctx.block_index(), g = ctx.grid_size();
        const int linear = (b.z * g.y + b.y) * g.x + b.x;
        if (ctx.thread_index() == 0) {
            int* out = p.out + 6 * linear;
            out[0] = b.x; out[1] = b.y; out[2] = b.z;
            out[3] = g.x; out[4] = g.y; out[5] = g.z;
        }
    }
};

}  // namespace kvcache_test
