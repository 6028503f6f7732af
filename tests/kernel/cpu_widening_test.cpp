// The CPU kernels' vector loads (backend/cpu/simd.hpp) widen every code of
// every narrow storage type to exactly the float the type's own conversion
// gives, bit for bit: all 65,536 binary16 and bfloat16 codes (whose NaNs
// need only be NaNs of the same sign), all 256 codes of both fp8 formats and
// of int8 (NaNs with their payload: e4m3's is the canonical quiet NaN).
// Built three ways (portable, AVX2, -march=native): each build checks its own
// loads (the 8-lane ones, and the 16-lane ones where the build has AVX-512).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvcache/backend/cpu/simd.hpp"
#include "kvcache/core/int8.hpp"

using namespace kvcache;

namespace {

/// Every code of a storage type whose raw bits are `Bits`, in order.
template <class Element, class Bits>
std::vector<Element> every_code() {
    std::vector<Element> codes(std::size_t(1) << (8 * sizeof(Bits)));
    for (std::size_t i = 0; i < codes.size(); ++i) {
        const Bits raw = static_cast<Bits>(i);
        std::memcpy(static_cast<void*>(&codes[i]), &raw, sizeof raw);
    }
    return codes;
}

/// The float the type itself defines for a code (int8: the code, unscaled, as the loads give it).
template <class Element>
float exact(const Element& code) {
    if constexpr (std::is_same_v<Element, qint8>) return static_cast<float>(code.bits);
    else return static_cast<float>(code);
}

/// Loads codes Vec::lanes at a time and compares each lane with exact(); returns the mismatches.
template <class Vec, class Element>
int mismatches(const std::vector<Element>& codes) {
    int wrong = 0;
    float lanes[Vec::lanes];
    for (std::size_t first = 0; first + Vec::lanes <= codes.size(); first += Vec::lanes) {
        Vec::load(codes.data() + first).store(lanes);
        for (int i = 0; i < Vec::lanes; ++i) {
            const float want = exact(codes[first + i]), got = lanes[i];
            // A 16-bit NaN's payload is not promised (F16C keeps it, the software widening need
            // not): NaN and sign only. Every other code, fp8's and int8's NaN included, bit for bit.
            const bool loose_nan = sizeof(Element) == 2 && want != want;
            const bool same = loose_nan ? got != got && std::signbit(got) == std::signbit(want)
                                        : std::memcmp(&want, &got, sizeof want) == 0;
            if (!same && ++wrong <= 3)
                MESSAGE("code ", first + i, ": widened to ", got, ", the type gives ", want);
        }
    }
    return wrong;
}

template <class Element, class Bits>
void check_every_code(const char* name) {
    INFO(name);
    const auto codes = every_code<Element, Bits>();
    CHECK(mismatches<cpu::detail::float8>(codes) == 0);
#if KVCACHE_CPU_AVX512
    CHECK(mismatches<cpu::detail::float16>(codes) == 0);
#endif
}

}  // namespace

TEST_CASE("every code of every narrow type widens to the type's own float") {
    const std::string loads = KVCACHE_CPU_AVX512 ? "AVX-512 (8 and 16 lanes)" : KVCACHE_CPU_AVX2_FMA ? "AVX2 (8 lanes)" : "portable";
    MESSAGE("vector loads of this build: ", loads);
    check_every_code<half, std::uint16_t>("binary16");
    check_every_code<bfloat16, std::uint16_t>("bfloat16");
    check_every_code<float8_e4m3, std::uint8_t>("fp8 e4m3");
    check_every_code<float8_e5m2, std::uint8_t>("fp8 e5m2");
    check_every_code<qint8, std::uint8_t>("int8");
}
