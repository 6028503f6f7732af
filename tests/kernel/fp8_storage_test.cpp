// fp8 K/V storage (e4m3, e5m2) with per-layer scales, in every owner, on
// the CPU and emulated backends: each backend's kernels against the reference
// on the same (dequantised) cache, and against the reference on the original
// float rows; the scales' checks, and save/load recording them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/emulated.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "support/storage_owners.hpp"

using namespace kvcache;

namespace {

using kvcache_test::largest;
using kvcache_test::largest_difference;
using kvcache_test::random_rows;
template <class Element, class Heads>
using owners = kvcache_test::storage_owners<Element, Heads>;

/// One owner of fp8 Element next to a float owner of the same layout: the
/// same float rows appended (the fp8 cache's by the backend's append kernel,
/// so its narrowing is tested too), then decode and prefill of the fp8 cache
/// on the backend against (a) the reference on the fp8 cache itself and (b)
/// the reference on the float cache.
template <class Element, class Heads, class Backend, class MakeCache, class MakeFloatCache>
void check_owner(const Backend& backend, MakeCache make, MakeFloatCache make_float, kv_scales scales,
                 double format_bound) {
    constexpr int dim = Heads::head_dim;
    const int kv = Heads{}.kv_heads(), qh = Heads{}.query_heads();
    auto cache = make();
    auto reference_cache = make_float();
    for (int l = 0; l < cache.layers(); ++l) cache.set_scales(l, scales);
    const std::vector<int> lengths = {41, 29};
    std::vector<sequence_id> batch, float_batch;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        batch.push_back(cache.add_sequence());
        float_batch.push_back(reference_cache.add_sequence());
    }
    // Rows about N(0, 1) with outliers; divided by the scales they are stored
    // far from 1 (a backend that forgot a scale would be off by that factor).
    const int total = lengths[0] + lengths[1];
    const std::size_t row = std::size_t(kv) * dim;
    const int layer = 1;
    const std::vector<float> keys = random_rows(std::size_t(total) * row, 11);
    const std::vector<float> values = random_rows(std::size_t(total) * row, 12);
    auto plan = cache.plan(batch, lengths);
    auto float_plan = reference_cache.plan(float_batch, lengths);
    for (int l = 0; l < cache.layers(); ++l) {
        backend.append(append_params(plan.view(l), span<const float>(keys), span<const float>(values),
                                           plan.new_token_offsets()));
        reference_backend{}.append(append_params(float_plan.view(l), span<const float>(keys),
                                                 span<const float>(values), float_plan.new_token_offsets()));
    }
    // The stored bytes are the rows divided by the scale, rounded: the first key reads back within e4m3's step.
    const Element* stored = plan.view(layer).key(0, 0, 0);
    CHECK(to_float(stored[0]) * scales.key == doctest::Approx(keys[0]).epsilon(format_bound));

    const auto queries = random_rows(std::size_t(total) * qh * dim, 13);
    const std::vector<float> decode_queries(queries.begin(), queries.begin() + std::ptrdiff_t(lengths.size()) * qh * dim);
    const float value_range = largest(values);
    {  // decode
        std::vector<float> out(decode_queries.size()), on_cache(out.size()), on_floats(out.size());
        std::vector<float> lse(lengths.size() * qh), lse_on_cache(lse.size());
        decode_params p(plan.view(layer), span<const float>(decode_queries), span<float>(out));
        p.lse = lse;
        backend.decode(p);
        decode_params r(plan.view(layer), span<const float>(decode_queries), span<float>(on_cache));
        r.lse = lse_on_cache;
        reference_backend{}.decode(r);
        reference_backend{}.decode(decode_params(float_plan.view(layer), span<const float>(decode_queries),
                                                 span<float>(on_floats)));
        const double kernel_error = largest_difference(out, on_cache), format_error = largest_difference(out, on_floats);
        // Float accumulation against double over the same dequantised rows.
        CHECK(kernel_error <= 1e-5 * value_range);
        CHECK(format_error <= format_bound * value_range);
        for (std::size_t i = 0; i < lse.size(); ++i) CHECK(lse[i] == doctest::Approx(lse_on_cache[i]).epsilon(1e-5));
        MESSAGE(std::string(element_traits<Element>::name), " decode: kernel error ", kernel_error / value_range,
                ", format error ", format_error / value_range, " (of the largest |value|)");
    }
    {  // prefill: every appended token queries the cache
        std::vector<float> out(queries.size()), on_cache(out.size()), on_floats(out.size());
        backend.prefill(prefill_params(plan.view(layer), span<const float>(queries), plan.new_token_offsets(),
                                             span<float>(out)));
        reference_backend{}.prefill(prefill_params(plan.view(layer), span<const float>(queries),
                                                   plan.new_token_offsets(), span<float>(on_cache)));
        reference_backend{}.prefill(prefill_params(float_plan.view(layer), span<const float>(queries),
                                                   float_plan.new_token_offsets(), span<float>(on_floats)));
        const double kernel_error = largest_difference(out, on_cache), format_error = largest_difference(out, on_floats);
        CHECK(kernel_error <= 1e-5 * value_range);
        CHECK(format_error <= format_bound * value_range);
        MESSAGE(std::string(element_traits<Element>::name), " prefill: kernel error ", kernel_error / value_range,
                ", format error ", format_error / value_range);
    }
}

