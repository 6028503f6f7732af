// int8 caches (qint8: a float scale after each row's values) on the emulated
// backend, i.e. the CUDA kernel bodies under the host SIMT emulator: append
// writes every row as core's quantise_row does (compared bit for bit with the
// reference backend's append, which calls quantise_row), and decode, prefill,
// their lse and scores match the double-precision reference on the same int8
// cache, in every layout, for GQA, MHA and MQA, under two schedules; rows of
// zeros and rows holding a NaN behave as the reference says.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcache/backend/emulated.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/policy/key_norms.hpp"
#include "support/backend_suite.hpp"
#include "support/score_checks.hpp"
#include "support/quantised_owner_checks.hpp"
#include "support/storage_owners.hpp"

using namespace kvcache;

namespace {

using kvcache_test::random_rows;
using kvcache_test::special_rows;

// Tolerances (kvcache_test::quantised_bounds' defaults), relative to the
// largest |value| appended (outputs are convex combinations of the dequantised
// values). Both sides read the same int8 rows and the same scales: the
// reference widens and scales in double, the bodies take the FP32 dot product
// of the integers with the pre-scaled query and multiply it by the key's
// scale, and fold the value's scale into the FP32 softmax weight. FP32 sums of
// at most head_dim products and a few tens of weights stay within ~1e-6 of
// double relative to their magnitude (logits here are O(1), |outputs| <= the
// largest value), so 1e-5 holds with margin; one row read with the wrong
// scale, or a scale applied twice, moves an output by 1e-2 or more.
// Log-sum-exp: 1e-5 relative; scores (sums of at most group softmax weights,
// each <= 1): 1e-5 absolute.
template <class Heads>
void check_every_owner(const special_rows& special = {}) {
    kvcache_test::check_every_owner<qint8, Heads>(special);
}

}  // namespace

TEST_CASE("int8 caches on the emulated kernels: GQA 4/2, head dim 32") { check_every_owner<head_config<4, 2, 32>>(); }

TEST_CASE("int8 caches on the emulated kernels: MHA 2/2, head dim 16") { check_every_owner<head_config<2, 2, 16>>(); }

TEST_CASE("int8 caches on the emulated kernels: MQA 3/1, head dim 264 (two pieces of a row per lane in append)") {
    check_every_owner<head_config<3, 1, 264>>();
}

TEST_CASE("int8 caches on the emulated kernels: zero rows and NaN rows as the reference reads them") {
    check_every_owner<head_config<4, 2, 32>>(special_rows{true});
}

TEST_CASE("int8 caches on the emulated kernels: the kernel suite's contexts (splits, soft cap, windows, explicit positions)") {
    // The shared harness (tests/kernel/support): caches filled by the reference's append (quantise_row),
    // every context of standard_cases(), the queries' type's tolerance (float 2e-5, half 1e-3 absolute,
    // for outputs within [-1, 1]), append compared bit for bit, scale included; scores 1e-6 + 1e-4 relative.
    using namespace kvcache_test;
    const emulated_backend backend;
    check_attention<contiguous_factory, qint8, suite_gqa, float>(backend, "emulated");
    check_attention<paged_factory, qint8, suite_mqa, half>(backend, "emulated");
    check_attention<sliding_window_factory, qint8, suite_mha, float>(backend, "emulated");
    check_attention<paged_factory, qint8, dynamic_heads<32>, bfloat16>(backend, "emulated", dynamic_heads<32>{9, 1});
    check_append<contiguous_factory, qint8, suite_mqa, half>(backend, "emulated");
    check_append<paged_factory, qint8, suite_gqa, float>(backend, "emulated");
    check_append<sliding_window_factory, qint8, head_config<5, 1, 56>, float>(backend, "emulated");
    check_append<paged_factory, qint8, dynamic_heads<32>, bfloat16>(backend, "emulated", dynamic_heads<32>{6, 2});
    check_scores<paged_factory, qint8, suite_gqa, float>(backend, "emulated");
    check_scores<sliding_window_factory, qint8, suite_mqa, half>(backend, "emulated");
}

TEST_CASE("int8 key norms apply each row's scale") {
    using heads = head_config<2, 1, 16>;
    constexpr int dim = heads::head_dim, stored = dim + 4;
    paged_cache<qint8, heads> cache(1, 8, 4);
    const sequence_id id = cache.add_sequence();
    const int tokens = 6;
    const auto keys = random_rows(std::size_t(tokens) * dim, 41), values = random_rows(std::size_t(tokens) * dim, 42);
    cache.append(id, 0, keys, values, tokens);
    std::vector<qint8> k(std::size_t(tokens) * stored), v(k.size());
    cache.read(id, 0, 0, tokens, span<qint8>(k), span<qint8>(v));
    auto plan = cache.plan({id});
    std::vector<float> norms(8);
    key_norms(plan.view(0), span<float>(norms), 8);
    for (int t = 0; t < tokens; ++t) {
        float scale;
        std::memcpy(&scale, k.data() + std::size_t(t) * stored + dim, sizeof scale);
        double sum = 0;
        for (int d = 0; d < dim; ++d) {
            const double x = double(k[std::size_t(t) * stored + d].bits) * scale;
            sum += x * x;
        }
        CHECK(norms[t] == doctest::Approx(std::sqrt(sum)).epsilon(1e-6));
    }
    CHECK(norms[tokens] == 0.0f);
}
