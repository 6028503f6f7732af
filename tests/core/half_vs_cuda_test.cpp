// kvcache::half's host conversions against CUDA's own host implementation,
// over every half encoding and over a dense sweep of floats.
#include <doctest/doctest.h>

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kvcache/core/half.hpp"

// cuda_fp16.h declares a global `half`, so kvcache::half is spelled out here.

TEST_CASE("half to float agrees with __half2float for all 65536 encodings") {
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        __half_raw raw;
        raw.x = static_cast<unsigned short>(bits);
        const float theirs = __half2float(__half(raw));
        const float ours = static_cast<float>(kvcache::half::from_bits(static_cast<std::uint16_t>(bits)));
        if (std::isnan(theirs)) {
            REQUIRE(std::isnan(ours));
        } else {
            REQUIRE(kvcache::detail::float_to_bits(ours) == kvcache::detail::float_to_bits(theirs));
        }
    }
}

TEST_CASE("float to half agrees with __float2half_rn on a sweep of float encodings") {
    // Every 97th float encoding covers every exponent and many mantissas of each.
    long long compared = 0;
    for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 97) {
        const float value = kvcache::detail::bits_to_float(static_cast<std::uint32_t>(bits));
        const __half_raw theirs = __half_raw(__float2half_rn(value));
        const kvcache::half ours(value);
        if (std::isnan(value)) {
            REQUIRE((ours.bits & 0x7c00) == 0x7c00);
            REQUIRE((ours.bits & 0x3ff) != 0);
        } else {
            REQUIRE(ours.bits == theirs.x);
        }
        ++compared;
    }
    CHECK(compared > 40000000);
}