// The format bound, relative to the largest |value|: a value rounds by at
// most 2^-(mantissa bits + 1) of itself (e4m3 1/16, e5m2 1/8), which bounds
// the output's error from V by that fraction of the largest value; the keys'
// rounding moves each logit by about that fraction of |q||k|/sqrt(d) (about
// one here), so the weights by about as much again. Twice the step holds on
// these rows (measured: at most 0.035 for e4m3, 0.062 for e5m2; the test
// prints them); a quarter of it would not. The scales keep the largest row
// (about 16) inside the format's range: saturation is not measured here.
constexpr double e4m3_bound = 2.0 / 16.0;
constexpr double e5m2_bound = 2.0 / 8.0;

template <class Element, class Heads, class Backend = cpu_backend>
void check_every_owner(kv_scales scales, double bound, const Backend& backend = {}) {
    using fp8 = owners<Element, Heads>;
    using fp32 = owners<float, Heads>;
    check_owner<Element, Heads>(backend, fp8::contiguous, fp32::contiguous, scales, bound);
    check_owner<Element, Heads>(backend, fp8::paged, fp32::paged, scales, bound);
    check_owner<Element, Heads>(backend, fp8::window, fp32::window, scales, bound);
}

}  // namespace

TEST_CASE("fp8 e4m3 caches with scales: CPU kernels match the reference on the stored rows and stay near the floats") {
    // head_dim 32 takes the AVX-512 build's 16-lane loads, 24 the 8-lane ones.
    check_every_owner<float8_e4m3, head_config<4, 2, 32>>({0.05f, 0.04f}, e4m3_bound);
    check_every_owner<float8_e4m3, head_config<3, 1, 24>>({0.5f, 3.0f}, e4m3_bound);
}

TEST_CASE("fp8 e5m2 caches with scales: CPU kernels match the reference on the stored rows and stay near the floats") {
    check_every_owner<float8_e5m2, head_config<4, 2, 32>>({0.05f, 0.02f}, e5m2_bound);
    check_every_owner<float8_e5m2, head_config<2, 2, 8>>({2.0f, 0.25f}, e5m2_bound);
}

TEST_CASE("fp8 caches with scales: the emulated (CUDA) kernels match the reference on the stored rows and stay near the floats") {
    // The same bounds as the CPU's: the kernels read the same bytes exactly and accumulate in fp32.
    check_every_owner<float8_e4m3, head_config<4, 2, 32>>({0.05f, 0.04f}, e4m3_bound, emulated_backend{});
    check_every_owner<float8_e5m2, head_config<2, 2, 8>>({2.0f, 0.25f}, e5m2_bound, emulated_backend{});
}

