// kvcache's fp8 host conversions against CUDA's own host implementation
// (cuda_fp8.h, the __NV_SATFINITE conversions), over every encoding and a
// dense sweep of floats.
#include <doctest/doctest.h>

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "kvcache/core/float8.hpp"

namespace {
template <class Fp8>
constexpr __nv_fp8_interpretation_t interpretation_of() {
    return Fp8::encoding::has_infinity ? __NV_E5M2 : __NV_E4M3;
}
bool is_nan_bits(std::uint8_t bits, bool e5m2) { return e5m2 ? (bits & 0x7c) == 0x7c && (bits & 0x03) : (bits & 0x7f) == 0x7f; }
}  // namespace

TEST_CASE_TEMPLATE("fp8 to float agrees with CUDA's conversion for all 256 encodings", Fp8, kvcache::float8_e4m3,
                   kvcache::float8_e5m2) {
    for (int bits = 0; bits < 256; ++bits) {
        const __half_raw widened = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(bits), interpretation_of<Fp8>());
        const float theirs = __half2float(__half(widened));  // exact: every fp8 value is a half
        const float ours = static_cast<float>(Fp8::from_bits(static_cast<std::uint8_t>(bits)));
        if (std::isnan(theirs)) {
            REQUIRE(std::isnan(ours));
        } else {
            REQUIRE(kvcache::detail::float_to_bits(ours) == kvcache::detail::float_to_bits(theirs));
        }
    }
}

TEST_CASE_TEMPLATE("float to fp8 agrees with __nv_cvt_float_to_fp8(__NV_SATFINITE) on a sweep of float encodings", Fp8,
                   kvcache::float8_e4m3, kvcache::float8_e5m2) {
    long long compared = 0;
    for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 97) {
        const float value = kvcache::detail::bits_to_float(static_cast<std::uint32_t>(bits));
        const auto theirs = static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, interpretation_of<Fp8>()));
        const Fp8 ours(value);
        if (std::isnan(value)) {
            REQUIRE(is_nan_bits(ours.bits, Fp8::encoding::has_infinity));
            REQUIRE(is_nan_bits(theirs, Fp8::encoding::has_infinity));
        } else {
            REQUIRE(ours.bits == theirs);
        }
        ++compared;
    }
    CHECK(compared > 40000000);
}
