// int4 caches (qint4: packed 4-bit codes, then a half scale and minimum per
// group of 32 values) on the emulated backend, i.e. the CUDA kernel bodies
// under the host SIMT emulator: append writes every row as core's quantise_row
// does (bit for bit with the reference backend's append, which calls it; a
// short last group at head_dim 40 and 56, signed zeros, NaN rows), and decode,
// prefill, their lse and scores match the double-precision reference on the
// same int4 cache, in every layout, for GQA, MHA and MQA, under two schedules.
#include <doctest/doctest.h>

#include "kvcache/backend/emulated.hpp"
#include "kvcache/backend/reference.hpp"
#include "support/backend_suite.hpp"
#include "support/quantised_owner_checks.hpp"
#include "support/score_checks.hpp"

using namespace kvcache;
using kvcache_test::check_every_owner;
using kvcache_test::special_rows;

// Tolerances (quantised_bounds' defaults), relative to the largest |value|
// appended (outputs are convex combinations of the dequantised values). Both
// sides read the same codes and group records: the reference forms
// minimum + code * scale in double, the bodies in float with one fmaf
// (relative error <= 2^-24 of the value) and then take FP32 dot products and
// softmax sums of at most head_dim (128) products and a few tens of weights,
// which stay within ~1e-6 of double relative to their magnitude (logits O(1),
// |outputs| <= the largest value); 1e-5 holds with margin. A code read from
// the wrong nibble or a value dequantised with another group's record moves it
// by up to 15 steps (about the group's whole range), and an output by 1e-2 or
// more. Log-sum-exp: 1e-5 relative; scores (sums of at most group softmax
// weights, each <= 1): 1e-5 absolute.

TEST_CASE("int4 caches on the emulated kernels: GQA 4/2, head dim 32 (one group)") {
    check_every_owner<qint4, head_config<4, 2, 32>>();
}

TEST_CASE("int4 caches on the emulated kernels: MHA 2/2, head dim 40 (a short last group of 8)") {
    check_every_owner<qint4, head_config<2, 2, 40>>();
}

TEST_CASE("int4 caches on the emulated kernels: MQA 3/1, head dim 128 (four groups)") {
    check_every_owner<qint4, head_config<3, 1, 128>>();
}

TEST_CASE("int4 caches on the emulated kernels: signed zero rows and NaN rows as the reference reads them") {
    special_rows special{true};
    special.signed_zeros = true;
    check_every_owner<qint4, head_config<4, 2, 40>>(special);
}

TEST_CASE("int4 caches on the emulated kernels: the kernel suite's contexts (splits, soft cap, windows, explicit positions)") {
    // The shared harness (tests/kernel/support): caches filled by the reference's append (quantise_row),
    // every context of standard_cases(), the queries' type's tolerance (float 2e-5, half 1e-3 absolute,
    // for outputs within [-1, 1]), append compared bit for bit, group records included; scores
    // 1e-6 + 1e-4 relative.
    using namespace kvcache_test;
    const emulated_backend backend;
    check_attention<contiguous_factory, qint4, suite_gqa, float>(backend, "emulated");
    check_attention<paged_factory, qint4, suite_mqa, half>(backend, "emulated");
    check_attention<sliding_window_factory, qint4, suite_mha, float>(backend, "emulated");
    check_attention<paged_factory, qint4, dynamic_heads<32>, bfloat16>(backend, "emulated", dynamic_heads<32>{9, 1});
    check_append<contiguous_factory, qint4, suite_mqa, half>(backend, "emulated");
    check_append<paged_factory, qint4, suite_gqa, float>(backend, "emulated");
    check_append<sliding_window_factory, qint4, head_config<5, 1, 56>, float>(backend, "emulated");
    check_append<paged_factory, qint4, dynamic_heads<32>, bfloat16>(backend, "emulated", dynamic_heads<32>{6, 2});
    check_scores<paged_factory, qint4, suite_gqa, float>(backend, "emulated");
    check_scores<sliding_window_factory, qint4, suite_mqa, half>(backend, "emulated");
}
