// The CPU backend against the reference on the whole matrix, over the private
// scatter layout (and the shipped layouts, see layouts.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "support/backend_suite.hpp"

using namespace kvcache;
using namespace kvcache_test;

TEST_CASE("cpu backend passes the backend suite: scatter layout") {
    check_layout<scatter_factory, float>(cpu_backend{}, "cpu");
    check_layout<scatter_factory, half>(cpu_backend{}, "cpu");
}
TEST_CASE("cpu backend passes the backend suite: contiguous layout") {
    check_layout<contiguous_factory, float>(cpu_backend{}, "cpu");
    check_layout<contiguous_factory, half>(cpu_backend{}, "cpu");
}
TEST_CASE("cpu backend passes the backend suite: paged layout") {
    check_layout<paged_factory, float>(cpu_backend{}, "cpu");
    check_layout<paged_factory, half>(cpu_backend{}, "cpu");
}
TEST_CASE("cpu backend passes the backend suite: sliding-window layout") {
    check_layout<sliding_window_factory, float>(cpu_backend{}, "cpu");
    check_layout<sliding_window_factory, half>(cpu_backend{}, "cpu");
}
TEST_CASE("cpu backend passes the backend suite: odd shapes, merge, empty sequences, splits, cascade, window mask") {
    const cpu_backend cpu;
    check_odd_shapes(cpu, "cpu");
    check_attention<paged_factory, half, head_config<7, 1, 56>>(cpu, "cpu");
    check_merge(cpu, "cpu");
    check_empty_sequences(cpu, "cpu");
    check_split_counts(cpu, "cpu");
    check_cascade<float>(cpu, "cpu");
    check_cascade<half>(cpu, "cpu");
    check_window_mask(cpu, "cpu");
}

TEST_CASE("cpu backend passes the backend suite: head counts given at run time") {
    check_dynamic_heads(cpu_backend{}, "cpu");
}

TEST_CASE("cpu backend gives the same answer on one thread and on several, split or not") {
    using heads = head_config<8, 2, 64>;
    context_case c{"long", {700}, 0, 0, 16, {1}, {}};
    auto cache = scatter_factory::make<half, heads>(c, 3);
    fill_cache(cache->view(), 4);
    const auto queries = random_rows<float>(heads::query_heads() * heads::head_dim, 3.0f, 5);
    std::vector<float> outputs(queries.size()), lse(heads::query_heads());
    decode_params call(cache->view(), queries, outputs);
    call.lse = lse;
    const auto expected = reference_backend{}.decode_exact(call);
    for (int threads : {1, 3}) {
        cpu::set_thread_count(threads);
        CHECK(cpu::thread_count() == threads);
        CHECK(cpu_backend{}.threads() == threads);
        for (int splits : {0, 1, 2, 5}) {
            call.options.kv_splits = splits;
            cpu_backend{}.decode(call);
            compare(outputs, lse, expected, "threads " + std::to_string(threads) + " splits " + std::to_string(splits));
        }
    }
    cpu::set_thread_count(0);
}

TEST_CASE("half widening used by the cpu backend is exact for every binary16 value") {
    std::vector<half> all(65536);
    for (int i = 0; i < 65536; ++i) all[i] = half::from_bits(std::uint16_t(i));
    std::vector<float> widened(65536);
    cpu::detail::widen(all.data(), widened.data(), 65536);
    int mismatches = 0;
    for (int i = 0; i < 65536; ++i) {
        const float expected = static_cast<float>(all[i]);  // core's exact software conversion
        mismatches += std::memcmp(&expected, &widened[i], 4) != 0;
    }
    CHECK(mismatches == 0);
}

TEST_CASE("bfloat16 widening used by the cpu backend is exact for every encoding") {
    std::vector<bfloat16> all(65536);
    for (int i = 0; i < 65536; ++i) all[i] = bfloat16::from_bits(std::uint16_t(i));
    std::vector<float> scalar(65536), vector(65536);
    cpu::detail::widen(all.data(), scalar.data(), 65536);
    using vec = cpu::detail::float8;  // the load the kernels use, whatever the build's ISA
    for (int i = 0; i < 65536; i += vec::lanes) vec::load(all.data() + i).store(vector.data() + i);
    int mismatches = 0;
    for (int i = 0; i < 65536; ++i) {
        const std::uint32_t expected = std::uint32_t(i) << 16;  // bfloat16 is a float's top half, by definition
        mismatches += std::memcmp(&expected, &scalar[i], 4) != 0;
        mismatches += std::memcmp(&expected, &vector[i], 4) != 0;
    }
    CHECK(mismatches == 0);
}

TEST_CASE_TEMPLATE("fp8 widening used by the cpu backend is exact for every encoding", Fp8, kvcache::float8_e4m3,
                   kvcache::float8_e5m2) {
    std::vector<Fp8> all(256);
    for (int i = 0; i < 256; ++i) all[i] = Fp8::from_bits(std::uint8_t(i));
    std::vector<float> scalar(256), vector(256);
    cpu::detail::widen(all.data(), scalar.data(), 256);
    using vec = cpu::detail::float8;  // the load the kernels use, whatever the build's ISA
    for (int i = 0; i < 256; i += vec::lanes) vec::load(all.data() + i).store(vector.data() + i);
    int mismatches = 0;
    for (int i = 0; i < 256; ++i) {
        const float expected = static_cast<float>(all[i]);  // core's exact conversion, tested against the format's definition
        mismatches += std::memcmp(&expected, &scalar[i], 4) != 0;
        mismatches += std::memcmp(&expected, &vector[i], 4) != 0;
    }
    CHECK(mismatches == 0);
}

