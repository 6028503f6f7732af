// int8 rows with one float scale per row against the definition, computed
// here independently in double: scale = max|x| / 127, q = x / scale rounded to
// nearest (ties to even) and clamped to [-127, 127], the scale stored after the
// row's values; the zero row and the NaN/infinity policy.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvcache/core/element.hpp"

using kvcache::qint8;

namespace {

constexpr int head_dim = 64;

std::vector<qint8> quantise(const std::vector<float>& row) {
    std::vector<qint8> out(kvcache::row_elements<qint8>(head_dim));
    kvcache::quantise_row([&](int d) { return row[d]; }, head_dim, out.data());
    return out;
}

// Round half to even in double, written without the library's rintf.
double nearest_even(double x) {
    const double low = std::floor(x), rest = x - low;
    if (rest > 0.5) return low + 1;
    if (rest < 0.5) return low;
    return std::fmod(low, 2.0) == 0 ? low : low + 1;
}

}  // namespace

TEST_CASE("int8 rows: sizes, kind and names") {
    CHECK(kvcache::row_elements<qint8>(128) == 132);
    CHECK(kvcache::row_elements<kvcache::half>(128) == 128);
    CHECK(kvcache::element_traits<qint8>::kind == kvcache::element_kind::int8);
    CHECK(int(kvcache::element_kind::int8) == 5);  // a file value: never renumbered
    CHECK(std::string(kvcache::to_string(kvcache::element_kind::int8)) == "int8");
    CHECK(kvcache::element_size(kvcache::element_kind::int8) == 1);
    kvcache::element_kind kind{};
    REQUIRE(kvcache::parse_element_kind("int8", kind));
    CHECK(kind == kvcache::element_kind::int8);
    const kvcache::half row[2] = {kvcache::half(1.0f), kvcache::half(2.0f)};
    CHECK(kvcache::row_scale_of(row, 2) == 1.0f);  // other types carry no row scale
}

TEST_CASE("int8 rows: quantisation matches the definition, error at most half a step") {
    std::mt19937 random(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (int trial = 0; trial < 200; ++trial) {
        std::vector<float> row(head_dim);
        for (float& x : row) x = normal(random) * (trial % 7 == 0 ? 1e-30f : 1.0f);  // tiny rows too
        const std::vector<qint8> stored = quantise(row);
        double largest = 0;
        for (float x : row) largest = std::max(largest, std::fabs(double(x)));
        const float scale = kvcache::row_scale_of(stored.data(), head_dim);
        // The scale is max|x| / 127 rounded once to float.
        CHECK(scale == float(largest / 127.0));
        for (int d = 0; d < head_dim; ++d) {
            const double expected = std::max(-127.0, std::min(127.0, nearest_even(double(row[d]) / double(scale))));
            // x / scale is computed in float by the library; allow the one case where
            // float division lands exactly on a .5 the double quotient misses.
            CHECK(std::fabs(stored[d].bits - expected) <= (std::fabs(std::fabs(double(row[d]) / scale - std::floor(std::fabs(double(row[d]) / scale))) - 0.5) < 1e-5 ? 1.0 : 0.0));
            const double back = double(stored[d].bits) * scale;
            CHECK(std::fabs(back - row[d]) <= 0.5 * double(scale) * (1 + 1e-5));
        }
    }
}

TEST_CASE("int8 rows: representable rows come back exactly") {
    std::vector<float> row(head_dim);
    for (int d = 0; d < head_dim; ++d) row[d] = float((d * 37) % 255 - 127) * 0.5f;  // integers times 0.5, one of them -127*0.5
    row[3] = 127 * 0.5f;
    const std::vector<qint8> stored = quantise(row);
    CHECK(kvcache::row_scale_of(stored.data(), head_dim) == 0.5f);
    for (int d = 0; d < head_dim; ++d) CHECK(double(stored[d].bits) * 0.5 == double(row[d]));
}

TEST_CASE("int8 rows: the zero row stores scale 0, ties round to even") {
    std::vector<float> zero(head_dim, 0.0f);
    const std::vector<qint8> stored = quantise(zero);
    CHECK(kvcache::row_scale_of(stored.data(), head_dim) == 0.0f);
    for (int d = 0; d < head_dim; ++d) CHECK(stored[d].bits == 0);

    std::vector<float> ties(head_dim, 0.0f);
    ties[0] = 127.0f;  // scale 1
    ties[1] = 2.5f;
    ties[2] = 3.5f;
    ties[3] = -2.5f;
    const std::vector<qint8> tied = quantise(ties);
    CHECK(kvcache::row_scale_of(tied.data(), head_dim) == 1.0f);
    CHECK(tied[1].bits == 2);
    CHECK(tied[2].bits == 4);
    CHECK(tied[3].bits == -2);
}

TEST_CASE("int8 rows: a row whose max / 127 underflows stores zeros and scale 0, not NaN casts") {
    std::vector<float> tiny(head_dim, 0.0f);
    tiny[3] = std::numeric_limits<float>::denorm_min() * 50.0f;  // / 127 is below half the smallest subnormal: 0
    tiny[5] = -std::numeric_limits<float>::denorm_min();
    REQUIRE(tiny[3] / 127.0f == 0.0f);
    const std::vector<qint8> stored = quantise(tiny);
    CHECK(kvcache::row_scale_of(stored.data(), head_dim) == 0.0f);
    for (int d = 0; d < head_dim; ++d) CHECK(stored[d].bits == 0);
}

TEST_CASE("int8 rows: any NaN or infinity makes the row's scale NaN") {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
        std::vector<float> row(head_dim, 1.0f);
        row[17] = bad;
        const std::vector<qint8> stored = quantise(row);
        const float scale = kvcache::row_scale_of(stored.data(), head_dim);
        CHECK(std::isnan(scale));
        CHECK(std::isnan(double(stored[0].bits) * scale));  // every value of the row reads as NaN
    }
}

TEST_CASE("int8 rows: the scale sits unaligned after the values and is read back bit for bit") {
    std::vector<qint8> storage(1 + kvcache::row_elements<qint8>(head_dim));
    qint8* row = storage.data() + 1;  // not 4-aligned
    const float scale = 0.1234567f;
    kvcache::set_row_scale(row, head_dim, scale);
    CHECK(kvcache::row_scale_of(static_cast<const qint8*>(row), head_dim) == scale);
    float raw;
    std::memcpy(&raw, row + head_dim, sizeof raw);
    CHECK(raw == scale);
}
