// A NaN in a K or V row reaches only the query rows that attend to it, on the
// CPU backend as in the reference: the earlier tokens of a causal prefill
// chunk, the queries for which a sliding window has dropped the row, and the
// other sequences of the batch stay finite and equal to the reference. The
// kernels fold a tile's values into a whole block of rows at once, a key a
// row does not see with weight 0, and 0 x NaN is NaN; this test is what
// fails when that leaks. Every layout, the float, 16-bit and row-quantised
// types (int8's NaN scale, int4's NaN group records), GQA with the int4
// nibble-order path (head_dim 64) and a short int4 group (head_dim 40).
// Built portable, AVX2 and -march=native, as the other CPU kernel tests.
#include <doctest/doctest.h>

#include <string>

#include "kvcache/backend/cpu.hpp"
#include "support/quantised_owner_checks.hpp"

namespace {

using kvcache_test::check_owner;
using kvcache_test::special_rows;

/// check_owner on the CPU backend for the three owners: the value NaN sits
/// in token 10, before a 24-token window's reach from the last decode query
/// (position 40) but inside its first tile, so decode's window edge is
/// exercised as well as prefill's causal diagonal.
/// @tparam Element the stored element type
/// @tparam Heads a head_config
template <class Element, class Heads>
void check_owners_on_cpu() {
    using owners = kvcache_test::storage_owners<Element, Heads>;
    special_rows special;
    special.enabled = true;
    special.nan_value_token = 10;
    // The kernel's own rounding against the double reference on the same
    // stored rows, relative to the largest value: as int8_cpu_test (1e-5).
    const kvcache_test::quantised_bounds bounds{};
    const kvcache::cpu_backend cpu;
    check_owner<Heads>(cpu, owners::contiguous, special, bounds, "contiguous");
    check_owner<Heads>(cpu, owners::paged, special, bounds, "paged");
    check_owner<Heads>(cpu, owners::window, special, bounds, "sliding_window");
}

using gqa = kvcache::head_config<8, 2, 64>;

}  // namespace

TEST_CASE_TEMPLATE("CPU: a NaN row reaches only the queries that see it", Element, float, kvcache::half,
                   kvcache::qint8, kvcache::qint4) {
    check_owners_on_cpu<Element, gqa>();
}

TEST_CASE("CPU: a NaN row of an int4 cache with a short last group reaches only the queries that see it") {
    check_owners_on_cpu<kvcache::qint4, kvcache::head_config<4, 4, 40>>();
}
