// The software binary16 conversions, checked over every one of the 65,536
// encodings and at every rounding boundary between neighbouring halves.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "kvcache/core/half.hpp"

using kvcache::half;
using kvcache::detail::bits_to_float;
using kvcache::detail::float_to_bits;

namespace {

// Independent decoding of binary16 from its definition, in double.
double decode_by_definition(std::uint16_t bits) {
    const int sign = (bits >> 15) ? -1 : 1;
    const int exponent = (bits >> 10) & 0x1f;
    const int mantissa = bits & 0x3ff;
    if (exponent == 0x1f) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
    if (exponent == 0) return sign * std::ldexp(mantissa, -24);
    return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

bool is_nan_bits(std::uint16_t bits) { return (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0; }

}  // namespace

TEST_CASE("half to float is exact for all 65536 encodings") {
    int checked = 0;
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        const float widened = static_cast<float>(half::from_bits(static_cast<std::uint16_t>(bits)));
        const double expected = decode_by_definition(static_cast<std::uint16_t>(bits));
        if (std::isnan(expected)) {
            REQUIRE(std::isnan(widened));
        } else {
            REQUIRE(static_cast<double>(widened) == expected);
            REQUIRE(std::signbit(widened) == ((bits >> 15) != 0));  // signed zeros too
        }
        ++checked;
    }
    CHECK(checked == 65536);
}

TEST_CASE("float to half round-trips every encoding") {
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        const auto h = static_cast<std::uint16_t>(bits);
        const half back(static_cast<float>(half::from_bits(h)));
        if (is_nan_bits(h)) {
            REQUIRE(is_nan_bits(back.bits));
            REQUIRE((back.bits & 0x8000) == (h & 0x8000));
        } else {
            REQUIRE(back.bits == h);
        }
    }
}

TEST_CASE("float to half rounds to nearest, ties to even, at every boundary") {
    // For each pair of neighbouring finite halves of the same sign, the float at
    // the exact midpoint goes to the even one, and the floats one ulp either
    // side of it go to the nearer one.
    for (std::uint32_t sign : {0u, 0x8000u}) {
        for (std::uint32_t m = 0; m < 0x7bff; ++m) {
            const auto lower = static_cast<std::uint16_t>(sign | m);
            const auto upper = static_cast<std::uint16_t>(sign | (m + 1));
            const double a = decode_by_definition(lower);
            const double b = decode_by_definition(upper);
            const float midpoint = static_cast<float>((a + b) / 2);  // exact: halves have 11 bits
            REQUIRE(static_cast<double>(midpoint) == (a + b) / 2);
            const std::uint16_t even = (m & 1) ? upper : lower;
            REQUIRE(half(midpoint).bits == even);
            const float toward_lower = std::nextafter(midpoint, static_cast<float>(a));
            const float toward_upper = std::nextafter(midpoint, static_cast<float>(b));
            REQUIRE(half(toward_lower).bits == lower);
            REQUIRE(half(toward_upper).bits == upper);
        }
    }
}

TEST_CASE("overflow, infinities, NaN and underflow") {
    CHECK(half(65504.0f).bits == 0x7bff);
    CHECK(half(65519.99f).bits == 0x7bff);
    CHECK(half(65520.0f).bits == 0x7c00);  // the tie above the largest half goes to infinity
    CHECK(half(1e10f).bits == 0x7c00);
    CHECK(half(-1e10f).bits == 0xfc00);
    CHECK(half(std::numeric_limits<float>::infinity()).bits == 0x7c00);
    CHECK(half(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
    CHECK(is_nan_bits(half(std::numeric_limits<float>::quiet_NaN()).bits));
    CHECK(is_nan_bits(half(bits_to_float(0x7f800001u)).bits));  // signalling NaN with low payload stays NaN
    CHECK(half(std::ldexp(1.0f, -25)).bits == 0x0000);          // tie between 0 and the smallest subnormal
    CHECK(half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits == 0x0001);
    CHECK(half(std::ldexp(1.0f, -24)).bits == 0x0001);
    CHECK(half(-std::ldexp(1.0f, -30)).bits == 0x8000);  // negative underflow keeps the sign
    CHECK(half(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    CHECK(half(std::ldexp(1.0f, -14)).bits == 0x0400);  // smallest normal
    CHECK(half(std::ldexp(1023.5f, -24)).bits == 0x0400);  // rounds up out of the subnormals
}
