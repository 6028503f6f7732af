// What the K/V pair kernel tests (CPU and emulated) share: check_owner
// (quantised_owner_checks.hpp) on the three owners of a kv_elements cache,
// whose keys and values are read, scaled and widened each as its own type.
// The shapes: GQA 8/2 at head_dim 64 (the CPU's int4 nibble-order path on
// AVX2 and AVX-512), MHA 4/4 at head_dim 40 (int4's short last group), and a
// group of 16 at head_dim 32 (the CPU decode's widened tiles, past two row blocks).
#pragma once

#include <string>

#include "kvcache/core/kv_elements.hpp"
#include "quantised_owner_checks.hpp"

namespace kvcache_test {

using pair_gqa = kvcache::head_config<8, 2, 64>;
using pair_mha = kvcache::head_config<4, 4, 40>;
using pair_wide_group = kvcache::head_config<32, 2, 32>;

/// check_owner of backend on a kv_elements cache in every layout, with the
/// zero rows and the NaN key and value rows of special_rows when asked (the
/// NaN value sits in token 10, inside a 24-token window's first tile from
/// the last decode query, so a window's edge is crossed as well as prefill's
/// causal diagonal).
/// @tparam Pair a kv_elements pair
/// @tparam Heads a head_config
/// @tparam Backend a backend with append, decode and prefill
template <class Pair, class Heads, class Backend>
void check_pair_owners(const Backend& backend, bool special_rows_too) {
    using owners = storage_owners<Pair, Heads>;
    special_rows special;
    special.enabled = special_rows_too;
    special.nan_value_token = 10;
    // The kernels' own rounding against the double reference on the same
    // stored rows, relative to the largest value, as for every stored type (1e-5).
    const quantised_bounds bounds{};
    const std::string name = kvcache::element_name<Pair>();
    check_owner<Heads>(backend, owners::contiguous, special, bounds, name + " contiguous");
    check_owner<Heads>(backend, owners::paged, special, bounds, name + " paged");
    check_owner<Heads>(backend, owners::window, special, bounds, name + " sliding_window");
}

}  // namespace kvcache_test
