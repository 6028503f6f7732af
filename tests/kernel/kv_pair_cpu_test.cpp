// K/V pairs (keys and values in two types) on the CPU backend against the
// reference on the same cache: append byte for byte with the reference's,
// decode with lse and scores, causal prefill, NaN rows reaching only the
// queries that see them. Each side takes its own type's path: int4 keys
// score in nibble order while fp16 values fold widened, int8 keys' scales
// multiply the logits while int4 values' groups dequantise, and so on.
// Built portable, AVX2 and -march=native, as the other CPU kernel tests.
#include <doctest/doctest.h>

#include "kvcache/backend/cpu.hpp"
#include "support/backend_suite.hpp"
#include "support/kv_pair_checks.hpp"
#include "support/layout_factories.hpp"
#include "support/score_checks.hpp"

using namespace kvcache;
using kvcache_test::check_pair_owners;

TEST_CASE_TEMPLATE("CPU: K/V pairs against the reference, GQA 8/2 at head_dim 64, NaN rows included", Pair,
                   kv_elements<half, qint4>, kv_elements<qint8, qint4>, kv_elements<qint4, half>,
                   kv_elements<float8_e4m3, qint8>, kv_elements<bfloat16, float>, kv_elements<float, qint4>) {
    check_pair_owners<Pair, kvcache_test::pair_gqa>(cpu_backend{}, true);
}

TEST_CASE_TEMPLATE("CPU: K/V pairs with int4's short last group (MHA 4/4, head_dim 40)", Pair, kv_elements<half, qint4>,
                   kv_elements<qint8, qint4>) {
    check_pair_owners<Pair, kvcache_test::pair_mha>(cpu_backend{}, true);
}

TEST_CASE_TEMPLATE("CPU: K/V pairs in a group of 16, whose decode widens 16-bit and fp8 sides once per tile", Pair,
                   kv_elements<half, qint8>, kv_elements<qint4, bfloat16>, kv_elements<float8_e5m2, half>) {
    check_pair_owners<Pair, kvcache_test::pair_wide_group>(cpu_backend{}, false);
}

TEST_CASE("CPU: K/V pairs through the kernel suite's contexts (splits, soft cap, windows, explicit positions)") {
    using namespace kvcache_test;
    const cpu_backend backend;
    check_attention<paged_factory, kv_elements<half, qint4>, suite_gqa, half>(backend, "cpu");
    check_attention<contiguous_factory, kv_elements<qint8, qint4>, dynamic_heads<32>, float>(backend, "cpu",
                                                                                          dynamic_heads<32>{9, 1});
    check_attention<sliding_window_factory, kv_elements<float, qint8>, suite_mqa, float>(backend, "cpu");
    check_attention<scatter_factory, kv_elements<qint4, half>, suite_gqa, float>(backend, "cpu");
    check_append<paged_factory, kv_elements<half, qint4>, suite_gqa, half>(backend, "cpu");
    check_append<sliding_window_factory, kv_elements<qint4, bfloat16>, head_config<5, 1, 56>, float>(backend, "cpu");
    check_scores<paged_factory, kv_elements<half, qint8>, suite_gqa, float>(backend, "cpu");
    check_scores<contiguous_factory, kv_elements<qint8, qint4>, suite_mqa, half>(backend, "cpu");
}
