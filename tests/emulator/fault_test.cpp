// Each fault a GPU would punish, caught by the emulator and named with kernel,
// block and thread; and the emulator stays usable afterwards.
#include <doctest/doctest.h>

#include <atomic>
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

namespace {

template <class Function>
std::string fault_message(Function&& f) {
    try {
        f();
    } catch (const kvcache::error& e) {
        CHECK(e.code() == error_code::kernel_fault);
        return e.what();
    }
    FAIL("expected a kernel_fault");
    return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct no_params {};

/// Counts live instances, to prove that fibers abandoned by a fault are unwound. Atomic because
/// with worker_threads > 1 blocks on two OS threads make and drop guards at the same time.
std::atomic<int> live_guards{0};
struct guard {
    std::vector<int> payload = std::vector<int>(16, 1);  // heap memory LeakSanitizer would report
    guard() { ++live_guards; }
    ~guard() { --live_guards; }
};

struct divergent_barrier_body {
    static constexpr const char* name = "divergent_barrier";
    static constexpr int block_threads = 64;
    template <class Context>
    void operator()(Context& ctx, const no_params&) const {
        guard g;
        if (ctx.thread_index() < 48)  // warp 1 splits between the barrier and a warp reduction
            ctx.sync_block();
        else
            (void)ctx.warp_sum(1.0f);
    }
};

struct mixed_block_collectives_body {
    static constexpr const char* name = "mixed_block_collectives";
    static constexpr int block_threads = 64;
    template <class Context>
    void operator()(Context& ctx, const no_params&) const {
        if (ctx.thread_index() < 40)
            ctx.sync_block();
        else
            (void)ctx.block_sum(1.0f);
    }
};

struct early_exit_body {
    static constexpr const char* name = "early_exit";
    static constexpr int block_threads = 96;
    template <class Context>
    void operator()(Context& ctx, const no_params&) const {
        guard g;
        if (ctx.block_index().x == 1 && ctx.thread_index() == 70) return;
        ctx.sync_block();
    }
};

struct missing_lane_body {
    static constexpr const char* name = "missing_lane";
    static constexpr int block_threads = 64;
    template <class Context>
    void operator()(Context& ctx, const no_params&) const {
        guard g;
        if (ctx.thread_index() == 35) return;
        (void)ctx.shuffle_xor(ctx.thread_index(), 1);
    }
};

struct divergent_warp_body {
    static constexpr const char* name = "divergent_warp";
    static constexpr int block_threads = 32;
    template <class Context>
    void operator()(Context& ctx, const no_params&) const {
        if (ctx.lane() < 16)
            (void)ctx.warp_sum(1.0f);
        else
            (void)ctx.shuffle_down(1.0f, 1);
    }
};

struct shared_params {
    std::size_t offset;
    std::size_t count;
    int index;
};
struct shared_body {
    static constexpr const char* name = "shared";
    static constexpr int block_threads = 32;
    template <class Context>
    void operator()(Context& ctx, const shared_params& p) const {
        auto a = ctx.template shared_array<float>(p.offset, p.count);
        if (ctx.thread_index() == 9) a[static_cast<std::size_t>(p.index)] = 1.0f;
    }
};

struct throwing_body {
    static constexpr const char* name = "throwing";
    static constexpr int block_threads = 64;
    template <class Context>
    void operator()(Context& ctx, const no_params&) const {
        guard g;
        ctx.sync_block();
        if (ctx.thread_index() == 40) throw std::out_of_range("position 99 is past length 10");
        ctx.sync_block();
    }
};

struct too_large_body {
    static constexpr const char* name = "too_large";
    static constexpr int block_threads = 2048;
    template <class Context>
    void operator()(Context&, const no_params&) const {}
};

struct ragged_body {
    static constexpr const char* name = "ragged";
    static constexpr int block_threads = 48;
    template <class Context>
    void operator()(Context&, const no_params&) const {}
};

/// The schedules the fault tests run under.
const std::vector<emulator_schedule> schedules = {emulator_schedule::in_order(), emulator_schedule::reverse(),
                                                  emulator_schedule::shuffled(11)};

}  // namespace

TEST_CASE("a barrier reached by part of the block while the rest waits at a warp collective") {
    kvcache::for_each_schedule([](const emulator_options& options) {
        const std::string message = fault_message([&] { emulate<divergent_barrier_body>(index3{}, 0, no_params{}, options); });
        CHECK(contains(message, "kernel divergent_barrier, block (0,0,0), thread "));
        CHECK(contains(message, "divergent barrier: waits at sync_block while thread 48 waits at warp_sum"));
        CHECK(live_guards == 0);
    }, schedules);
}

TEST_CASE("sync_block and block_sum reached by different threads") {
    kvcache::for_each_schedule([](const emulator_options& options) {
        const std::string message =
            fault_message([&] { emulate<mixed_block_collectives_body>(index3{}, 0, no_params{}, options); });
        CHECK(contains(message, "kernel mixed_block_collectives"));
        CHECK(contains(message, "divergent barrier: calls "));
    }, schedules);
}

TEST_CASE("a thread exiting while others wait at a barrier") {
    kvcache::for_each_schedule([](const emulator_options& options) {
        const std::string message = fault_message([&] { emulate<early_exit_body>(index3{2, 1, 1}, 0, no_params{}, options); });
        CHECK(contains(message, "kernel early_exit, block (1,0,0), thread 70 (warp 2, lane 6): exited while thread "));
        CHECK(contains(message, " waits at sync_block"));
        CHECK(live_guards == 0);
    }, schedules);
}

TEST_CASE("a shuffle with a lane missing") {
    kvcache::for_each_schedule([](const emulator_options& options) {
        const std::string message = fault_message([&] { emulate<missing_lane_body>(index3{}, 0, no_params{}, options); });
        CHECK(contains(message, "kernel missing_lane, block (0,0,0), thread "));
        CHECK(contains(message, "shuffle_xor with lanes missing: lane 3 (thread 35) has exited"));
        CHECK(live_guards == 0);
    }, schedules);
}

TEST_CASE("lanes of one warp in different warp collectives") {
    kvcache::for_each_schedule([](const emulator_options& options) {
        const std::string message = fault_message([&] { emulate<divergent_warp_body>(index3{}, 0, no_params{}, options); });
        CHECK(contains(message, "kernel divergent_warp"));
        CHECK(contains(message, "divergent warp: calls "));
    }, schedules);
}

TEST_CASE("shared memory outside the launch size") {
    kvcache::for_each_schedule([](const emulator_options& options) {
        const auto run = [&](shared_params p) { emulate<shared_body>(index3{}, 64, p, options); };
        std::string message = fault_message([&] { run(shared_params{32, 9, 0}); });
        CHECK(contains(message, "kernel shared, block (0,0,0), thread "));
        CHECK(contains(message, "shared_array of 9 x 4 bytes at byte offset 32 exceeds the 64 shared bytes"));
        message = fault_message([&] { run(shared_params{0, 16, 16}); });
        CHECK(contains(message, "thread 9 (warp 0, lane 9): shared_array index 16 is outside its 16 elements"));
        message = fault_message([&] { run(shared_params{0, 16, -1}); });
        CHECK(contains(message, "shared_array index -1 is outside"));
        message = fault_message([&] { run(shared_params{2, 4, 0}); });
        CHECK(contains(message, "byte offset 2 is not aligned to 4"));
        CHECK_NOTHROW(run(shared_params{0, 16, 15}));
    }, schedules);
}

TEST_CASE("a misaligned 16-byte access") {
    alignas(16) unsigned char source[16 * 33] = {};
    alignas(16) unsigned char out[16 * 32], out2[16 * 32];
    kvcache::for_each_schedule([&](const emulator_options& options) {
        const std::string message =
            fault_message([&] { emulate<copy16_body>(index3{}, 0, copy16_params{source, out, out2, 4}, options); });
        CHECK(contains(message, "kernel copy16, block (0,0,0), thread "));
        CHECK(contains(message, "load16 at address 0x"));
        CHECK(contains(message, "is not 16-byte aligned (off by 4)"));
        CHECK_NOTHROW(emulate<copy16_body>(index3{}, 0, copy16_params{source, out, out2, 16}, options));
    }, schedules);
}

TEST_CASE("a misaligned 8-byte access") {
    alignas(8) unsigned char source[8 * 33] = {};
    alignas(8) unsigned char out[8 * 32];
    kvcache::for_each_schedule([&](const emulator_options& options) {
        const std::string message =
            fault_message([&] { emulate<copy8_body>(index3{}, 0, copy8_params{source, out, 4}, options); });
        CHECK(contains(message, "kernel copy8, block (0,0,0), thread "));
        CHECK(contains(message, "load8 at address 0x"));
        CHECK(contains(message, "is not 8-byte aligned (off by 4)"));
        CHECK_NOTHROW(emulate<copy8_body>(index3{}, 0, copy8_params{source, out, 8}, options));
    }, schedules);
}

struct nested_body {
    static constexpr const char* name = "nested";
    static constexpr int block_threads = 32;
    template <class Context>
    void operator()(Context&, const no_params&) const {
        emulate<shared_body>(index3{}, 64, shared_params{0, 1, 0});
    }
};

TEST_CASE("emulate called from inside a kernel body is refused") {
    CHECK_THROWS_WITH_AS(emulate<nested_body>(index3{}, 0, no_params{}),
                         "kvcache: invalid_argument: emulate called from inside an emulated kernel body",
                         kvcache::error);
    CHECK_NOTHROW(emulate<shared_body>(index3{}, 64, shared_params{0, 1, 0}));
}

TEST_CASE("launches no GPU accepts") {
    CHECK(contains(fault_message([] { emulate<too_large_body>(index3{}, 0, no_params{}); }),
                   "kernel too_large: block_threads 2048 must be a positive multiple of 32 no larger than 1024"));
    CHECK(contains(fault_message([] { emulate<ragged_body>(index3{}, 0, no_params{}); }),
                   "kernel ragged: block_threads 48"));
    CHECK(contains(fault_message([] { emulate<shared_body>(index3{}, 227 * 1024 + 4, shared_params{0, 1, 0}); }),
                   "kernel shared: dynamic shared memory of 232452 bytes exceeds the limit of 232448 bytes"));
    emulator_options small;
    small.shared_memory_limit = 48 * 1024;
    CHECK(contains(fault_message([&] { emulate<shared_body>(index3{}, 48 * 1024 + 4, shared_params{0, 1, 0}, small); }),
                   "exceeds the limit of 49152 bytes"));
    CHECK_NOTHROW(emulate<shared_body>(index3{}, 227 * 1024, shared_params{0, 1, 0}));
}

TEST_CASE("an exception thrown by a kernel body reaches the caller unchanged") {
    kvcache::for_each_schedule([](const emulator_options& options) {
        CHECK_THROWS_WITH_AS(emulate<throwing_body>(index3{3, 1, 1}, 0, no_params{}, options),
                             "position 99 is past length 10", std::out_of_range);
        CHECK(live_guards == 0);
    }, schedules);
}

TEST_CASE("the emulator is reusable after every kind of fault") {
    std::vector<float> input(128, 1.0f), sums(2), maxima(1);
    for (int round = 0; round < 3; ++round) {
        CHECK_THROWS_AS(emulate<divergent_barrier_body>(index3{}, 0, no_params{}), kvcache::error);
        CHECK_THROWS_AS(emulate<early_exit_body>(index3{2, 1, 1}, 0, no_params{}), kvcache::error);
        CHECK_THROWS_AS(emulate<missing_lane_body>(index3{}, 0, no_params{}), kvcache::error);
        CHECK_THROWS_AS(emulate<throwing_body>(index3{}, 0, no_params{}), std::out_of_range);
        emulate<block_reduce_body>(index3{}, 0, reduce_params{input.data(), sums.data(), maxima.data()});
        CHECK(sums[0] == 128.0f);
        CHECK(maxima[0] == 1.0f);
    }
    CHECK(live_guards == 0);
}

TEST_CASE("with several worker threads the first failing block in schedule order is reported") {
    emulator_options options;
    options.worker_threads = 2;
    const std::string message = fault_message([&] { emulate<early_exit_body>(index3{6, 1, 1}, 0, no_params{}, options); });
    CHECK(contains(message, "block (1,0,0), thread 70"));
    CHECK(live_guards == 0);
}

namespace {

/// Needs about 128 KiB of stack per thread: more than the default 64 KiB.
struct deep_stack_body {
    static constexpr const char* name = "deep_stack";
    static constexpr int block_threads = 32;
    template <class Context>
    void operator()(Context& ctx, const shared_params& p) const {
        volatile unsigned char scratch[128 * 1024];
        for (std::size_t i = 0; i < sizeof scratch; i += 4096) scratch[i] = static_cast<unsigned char>(i >> 12);
        ctx.sync_block();
        unsigned sum = 0;
        for (std::size_t i = 0; i < sizeof scratch; i += 4096) sum += scratch[i];
        auto out = ctx.template shared_array<unsigned>(0, block_threads);
        out[static_cast<std::size_t>(ctx.thread_index())] = sum;
        if (sum != 496u) throw std::logic_error("stack contents lost across a barrier");
        (void)p;
    }
};

}  // namespace

TEST_CASE("emulator_options: a larger stack for a body that needs it, and bad options rejected") {
    emulator_options options;
    options.stack_bytes = 256 * 1024;
    kvcache::for_each_schedule([](const emulator_options& o) {
        CHECK_NOTHROW(emulate<deep_stack_body>(index3{2, 1, 1}, 32 * sizeof(unsigned), shared_params{}, o));
    }, schedules, options);

    emulator_options tiny;
    tiny.stack_bytes = 1024;
    CHECK_THROWS_WITH_AS(emulate<shared_body>(index3{}, 64, shared_params{0, 1, 0}, tiny),
                         "kvcache: invalid_argument: emulator stack_bytes 1024 is below the minimum of 16384",
                         kvcache::error);
    emulator_options no_workers;
    no_workers.worker_threads = 0;
    CHECK_THROWS_AS(emulate<shared_body>(index3{}, 64, shared_params{0, 1, 0}, no_workers), kvcache::error);
    CHECK(contains(fault_message([] { emulate<shared_body>(index3{0, 1, 1}, 64, shared_params{0, 1, 0}); }),
                   "kernel shared: grid (0,1,1) must be at least 1 in each dimension"));
}
