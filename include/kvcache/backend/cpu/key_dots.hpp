// The score step that takes int8 keys as integers: each query row rounded
// once per walk to 16-bit codes, and the keys' bytes multiplied by them with
// AVX-512 VNNI's vpdpwssd, each row's scale applied once to the sums. tile_attention.hpp calls them in place of tile_scores
// (key_tiles.hpp) where they apply.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/key_tiles.hpp"
#include "kvcache/backend/cpu/simd.hpp"
#include "kvcache/core/int8.hpp"
#include "kvcache/core/stored_row.hpp"

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// True where int8 keys are scored with 16-bit integer dot products
/// (AVX-512 VNNI's vpdpwssd: 32 multiply-adds an instruction, the key bytes
/// widened once to 16 bits for every query row) instead of widening each key
/// vector to float and one FMA per row; the queries are rounded once per walk
/// to 16-bit codes with one scale per row (query_codes).
/// @tparam Key the stored element type of the key rows
/// @tparam Dim head dimension (whole 32-value chunks)
template <class Key, int Dim>
inline constexpr bool int8_key_dots_v = KVCACHE_CPU_AVX512_VNNI && std::is_same_v<Key, qint8> && Dim % 32 == 0;

/// Largest 16-bit query code: symmetric, so a code's negation is a code.
inline constexpr float query_code_limit = 32767.0f;

/// Rounds a query row (already times the softmax scale) to 16-bit codes:
/// row[d] ~ codes[d] * scale with scale = max|row| / 32767, so each value is
/// within scale / 2 of its code's and a logit moves by at most scale / 2 times
/// the key's 1-norm (about 1.5e-5 of max|q| x |k|_1, far under int8's own
/// rounding of the key). False, codes untouched, when the row is not finite:
/// such rows are scored in float, as the reference would.
/// @tparam Dim head dimension
template <int Dim>
bool quantise_query(const float* row, std::int16_t* codes, float& scale) noexcept {
    float largest = 0.0f;
    bool finite = true;  // tested value by value: std::max would pass a NaN over
    for (int d = 0; d < Dim; ++d) {
        const float magnitude = std::fabs(row[d]);
        finite = finite && magnitude <= std::numeric_limits<float>::max();
        largest = std::max(largest, magnitude);
    }
    if (!finite) return false;
    scale = largest / query_code_limit;
    const float inverse = largest > 0.0f ? query_code_limit / largest : 0.0f;
    for (int d = 0; d < Dim; ++d)
        codes[d] = std::int16_t(std::clamp(std::nearbyint(row[d] * inverse), -query_code_limit, query_code_limit));
    return true;
}

/// tile_scores for int8 keys with 16-bit integer dot products
/// (int8_key_dots_v): scores[r][t] = (codes_r . k_t) * code_scales[r] *
/// the row's scale (read as tile_scores reads it), the products exact in
/// 32-bit lanes, converted to float and summed as tile_scores sums. ahead as for tile_scores.
/// @tparam Rows query rows (at most row_block)
/// @tparam Dim head dimension
/// @tparam Value the stored type of the tile's value rows (not read)
/// @tparam Ahead the tile type of `ahead`
template <int Rows, int Dim, class Value, class Ahead = key_tile<qint8, Value>>
void tile_scores_int8_dots(const std::int16_t* codes, const float* code_scales, const key_tile<qint8, Value>& tile,
                           int keys, float* scores, const Ahead* ahead = nullptr) {
#if KVCACHE_CPU_AVX512_VNNI
    constexpr int step = 4;
    for (int t = 0; t < keys; t += step) {
        if (ahead)
            for (int j = 0; j < step && t + j < ahead->count; ++j) prefetch_key_row<Dim, decode_prefetch>(*ahead, t + j);
        __m512i accumulators[Rows][step];
        for (int r = 0; r < Rows; ++r)
            for (int j = 0; j < step; ++j) accumulators[r][j] = _mm512_setzero_si512();
        for (int c = 0; c < Dim / 32; ++c) {
            __m512i k[step];
            for (int j = 0; j < step; ++j)  // maskz: g++ 12 warns (-Werror) on the unmasked form's undefined source
                k[j] = _mm512_maskz_cvtepi8_epi16(
                    ~__mmask32(0), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile.keys[t + j] + c * 32)));
            for (int r = 0; r < Rows; ++r) {
                const __m512i q = _mm512_loadu_si512(static_cast<const void*>(codes + r * Dim + c * 32));
                for (int j = 0; j < step; ++j) accumulators[r][j] = _mm512_dpwssd_epi32(accumulators[r][j], q, k[j]);
            }
        }
        float key_scales[step];
        read_row_scales<Dim>(tile.keys, t, step, key_scales);
        for (int r = 0; r < Rows; ++r) {
            float16 sums[step];
            float factors[step];
            for (int j = 0; j < step; ++j) {
                sums[j] = {_mm512_maskz_cvtepi32_ps(0xffff, accumulators[r][j])};
                factors[j] = key_scales[j] * code_scales[r];
            }
            store_sums4(sums, factors, scores + r * tile_keys + t);
        }
    }
#else
    (void)codes, (void)code_scales, (void)tile, (void)keys, (void)scores, (void)ahead;
    static_assert(Dim < 0, "16-bit dot products are an AVX-512 VNNI path (int8_key_dots_v)");
#endif
}

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
