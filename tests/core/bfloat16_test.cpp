// The software bfloat16 conversions against the format's definition: every
// one of the 65,536 encodings widened, every rounding boundary between
// neighbouring encodings, and a sweep of float encodings rounded by an
// independent nearest-value search in double.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "kvcache/core/bfloat16.hpp"

using kvcache::bfloat16;
using kvcache::detail::bits_to_float;
using kvcache::detail::float_to_bits;

namespace {

// bfloat16 from its definition: 1 sign bit, 8 exponent bits (bias 127), 7 mantissa bits.
double decode_by_definition(std::uint16_t bits) {
    const int sign = (bits >> 15) ? -1 : 1;
    const int exponent = (bits >> 7) & 0xff;
    const int mantissa = bits & 0x7f;
    if (exponent == 0xff) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
    if (exponent == 0) return sign * std::ldexp(mantissa, -133);
    return sign * std::ldexp(128 + mantissa, exponent - 134);
}

// The magnitude an encoding stands for when rounding: infinity counts as 2^128,
// the next step past the largest finite value (IEEE rounds as if the exponent
// were unbounded, then overflows).
double rounding_value(std::uint16_t magnitude) {
    return magnitude == 0x7f80 ? std::ldexp(1.0, 128) : decode_by_definition(magnitude);
}

bool is_nan_bits(std::uint16_t bits) { return (bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0; }

// Nearest bfloat16 to a finite float by search: the two encodings around its
// magnitude, the nearer one, the even one on a tie.
std::uint16_t nearest_by_search(float value) {
    const double target = std::fabs(static_cast<double>(value));
    std::uint16_t below = 0;
    for (int step = 1 << 14; step > 0; step >>= 1)  // largest finite encoding whose value is <= target
        if (below + step < 0x7f80 && decode_by_definition(static_cast<std::uint16_t>(below + step)) <= target)
            below = static_cast<std::uint16_t>(below + step);
    const std::uint16_t above = static_cast<std::uint16_t>(below + 1);
    const double low = rounding_value(below), high = rounding_value(above);
    std::uint16_t chosen;
    if (target == low) chosen = below;
    else if (target - low < high - target) chosen = below;
    else if (target - low > high - target) chosen = above;
    else chosen = (below & 1) ? above : below;
    return static_cast<std::uint16_t>(chosen | (std::signbit(value) ? 0x8000 : 0));
}

}  // namespace

TEST_CASE("bfloat16 to float is exact for all 65536 encodings") {
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        const float widened = static_cast<float>(bfloat16::from_bits(static_cast<std::uint16_t>(bits)));
        const double expected = decode_by_definition(static_cast<std::uint16_t>(bits));
        if (std::isnan(expected)) {
            REQUIRE(std::isnan(widened));
        } else {
            REQUIRE(static_cast<double>(widened) == expected);
            REQUIRE(std::signbit(widened) == ((bits >> 15) != 0));
        }
    }
}

TEST_CASE("float to bfloat16 round-trips every encoding; NaN stays NaN with its sign") {
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        const auto b = static_cast<std::uint16_t>(bits);
        const bfloat16 back(static_cast<float>(bfloat16::from_bits(b)));
        if (is_nan_bits(b)) {
            REQUIRE(is_nan_bits(back.bits));
            REQUIRE((back.bits & 0x8000) == (b & 0x8000));
        } else {
            REQUIRE(back.bits == b);
        }
    }
}

TEST_CASE("float to bfloat16 rounds to nearest, ties to even, at every boundary") {
    for (std::uint32_t sign : {0u, 0x8000u}) {
        for (std::uint32_t m = 0; m < 0x7f7f; ++m) {
            const auto lower = static_cast<std::uint16_t>(sign | m);
            const auto upper = static_cast<std::uint16_t>(sign | (m + 1));
            const double a = decode_by_definition(lower), b = decode_by_definition(upper);
            const float midpoint = static_cast<float>((a + b) / 2);  // exact: 9 significant bits
            REQUIRE(static_cast<double>(midpoint) == (a + b) / 2);
            REQUIRE(bfloat16(midpoint).bits == ((m & 1) ? upper : lower));
            REQUIRE(bfloat16(std::nextafter(midpoint, static_cast<float>(a))).bits == lower);
            REQUIRE(bfloat16(std::nextafter(midpoint, static_cast<float>(b))).bits == upper);
        }
    }
}

TEST_CASE("float to bfloat16 equals a nearest-value search on a sweep of float encodings") {
    long long compared = 0;
    for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 4093) {  // a prime stride: every exponent, many mantissas
        const float value = bits_to_float(static_cast<std::uint32_t>(bits));
        const bfloat16 ours(value);
        if (std::isnan(value)) {
            REQUIRE(is_nan_bits(ours.bits));
            REQUIRE((ours.bits >> 15) == (bits >> 31));
            continue;
        }
        if (std::isinf(value)) {
            REQUIRE(ours.bits == (value > 0 ? 0x7f80 : 0xff80));
            continue;
        }
        REQUIRE(ours.bits == nearest_by_search(value));
        ++compared;
    }
    CHECK(compared > 1000000);
}

TEST_CASE("bfloat16 overflow, infinities, NaN payloads and subnormals") {
    const float largest = bits_to_float(0x7f7f0000u);  // (2 - 2^-7) * 2^127
    CHECK(bfloat16(largest).bits == 0x7f7f);
    CHECK(bfloat16(bits_to_float(0x7f7f7fffu)).bits == 0x7f7f);  // just below the tie
    CHECK(bfloat16(bits_to_float(0x7f7f8000u)).bits == 0x7f80);  // the tie above the largest goes to infinity
    CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);
    CHECK(bfloat16(-std::numeric_limits<float>::max()).bits == 0xff80);
    CHECK(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
    CHECK(is_nan_bits(bfloat16(bits_to_float(0x7f800001u)).bits));  // a payload only in the low bits stays NaN
    CHECK(is_nan_bits(bfloat16(bits_to_float(0xff800001u)).bits));
    CHECK((bfloat16(bits_to_float(0xff800001u)).bits & 0x8000) != 0);
    CHECK(bfloat16(bits_to_float(0x00008000u)).bits == 0x0000);  // tie between 0 and the smallest subnormal: even
    CHECK(bfloat16(bits_to_float(0x00018000u)).bits == 0x0002);  // tie between subnormals 1 and 2: even
    CHECK(bfloat16(bits_to_float(0x007fffffu)).bits == 0x0080);  // the largest float subnormal rounds up to the smallest normal
    CHECK(bfloat16(-0.0f).bits == 0x8000);
    CHECK(kvcache::same_bits(bfloat16(1.0f), bfloat16::from_bits(0x3f80)));
}