TEST_CASE("the kernels' vector exp agrees with exp_non_positive and with exp, -inf and NaN included") {
    // A sweep over the softmax's range and the edges: 0 and -0, either side
    // of the -87 cut, the smallest magnitudes, -inf and NaN.
    std::vector<float> inputs;
    for (int i = 0; i <= 4000; ++i) inputs.push_back(-90.0f + 90.0f * float(i) / 4000.0f);
    const float specials[] = {0.0f, -0.0f, -87.0f, std::nextafter(-87.0f, -100.0f), std::nextafter(-87.0f, 0.0f),
                              -1e-30f, -1e-45f, -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
    inputs.insert(inputs.end(), std::begin(specials), std::end(specials));
    while (inputs.size() % 16 != 0) inputs.push_back(-1.0f);
    std::vector<float> vector = inputs, scalar = inputs;
    cpu::detail::exp_rows(vector.data(), int(vector.size()));  // the build's ISA, as the kernels call it
    cpu::detail::exp_non_positive(scalar.data(), int(scalar.size()));
    int wrong = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const float x = inputs[i];
        bool ok;
        if (std::isnan(x)) {
            ok = std::isnan(vector[i]) && std::isnan(scalar[i]);  // a NaN logit is a NaN weight, as in the reference
        } else if (x < -87.0f) {
            ok = vector[i] == 0.0f && scalar[i] == 0.0f;
        } else {
            // The polynomial is within 2 ulp of exp; allow 4 between the two forms and against exp itself.
            const double exact = std::exp(double(x));
            const double ulps = 4.0 * std::numeric_limits<float>::epsilon() * exact;
            ok = std::abs(double(vector[i]) - exact) <= ulps && std::abs(double(scalar[i]) - exact) <= ulps;
        }
        if (!ok && wrong++ < 5)
            MESSAGE("x = " << x << ": vector " << vector[i] << ", scalar " << scalar[i] << ", exp " << std::exp(double(x)));
    }
    CHECK(wrong == 0);
}

TEST_CASE("cpu backend passes the backend suite: bfloat16 in every layout") {
    const cpu_backend cpu;
    check_layout<scatter_factory, bfloat16>(cpu, "cpu");
    check_layout<contiguous_factory, bfloat16>(cpu, "cpu");
    check_layout<paged_factory, bfloat16>(cpu, "cpu");
    check_layout<sliding_window_factory, bfloat16>(cpu, "cpu");
    check_bfloat16(cpu, "cpu");
}

TEST_CASE("cpu backend passes the backend suite: fp8 e4m3 and e5m2 with scales in every layout") {
    check_fp8<float8_e4m3>(cpu_backend{}, "cpu");
    check_fp8<float8_e5m2>(cpu_backend{}, "cpu");
}

namespace {

// Largest |output - exact| of cpu decode over a paged cache of Element holding
// the float rows `keys`/`values` (rounded on the way in), against the exact
// attention over the float rows themselves: the storage format's error.
template <class Element, class Heads>
double format_error(const std::vector<float>& keys, const std::vector<float>& values, const std::vector<float>& queries,
                    int tokens, const reference::attention_result& exact) {
    paged_cache<Element, Heads> cache(1, (tokens + 15) / 16, 16);
    const sequence_id id = cache.add_sequence();
    cache.append(id, 0, keys, values, tokens);
    auto plan = cache.plan({id});
    std::vector<float> outputs(queries.size());
    cpu_backend{}.decode(decode_params(plan.view(0), queries, outputs));
    double worst = 0;
    for (std::size_t i = 0; i < outputs.size(); ++i) worst = std::max(worst, std::fabs(outputs[i] - exact.outputs[i]));
    return worst;
}

}  // namespace

TEST_CASE("format error: decode over fp16 and bf16 caches against exact attention over the original float K/V") {
    using heads = head_config<8, 2, 64>;
    const int tokens = 300;
    const std::size_t row = std::size_t(heads::kv_heads()) * heads::head_dim;
    const auto keys = random_rows<float>(tokens * row, 1.0f, 31), values = random_rows<float>(tokens * row, 1.0f, 32);
    const auto queries = random_rows<float>(std::size_t(heads::query_heads()) * heads::head_dim, 1.0f, 33);
    paged_cache<float, heads> exact_cache(1, (tokens + 15) / 16, 16);
    const sequence_id id = exact_cache.add_sequence();
    exact_cache.append(id, 0, keys, values, tokens);
    auto plan = exact_cache.plan({id});
    std::vector<float> unused(queries.size());
    const auto exact = reference_backend{}.decode_exact(decode_params(plan.view(0), queries, unused));
    const double fp16 = format_error<half, heads>(keys, values, queries, tokens, exact);
    const double bf16 = format_error<bfloat16, heads>(keys, values, queries, tokens, exact);
    MESSAGE("largest output error over the original float K/V: fp16 " << fp16 << ", bf16 " << bf16);
    // Bounds from the formats: a stored value is off by at most eps = 2^-11 (fp16) or 2^-9 (bf16)
    // relative, so a logit (scale 1/8 over 64 products of magnitude <= 1) by at most 8 eps, a softmax
    // weight by a factor within e^(+-16 eps), and an output (|v| <= 1) by (e^(16 eps) - 1) + eps.
    const auto bound = [](double eps) { return std::expm1(16 * eps) + eps + 1e-5; };
    CHECK(fp16 <= bound(std::ldexp(1.0, -11)));
    CHECK(bf16 <= bound(std::ldexp(1.0, -9)));
    CHECK(bf16 > fp16);  // bf16 keeps 3 mantissa bits fewer: on 300 random keys its error is the larger
    CHECK(fp16 > 0);     // the rows were rounded: an error of exactly 0 would mean the cache kept floats
}
