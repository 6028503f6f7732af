// Measures the emulator's cost: thread-barriers per second (one thread
// passing one sync_block), warp-shuffle lane-ops per second and the fixed
// cost of an emulated launch. Prints figures; asserts nothing.
//   usage: kvcache_emulator_cost [repetitions]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kvcache/execution.hpp"
#include "kvcache/testing.hpp"

namespace {

struct cost_params {
    int iterations;
    float* out;
};

template <int Threads>
struct barrier_loop_body {
    static constexpr const char* name = "barrier_loop";
    static constexpr int block_threads = Threads;
    template <class Context>
    void operator()(Context& ctx, const cost_params& p) const {
        auto slots = ctx.template shared_array<float>(0, block_threads);
        float value = static_cast<float>(ctx.thread_index());
        for (int i = 0; i < p.iterations; ++i) {
            slots[ctx.thread_index()] = value;
            ctx.sync_block();
            value += slots[(ctx.thread_index() + 1) % block_threads];
        }
        if (ctx.thread_index() == 0) p.out[ctx.block_index().x] = value;
    }
};

template <int Threads>
struct shuffle_loop_body {
    static constexpr const char* name = "shuffle_loop";
    static constexpr int block_threads = Threads;
    template <class Context>
    void operator()(Context& ctx, const cost_params& p) const {
        float value = static_cast<float>(ctx.thread_index());
        for (int i = 0; i < p.iterations; ++i) value += ctx.shuffle_xor(value, 1 + i % 31);
        if (ctx.thread_index() == 0) p.out[ctx.block_index().x] = value;
    }
};

struct empty_body {
    static constexpr const char* name = "empty";
    static constexpr int block_threads = 128;
    template <class Context>
    void operator()(Context&, const cost_params&) const {}
};

template <class Function>
double seconds(Function&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class Body>
void measure(const char* what, int blocks, int iterations, int repetitions, const kvcache::emulator_options& options) {
    std::vector<float> out(static_cast<std::size_t>(blocks));
    const cost_params params{iterations, out.data()};
    kvcache::emulate<Body>(kvcache::index3{blocks, 1, 1}, Body::block_threads * sizeof(float), params, options);  // warm-up
    double best = 1e30;
    for (int r = 0; r < repetitions; ++r)
        best = std::min(best, seconds([&] {
            kvcache::emulate<Body>(kvcache::index3{blocks, 1, 1}, Body::block_threads * sizeof(float), params, options);
        }));
    const double events = double(blocks) * Body::block_threads * iterations;
    std::printf("%-13s %-11s threads=%4d blocks=%3d iterations=%4d workers=%d: %7.2f ms, %6.1f M thread-%s/s\n", what,
                kvcache::to_string(options.schedule).c_str(), Body::block_threads, blocks, iterations,
                options.worker_threads, best * 1e3, events / best / 1e6, what);
}

}  // namespace

int main(int argc, char** argv) {
    const int repetitions = argc > 1 ? std::atoi(argv[1]) : 5;
#if KVCACHE_EMULATOR_ASM_SWITCH
    std::printf("context switch: hand-written x86-64\n");
#else
    std::printf("context switch: ucontext\n");
#endif
    for (const auto& schedule : {kvcache::emulator_schedule::in_order(), kvcache::emulator_schedule::shuffled(1)}) {
        kvcache::emulator_options options;
        options.schedule = schedule;
        measure<barrier_loop_body<128>>("barriers", 16, 100, repetitions, options);
        measure<barrier_loop_body<1024>>("barriers", 4, 50, repetitions, options);
        measure<shuffle_loop_body<128>>("shuffles", 16, 100, repetitions, options);
    }
    kvcache::emulator_options two;
    two.worker_threads = 2;
    measure<barrier_loop_body<128>>("barriers", 16, 100, repetitions, two);

    std::vector<float> out(1);
    const int launches = 2000;
    const double t = seconds([&] {
        for (int i = 0; i < launches; ++i) kvcache::emulate<empty_body>(kvcache::index3{}, 0, cost_params{0, out.data()});
    });
    std::printf("launch overhead: one block of 128 empty threads: %.1f us per emulate call\n", t / launches * 1e6);
    return 0;
}
