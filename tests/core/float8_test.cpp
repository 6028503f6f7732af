// The software fp8 conversions (e4m3 and e5m2) against the formats'
// definitions: every encoding widened, every rounding boundary between
// neighbouring encodings, saturation and the specials, and a sweep of float
// encodings rounded by an independent nearest-value search in double.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvcache/core/float8.hpp"

using kvcache::float8_e4m3;
using kvcache::float8_e5m2;
using kvcache::detail::bits_to_float;

namespace {

// A format from its definition, written independently of the library's bit
// manipulation: value = (-1)^s * 2^(e - bias) * (1 + m / 2^M), subnormal
// 2^(1 - bias) * m / 2^M, and the specials as the OCP FP8 specification has them.
struct definition {
    int exponent_bits, mantissa_bits;
    bool ieee_specials;  // e5m2: all-ones exponent is inf/NaN; e4m3: only S.1111.111 is NaN
    double largest;      // the largest finite value, from the specification's tables

    int bias() const { return (1 << (exponent_bits - 1)) - 1; }
    bool is_nan(std::uint8_t bits) const {
        const int e = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1), m = bits & ((1 << mantissa_bits) - 1);
        if (ieee_specials) return e == (1 << exponent_bits) - 1 && m != 0;
        return (bits & 0x7f) == 0x7f;
    }
    double decode(std::uint8_t bits) const {
        const int sign = (bits & 0x80) ? -1 : 1;
        const int e = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1), m = bits & ((1 << mantissa_bits) - 1);
        if (is_nan(bits)) return std::numeric_limits<double>::quiet_NaN();
        if (ieee_specials && e == (1 << exponent_bits) - 1) return sign * INFINITY;
        if (e == 0) return sign * std::ldexp(m, 1 - bias() - mantissa_bits);
        return sign * std::ldexp((1 << mantissa_bits) + m, e - bias() - mantissa_bits);
    }
    // Non-negative finite encodings in increasing order of value (encodings are monotonic).
    std::vector<std::uint8_t> finite_magnitudes() const {
        std::vector<std::uint8_t> out;
        for (int b = 0; b < 128; ++b)
            if (std::isfinite(decode(static_cast<std::uint8_t>(b)))) out.push_back(static_cast<std::uint8_t>(b));
        return out;
    }
    // Nearest finite encoding (of table, finite_magnitudes()) by search, ties to the even encoding, past the
    // largest value saturating to it (the library's documented choice).
    std::uint8_t nearest(float value, const std::vector<std::uint8_t>& table) const {
        const double target = std::fabs(static_cast<double>(value));
        std::uint8_t chosen = table.back();
        for (std::size_t i = 0; i + 1 < table.size(); ++i) {
            const double low = decode(table[i]), high = decode(table[i + 1]);
            if (target >= high) continue;
            if (target - low < high - target) chosen = table[i];
            else if (target - low > high - target) chosen = table[i + 1];
            else chosen = (table[i] & 1) ? table[i + 1] : table[i];
            break;
        }
        return static_cast<std::uint8_t>(chosen | (std::signbit(value) ? 0x80 : 0));
    }
};

const definition e4m3_definition{4, 3, false, 448.0};
const definition e5m2_definition{5, 2, true, 57344.0};

template <class Fp8>
const definition& definition_of();
template <>
const definition& definition_of<float8_e4m3>() { return e4m3_definition; }
template <>
const definition& definition_of<float8_e5m2>() { return e5m2_definition; }

}  // namespace

TEST_CASE_TEMPLATE("fp8 to float is exact for all 256 encodings", Fp8, float8_e4m3, float8_e5m2) {
    const definition& format = definition_of<Fp8>();
    int nans = 0, infinities = 0;
    for (int bits = 0; bits < 256; ++bits) {
        const float widened = static_cast<float>(Fp8::from_bits(static_cast<std::uint8_t>(bits)));
        const double expected = format.decode(static_cast<std::uint8_t>(bits));
        if (std::isnan(expected)) {
            REQUIRE(std::isnan(widened));
            ++nans;
        } else {
            REQUIRE(static_cast<double>(widened) == expected);
            REQUIRE(std::signbit(widened) == (bits >= 128));
            infinities += std::isinf(widened) ? 1 : 0;
        }
    }
    // The specification's counts: e4m3 has 2 NaNs and no infinities, e5m2 6 NaNs and 2 infinities.
    CHECK(nans == (format.ieee_specials ? 6 : 2));
    CHECK(infinities == (format.ieee_specials ? 2 : 0));
    CHECK(static_cast<double>(static_cast<float>(Fp8::max())) == format.largest);
}

