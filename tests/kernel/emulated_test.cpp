// The kernel bodies under the SIMT emulator against the reference: every
// layout x {fp32, fp16} (bf16 and fp8 e4m3 / e5m2 on a subset) x {MHA, GQA group 4, MQA} x {decode, prefill, append}
// x {short, crossing pages and the window, long enough to split}, under two
// thread schedules (in order and a seeded shuffle; the shuffle reorders
// threads between barriers, so a missing barrier changes the answer).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "kvcache/backend/emulated.hpp"
#include "support/backend_suite.hpp"

using namespace kvcache;
using namespace kvcache_test;

namespace {

using mha = head_config<4, 4, 32>;
using gqa = head_config<8, 2, 32>;

/// Runs body(backend) once per schedule: in order, and a seeded shuffle.
template <class Body>
void for_schedules(Body&& body) {
    for (const emulator_schedule& schedule : {emulator_schedule::in_order(), emulator_schedule::shuffled(0x5eed)}) {
        emulator_options options;
        options.schedule = schedule;
        options.worker_threads = 2;
        INFO("schedule " << to_string(schedule));
        body(emulated_backend{options});
    }
}

template <class Factory, class Element>
void check_all_heads() {
    for_schedules([](const emulated_backend& backend) { check_layout<Factory, Element>(backend, "emulated"); });
}

}  // namespace

TEST_CASE("emulated kernels match the reference: contiguous") {
    check_all_heads<contiguous_factory, float>();
    check_all_heads<contiguous_factory, half>();
}
TEST_CASE("emulated kernels match the reference: paged") {
    check_all_heads<paged_factory, float>();
    check_all_heads<paged_factory, half>();
}
TEST_CASE("emulated kernels match the reference: sliding window") {
    check_all_heads<sliding_window_factory, float>();
    check_all_heads<sliding_window_factory, half>();
}
TEST_CASE("emulated kernels match the reference: scatter (irregular runs, visibility-only window)") {
    check_all_heads<scatter_factory, float>();
    check_all_heads<scatter_factory, half>();
}

TEST_CASE("emulated kernels: odd group sizes, head dim 56, a 128-dim model head, mixed precision") {
    for_schedules([](const emulated_backend& backend) { check_odd_shapes(backend, "emulated"); });
}

TEST_CASE("emulated kernels: merge, split counts, empty sequences, cascade attention over plans, window mask") {
    for_schedules([](const emulated_backend& backend) {
        check_merge(backend, "emulated");
        check_empty_sequences(backend, "emulated");
        check_cascade<half>(backend, "emulated");
        check_window_mask(backend, "emulated");
    });
    check_split_counts(emulated_backend{}, "emulated");
    check_cascade<float>(emulated_backend{}, "emulated");
}

TEST_CASE("emulated kernels: bfloat16 caches (one schedule: the kernels are fp16's but for the conversions)") {
    check_bfloat16(emulated_backend{}, "emulated");
}

TEST_CASE("emulated kernels: fp8 e4m3 caches with scales (one schedule: fp16's kernels but for the conversions)") {
    check_fp8<float8_e4m3>(emulated_backend{}, "emulated");
}
TEST_CASE("emulated kernels: fp8 e5m2 caches with scales") {
    check_fp8<float8_e5m2>(emulated_backend{}, "emulated");
}

TEST_CASE("emulated kernels: head counts given at run time (dynamic head_config)") {
    for_schedules([](const emulated_backend& backend) { check_dynamic_heads(backend, "emulated"); });
}
