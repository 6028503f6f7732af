// K/V pairs (keys and values in two types) on the kernel bodies under the
// SIMT emulator, in order and under a shuffled schedule, against the
// reference on the same cache: the append body writes each side as its type
// asks (int8 and int4 rows a warp each, the others 8 values a thread, bytes
// equal to the reference's), and the attention tile reads each side with its
// own loads and row factors (int8 key scales on the logits, int4 value NaN
// rows through their factor, fp16 value NaN rows through the tile's vote).
#include <doctest/doctest.h>

#include "kvcache/backend/emulated.hpp"
#include "support/backend_suite.hpp"
#include "support/kv_pair_checks.hpp"
#include "support/layout_factories.hpp"
#include "support/score_checks.hpp"

using namespace kvcache;
using kvcache_test::check_pair_owners;

namespace {

template <class Pair, class Heads>
void check_both_schedules(bool special_rows_too) {
    const emulator_options in_order{}, shuffled{emulator_schedule::shuffled(23)};
    for (const emulator_options& options : {in_order, shuffled}) {
        CAPTURE(to_string(options.schedule));
        check_pair_owners<Pair, Heads>(emulated_backend(options), special_rows_too);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("emulated: K/V pairs against the reference, GQA 8/2 at head_dim 64, NaN rows included", Pair,
                   kv_elements<half, qint4>, kv_elements<qint8, qint4>, kv_elements<qint4, half>,
                   kv_elements<float8_e4m3, qint8>, kv_elements<bfloat16, float>) {
    check_both_schedules<Pair, kvcache_test::pair_gqa>(true);
}

TEST_CASE("emulated: an int8+int4 pair with int4's short last group (MHA 4/4, head_dim 40)") {
    check_both_schedules<kv_elements<qint8, qint4>, kvcache_test::pair_mha>(true);
}

TEST_CASE("emulated: K/V pairs through the kernel suite's contexts (splits, soft cap, windows, explicit positions)") {
    // The shared harness (tests/kernel/support): caches filled by the reference's append, every context
    // of standard_cases(), the queries' type's tolerance (float 2e-5, half 1e-3 absolute, for outputs
    // within [-1, 1]), append compared row for row with the reference's, each side's bytes; scores
    // 1e-6 + 1e-4 relative.
    using namespace kvcache_test;
    const emulated_backend backend;
    check_attention<paged_factory, kv_elements<half, qint4>, suite_gqa, half>(backend, "emulated");
    check_attention<contiguous_factory, kv_elements<qint8, qint4>, dynamic_heads<32>, half>(backend, "emulated",
                                                                                         dynamic_heads<32>{9, 1});
    check_attention<sliding_window_factory, kv_elements<float, qint8>, suite_mqa, float>(backend, "emulated");
    check_append<paged_factory, kv_elements<half, qint4>, suite_gqa, half>(backend, "emulated");
    check_append<contiguous_factory, kv_elements<qint8, qint4>, dynamic_heads<32>, half>(backend, "emulated",
                                                                                      dynamic_heads<32>{6, 2});
    check_append<sliding_window_factory, kv_elements<qint4, bfloat16>, head_config<5, 1, 56>, float>(backend, "emulated");
    check_scores<paged_factory, kv_elements<half, qint8>, suite_gqa, float>(backend, "emulated");
    check_scores<sliding_window_factory, kv_elements<qint8, qint4>, suite_mqa, half>(backend, "emulated");
}