TEST_CASE_TEMPLATE("float to fp8 round-trips every finite encoding; NaN stays NaN with its sign", Fp8, float8_e4m3,
                   float8_e5m2) {
    const definition& format = definition_of<Fp8>();
    for (int bits = 0; bits < 256; ++bits) {
        const auto b = static_cast<std::uint8_t>(bits);
        const Fp8 back(static_cast<float>(Fp8::from_bits(b)));
        const double value = format.decode(b);
        if (std::isnan(value)) {
            REQUIRE(format.is_nan(back.bits));
            REQUIRE((back.bits & 0x80) == (b & 0x80));
        } else if (std::isinf(value)) {
            REQUIRE(back.bits == (Fp8::max().bits | (b & 0x80)));  // saturates
        } else {
            REQUIRE(back.bits == b);
        }
    }
}

TEST_CASE_TEMPLATE("float to fp8 rounds to nearest, ties to even, at every boundary", Fp8, float8_e4m3, float8_e5m2) {
    const definition& format = definition_of<Fp8>();
    const auto table = format.finite_magnitudes();
    for (std::uint8_t sign : {std::uint8_t(0), std::uint8_t(0x80)}) {
        for (std::size_t i = 0; i + 1 < table.size(); ++i) {
            const auto lower = static_cast<std::uint8_t>(sign | table[i]);
            const auto upper = static_cast<std::uint8_t>(sign | table[i + 1]);
            const double a = format.decode(lower), b = format.decode(upper);
            const float midpoint = static_cast<float>((a + b) / 2);  // exact: a few significant bits
            REQUIRE(static_cast<double>(midpoint) == (a + b) / 2);
            REQUIRE(Fp8(midpoint).bits == ((table[i] & 1) ? upper : lower));
            REQUIRE(Fp8(std::nextafter(midpoint, static_cast<float>(a))).bits == lower);
            REQUIRE(Fp8(std::nextafter(midpoint, static_cast<float>(b))).bits == upper);
        }
    }
}

TEST_CASE_TEMPLATE("float to fp8 equals a nearest-value search on a sweep of float encodings", Fp8, float8_e4m3,
                   float8_e5m2) {
    const definition& format = definition_of<Fp8>();
    const auto table = format.finite_magnitudes();
    long long compared = 0;
    for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 4093) {  // a prime stride: every exponent, many mantissas
        const float value = bits_to_float(static_cast<std::uint32_t>(bits));
        const Fp8 ours(value);
        if (std::isnan(value)) {
            REQUIRE(format.is_nan(ours.bits));
            REQUIRE((ours.bits >> 7) == (bits >> 31));
            continue;
        }
        REQUIRE(ours.bits == format.nearest(value, table));
        ++compared;
    }
    CHECK(compared > 1000000);
}

TEST_CASE_TEMPLATE("fp8 saturation, infinities and the smallest values", Fp8, float8_e4m3, float8_e5m2) {
    const definition& format = definition_of<Fp8>();
    const float largest = static_cast<float>(format.largest);
    const std::uint8_t max_bits = Fp8::max().bits;
    CHECK(Fp8(largest).bits == max_bits);
    CHECK(Fp8(2 * largest).bits == max_bits);  // saturates, never infinity or NaN
    CHECK(Fp8(-2 * largest).bits == (max_bits | 0x80));
    CHECK(Fp8(std::numeric_limits<float>::infinity()).bits == max_bits);
    CHECK(Fp8(-std::numeric_limits<float>::infinity()).bits == (max_bits | 0x80));
    CHECK(Fp8(std::numeric_limits<float>::max()).bits == max_bits);
    CHECK(format.is_nan(Fp8(bits_to_float(0x7f800001u)).bits));  // a payload only in the low bits stays NaN
    CHECK(format.is_nan(Fp8(bits_to_float(0xffc00000u)).bits));
    CHECK((Fp8(bits_to_float(0xffc00000u)).bits & 0x80) != 0);
    const double smallest = std::ldexp(1.0, 1 - format.bias() - format.mantissa_bits);
    CHECK(Fp8(static_cast<float>(smallest / 2)).bits == 0x00);  // the tie with zero goes to zero (even)
    CHECK(Fp8(std::nextafter(static_cast<float>(smallest / 2), 1.0f)).bits == 0x01);
    CHECK(Fp8(static_cast<float>(smallest * 1.5)).bits == 0x02);  // the tie between subnormals 1 and 2: even
    CHECK(Fp8(bits_to_float(0x00000001u)).bits == 0x00);           // float subnormals are far below fp8's range
    CHECK(Fp8(-0.0f).bits == 0x80);
    CHECK(kvcache::same_bits(Fp8(1.0f), Fp8::from_bits(static_cast<std::uint8_t>(format.bias() << format.mantissa_bits))));
}
