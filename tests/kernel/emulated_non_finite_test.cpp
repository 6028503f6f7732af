// A NaN in a K or V row reaches only the query rows that attend to it, on the
// kernel bodies (the emulated backend runs the CUDA kernels' code under the
// host SIMT emulator) as in the reference. The bodies fold a tile's values
// into every query row of a block at once, a key a row does not see with
// weight 0, and 0 x NaN is NaN: the earlier tokens of a causal prefill chunk
// and the queries whose sliding window has dropped the row would read NaN.
// This test is what fails when that leaks, for every type whose value rows
// hold their NaN in the values themselves (fp32, the 16-bit types, fp8); int8
// and int4 carry it in a row factor (int8_emulated_test, int4_emulated_test).
#include <doctest/doctest.h>

#include "kvcache/backend/emulated.hpp"
#include "support/quantised_owner_checks.hpp"

namespace {

using kvcache_test::special_rows;

/// check_every_owner with the value NaN in token 10: before a 24-token
/// window's reach from the last decode query (position 40) but inside the
/// tile that query's walk starts with, so the window's edge is exercised in
/// decode as well as the causal diagonal in prefill.
/// @tparam Element the stored element type
/// @tparam Heads a head_config
template <class Element, class Heads>
void check_nan_rows() {
    special_rows special;
    special.enabled = true;
    special.nan_value_token = 10;
    // The bodies' FP32 against the double reference on the same stored rows,
    // relative to the largest value: the bound int8_emulated_test justifies.
    kvcache_test::check_every_owner<Element, Heads>(special);
}

}  // namespace

TEST_CASE_TEMPLATE("emulated kernels: a NaN row reaches only the queries that see it (GQA 4/2, head dim 32)", Element,
                   float, kvcache::half, kvcache::bfloat16, kvcache::float8_e4m3, kvcache::float8_e5m2) {
    check_nan_rows<Element, kvcache::head_config<4, 2, 32>>();
}

TEST_CASE_TEMPLATE("emulated kernels: a NaN row reaches only the queries that see it (MQA 3/1, head dim 16)", Element,
                   float, kvcache::half) {
    check_nan_rows<Element, kvcache::head_config<3, 1, 16>>();
}
