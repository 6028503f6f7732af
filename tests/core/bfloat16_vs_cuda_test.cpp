// kvcache::bfloat16's host conversions against CUDA's own host implementation
// (cuda_bf16.h), over every encoding and over a dense sweep of floats.
#include <doctest/doctest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kvcache/core/bfloat16.hpp"

TEST_CASE("bfloat16 to float agrees with __bfloat162float for all 65536 encodings") {
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        __nv_bfloat16_raw raw;
        raw.x = static_cast<unsigned short>(bits);
        const float theirs = __bfloat162float(__nv_bfloat16(raw));
        const float ours = static_cast<float>(kvcache::bfloat16::from_bits(static_cast<std::uint16_t>(bits)));
        if (std::isnan(theirs)) {
            REQUIRE(std::isnan(ours));
        } else {
            REQUIRE(kvcache::detail::float_to_bits(ours) == kvcache::detail::float_to_bits(theirs));
        }
    }
}

TEST_CASE("float to bfloat16 agrees with __float2bfloat16_rn on a sweep of float encodings") {
    long long compared = 0;
    for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 97) {
        const float value = kvcache::detail::bits_to_float(static_cast<std::uint32_t>(bits));
        const __nv_bfloat16_raw theirs = __nv_bfloat16_raw(__float2bfloat16_rn(value));
        const kvcache::bfloat16 ours(value);
        if (std::isnan(value)) {
            REQUIRE((ours.bits & 0x7f80) == 0x7f80);
            REQUIRE((ours.bits & 0x7f) != 0);
        } else {
            REQUIRE(ours.bits == theirs.x);
        }
        ++compared;
    }
    CHECK(compared > 40000000);
}