TEST_CASE("owner append of float rows into an fp8 cache divides by the layer's scale") {
    using heads = head_config<2, 1, 8>;
    contiguous_cache<float8_e4m3, heads> cache(2, 1, 8);
    cache.set_scales(1, {0.5f, 4.0f});
    const sequence_id id = cache.add_sequence();
    std::vector<float> keys(8), values(8);
    for (int d = 0; d < 8; ++d) keys[d] = 0.25f * float(d + 1), values[d] = -3.0f * float(d + 1);
    cache.append(id, 0, keys, values, 1);
    cache.append(id, 1, keys, values, 1);
    std::vector<float8_e4m3> k(8), v(8);
    cache.read(id, 1, 0, 1, span<float8_e4m3>(k), span<float8_e4m3>(v));
    for (int d = 0; d < 8; ++d) {
        CHECK(to_float(k[d]) == to_float(float8_e4m3(keys[d] / 0.5f)));
        CHECK(to_float(v[d]) == to_float(float8_e4m3(values[d] / 4.0f)));
    }
    cache.read(id, 0, 0, 1, span<float8_e4m3>(k), span<float8_e4m3>(v));  // layer 0 keeps scale 1
    for (int d = 0; d < 8; ++d) CHECK(to_float(k[d]) == to_float(float8_e4m3(keys[d])));
}

TEST_CASE("set_scales refuses what it cannot honour and changes nothing") {
    using heads = head_config<2, 1, 8>;
    paged_cache<float8_e4m3, heads> cache(2, 8, 4);
    cache.set_scales(0, {0.5f, 2.0f});
    const auto unchanged = [&] {
        CHECK(cache.scales(0).key == 0.5f);
        CHECK(cache.scales(0).value == 2.0f);
    };
    const float bad[] = {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
    for (float b : bad) {
        CHECK_THROWS_WITH_AS(cache.set_scales(0, {b, 1.0f}), doctest::Contains("key scale"), error);
        CHECK_THROWS_WITH_AS(cache.set_scales(0, {1.0f, b}), doctest::Contains("value scale"), error);
        unchanged();
    }
    CHECK_THROWS_WITH_AS(cache.set_scales(2, {1.0f, 1.0f}), doctest::Contains("layer 2"), error);
    const sequence_id id = cache.add_sequence();
    CHECK_THROWS_WITH_AS(cache.set_scales(0, {1.0f, 1.0f}), doctest::Contains("holds 1 sequences"), error);
    unchanged();
    cache.remove_sequence(id);
    cache.set_scales(0, {0.25f, 0.75f});
    CHECK(cache.scales(0).key == 0.25f);

    contiguous_cache<half, heads> halves(1, 1, 8);
    CHECK_THROWS_WITH_AS(halves.set_scales(0, {0.5f, 0.5f}), doctest::Contains("only fp8 caches take scales"), error);
    CHECK(halves.scales(0).key == 1.0f);
}

TEST_CASE("a saved fp8 cache records its scales; a load into other scales is refused") {
    using heads = head_config<2, 1, 8>;
    contiguous_cache<float8_e5m2, heads> cache(2, 2, 16);
    cache.set_scales(0, {0.5f, 2.0f});
    cache.set_scales(1, {4.0f, 0.125f});
    const sequence_id id = cache.add_sequence();
    const auto keys = random_rows(5 * 8, 3), values = random_rows(5 * 8, 4);
    for (int l = 0; l < 2; ++l) cache.append(id, l, keys, values, 5);
    std::stringstream file;
    cache.save(file);
    const std::string bytes = file.str();

    contiguous_cache<float8_e5m2, heads> same(2, 2, 16);
    same.set_scales(0, {0.5f, 2.0f});
    same.set_scales(1, {4.0f, 0.125f});
    std::istringstream in(bytes);
    const auto loaded = same.load(in);
    REQUIRE(loaded.size() == 1);
    std::vector<float8_e5m2> a(40), b(40), c(40), d(40);
    cache.read(id, 1, 0, 5, span<float8_e5m2>(a), span<float8_e5m2>(b));
    same.read(loaded[0], 1, 0, 5, span<float8_e5m2>(c), span<float8_e5m2>(d));
    for (int i = 0; i < 40; ++i) CHECK(a[i].bits == c[i].bits);

    contiguous_cache<float8_e5m2, heads> other(2, 2, 16);
    other.set_scales(0, {0.5f, 2.0f});  // layer 1 left at 1 and 1
    std::istringstream again(bytes);
    CHECK_THROWS_WITH_AS(other.load(again), doctest::Contains("scales of layer 1 (key 4, value 0.125)"), error);
    CHECK(other.sequence_count() == 0);
}
