// int4 rows (groups of 32, a half scale and a half minimum each) against the
// definition, recomputed here in double: minimum = the group's smallest value
// rounded down to a half, scale = the smallest half with minimum + 15 * scale
// at or above the group's largest value, code = (x - minimum) / scale rounded to
// nearest (ties to even) and clamped to [0, 15]; packing, sizes, the NaN policy.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvcache/core/element.hpp"

using kvcache::qint4;

namespace {

std::vector<qint4> quantise(const std::vector<float>& row) {
    const int dim = int(row.size());
    std::vector<qint4> out(std::size_t(kvcache::row_elements<qint4>(dim)), qint4{0xA5});  // junk: every byte is written
    kvcache::quantise_row([&](int d) { return row[std::size_t(d)]; }, dim, out.data());
    return out;
}

// Every finite half, ascending, as doubles: the directed roundings below search it.
const std::vector<double>& finite_halves() {
    static const std::vector<double> all = [] {
        std::vector<double> v;
        for (int bits = 0; bits < 0x10000; ++bits) {
            const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
            if (exponent == 0x1f) continue;
            const double magnitude = exponent == 0 ? std::ldexp(double(mantissa), -24)
                                                   : std::ldexp(double(mantissa + 1024), exponent - 25);
            v.push_back((bits & 0x8000) ? -magnitude : magnitude);
        }
        std::sort(v.begin(), v.end());
        return v;
    }();
    return all;
}
double half_at_or_below(double x) {
    const auto& h = finite_halves();
    auto it = std::upper_bound(h.begin(), h.end(), x);
    return it == h.begin() ? -INFINITY : *(it - 1);
}
double half_at_or_above(double x) {
    const auto& h = finite_halves();
    auto it = std::lower_bound(h.begin(), h.end(), x);
    return it == h.end() ? INFINITY : *it;
}
double nearest_even(double x) {
    const double low = std::floor(x), rest = x - low;
    if (rest > 0.5) return low + 1;
    if (rest < 0.5) return low;
    return std::fmod(low, 2.0) == 0 ? low : low + 1;
}

void check_row_against_definition(const std::vector<float>& row) {
    const int dim = int(row.size());
    const std::vector<qint4> stored = quantise(row);
    for (int g = 0; g * 32 < dim; ++g) {
        const int begin = g * 32, end = std::min(dim, begin + 32);
        double lowest = row[std::size_t(begin)], highest = lowest;
        for (int d = begin; d < end; ++d) {
            lowest = std::min(lowest, double(row[std::size_t(d)]));
            highest = std::max(highest, double(row[std::size_t(d)]));
        }
        const double minimum = half_at_or_below(lowest);
        const double scale = half_at_or_above((highest - minimum) / 15.0);
        const kvcache::qint4_group group = kvcache::qint4_group_of(stored.data(), dim, g);
        INFO("group ", g, " of a row of ", dim, ": lowest ", lowest, " highest ", highest);
        REQUIRE(double(group.minimum) == minimum);
        REQUIRE(double(group.scale) == scale);
        for (int d = begin; d < end; ++d) {
            const double x = row[std::size_t(d)];
            const double code = scale == 0 ? 0 : std::min(15.0, std::max(0.0, nearest_even((x - minimum) / scale)));
            INFO("d = ", d, " x = ", x);
            CHECK(kvcache::qint4_code(stored.data(), d) == int(code));
            const double back = minimum + code * scale;
            CHECK(std::abs(back - x) <= scale / 2 * (1 + 1e-6));  // half a step, up to the float division's rounding
            CHECK(std::abs(double(kvcache::qint4_value(stored.data(), dim, d)) - back) <= std::abs(back) * 1e-7);
        }
    }
}

}  // namespace

TEST_CASE("int4 rows: sizes, kind and names") {
    CHECK(kvcache::row_elements<qint4>(128) == 64 + 4 * 4);
    CHECK(kvcache::row_elements<qint4>(40) == 20 + 2 * 4);  // a short last group of 8
    CHECK(kvcache::stored_row_bytes(kvcache::element_kind::int4, 96) == 48 + 3 * 4);
    CHECK(kvcache::element_traits<qint4>::kind == kvcache::element_kind::int4);
    CHECK(int(kvcache::element_kind::int4) == 6);  // a file value: never renumbered
    CHECK(kvcache::is_element_kind(6));
    CHECK_FALSE(kvcache::is_element_kind(7));
    CHECK(std::string(kvcache::to_string(kvcache::element_kind::int4)) == "int4");
    kvcache::element_kind kind{};
    REQUIRE(kvcache::parse_element_kind("int4", kind));
    CHECK(kind == kvcache::element_kind::int4);
    CHECK(kvcache::is_row_quantised_v<qint4>);
    CHECK(kvcache::is_stored_element_v<qint4>);
    CHECK_FALSE(kvcache::is_element_v<qint4>);  // no to_float: rows are read through qint4_value
}

TEST_CASE("int4 rows: codes, minima and scales match the definition; error at most half a step") {
    std::mt19937 random(11);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (int trial = 0; trial < 300; ++trial) {
        const int dim = 8 * (1 + trial % 20);  // 8 .. 160: whole and short last groups
        std::vector<float> row(static_cast<std::size_t>(dim));
        const float magnitude = trial % 9 == 0 ? 1e-6f : (trial % 11 == 0 ? 3000.0f : 1.0f);  // subnormal halves too
        const float offset = trial % 5 == 0 ? 7.5f : 0.0f;                                     // ranges not around 0
        for (float& x : row) x = normal(random) * magnitude + offset;
        check_row_against_definition(row);
    }
}

TEST_CASE("int4 rows: packing, constant groups and exact grids") {
    std::vector<float> row(64, 0.0f);
    for (int d = 0; d < 32; ++d) row[std::size_t(d)] = float(d % 16);  // 0..15: the codes themselves, scale 1
    for (int d = 32; d < 64; ++d) row[std::size_t(d)] = -2.25f;          // constant group: scale 0
    const std::vector<qint4> stored = quantise(row);
    CHECK(stored[0].bits == 0x10);  // d = 0 in the low nibble, d = 1 in the high one
    CHECK(stored[7].bits == 0xFE);
    const kvcache::qint4_group constant = kvcache::qint4_group_of(stored.data(), 64, 1);
    CHECK(constant.scale == 0.0f);
    CHECK(constant.minimum == -2.25f);
    for (int d = 0; d < 64; ++d) CHECK(kvcache::qint4_value(stored.data(), 64, d) == row[std::size_t(d)]);
    check_row_against_definition(row);
}

TEST_CASE("int4 rows: NaN, infinity and values beyond a half make the whole row NaN") {
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(), -70000.0f};
    for (float x : bad) {
        std::vector<float> row(64, 1.0f);
        row[40] = x;  // in the second group: the first must not stay finite either
        const std::vector<qint4> stored = quantise(row);
        for (int d = 0; d < 64; ++d) {
            INFO("bad value ", x, " d = ", d);
            CHECK(std::isnan(kvcache::qint4_value(stored.data(), 64, d)));
        }
    }
    // A large value at the top of a range still fits: the minimum is a half, the scale too.
    std::vector<float> wide(32, 0.0f);
    wide[3] = 70000.0f;
    const std::vector<qint4> stored = quantise(wide);
    CHECK(kvcache::qint4_value(stored.data(), 32, 3) >= 70000.0f - 70000.0f / 30);
    check_row_against_definition(wide);
}
