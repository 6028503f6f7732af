// The score steps that take int8 and int4 keys as integers: each query
// row rounded once per walk to 16-bit codes, and the keys' bytes multiplied
// by them with AVX-512 VNNI's vpdpwssd, each row's or group's scale applied
// once to the sums. tile_attention.hpp calls them in place of tile_scores
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
#include "kvcache/core/int4.hpp"
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

#if KVCACHE_CPU_AVX512_VNNI
/// The start of an integer score step over keys t .. t + Step - 1: asks
/// memory for the K rows of the same slots of `ahead` (nullable; as
/// tile_scores does) and zeroes the step's sums.
/// @tparam Dim head dimension
/// @tparam Rows query rows
/// @tparam Step keys a step
/// @tparam Ahead the tile type of `ahead`
template <int Dim, int Rows, int Step, class Ahead>
void start_integer_step(const Ahead* ahead, int t, __m512i (&sums)[Rows][Step]) noexcept {
    if (ahead)
        for (int j = 0; j < Step && t + j < ahead->count; ++j) prefetch_key_row<Dim, decode_prefetch>(*ahead, t + j);
    for (int r = 0; r < Rows; ++r)
        for (int j = 0; j < Step; ++j) sums[r][j] = _mm512_setzero_si512();
}
#endif

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
        __m512i accumulators[Rows][step];
        start_integer_step<Dim>(ahead, t, accumulators);
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

/// True where int4 keys are scored with 16-bit integer dot products
/// (vpdpwssd, as int8_key_dots_v): each code byte is zero-extended to 16
/// bits once for every query row and split into its two nibbles by a mask
/// and a shift, where the float path converts every code and multiplies it
/// by its group's scale and adds the minimum before the rows' FMAs. A
/// group's scale applies to its lanes of the sum and its minimum to the
/// query's sum over the group, once a key and row. Head dimensions of two or
/// four groups, whose code bytes fill one or two 32-word vectors with every
/// 32-bit lane in a single group (int4_dot_byte).
/// @tparam Key the stored element type of the key rows
/// @tparam Dim head dimension
template <class Key, int Dim>
inline constexpr bool int4_key_dots_v = KVCACHE_CPU_AVX512_VNNI && std::is_same_v<Key, qint4> &&
                                        (Dim == 2 * qint4_group_size || Dim == 4 * qint4_group_size);

/// Where word p of 32-word code vector v of an int4 row takes its code
/// byte from, as the byte's index within group `group`. Lane p / 2 of the
/// sums then holds group (p / 2) / (16 / groups) alone: with four groups a
/// vector takes 8 bytes of each (the row's 64-bit words 0, 2, 4, 6 or 1, 3,
/// 5, 7), with two a vector is the row's 32 bytes in order.
/// @tparam Dim head dimension (int4_key_dots_v)
template <int Dim>
constexpr int int4_dot_byte(int v, int p, int& group) noexcept {
    constexpr int lanes_per_group = 16 / (Dim / qint4_group_size);
    const int lane = p / 2;
    group = lane / lanes_per_group;
    return v * 2 * lanes_per_group + 2 * (lane % lanes_per_group) + p % 2;
}

/// Rounds a query row (d order) to 16-bit codes as quantise_query does, in
/// the order tile_scores_int4_dots reads them (for each code vector v: 32
/// codes of the low nibbles' values, then 32 of the high ones'), and sets
/// minimum_weights (16 floats) so that a key row's group records, widened,
/// times them and times `scale` give sum_g minimum_g * (sum of the rounded
/// row over group g): the record's minimum of group g sits at half 2g + 1.
/// False, as quantise_query, when the row is not finite.
/// @tparam Dim head dimension (int4_key_dots_v)
template <int Dim>
bool quantise_query_int4_dots(const float* row, std::int16_t* codes, float* minimum_weights, float& scale) noexcept {
    std::int16_t in_order[Dim];
    if (!quantise_query<Dim>(row, in_order, scale)) return false;
    for (int v = 0; v < Dim / 64; ++v)
        for (int p = 0; p < 32; ++p) {
            int group = 0;
            const int byte = int4_dot_byte<Dim>(v, p, group);
            codes[v * 64 + p] = in_order[group * qint4_group_size + 2 * byte];           // even d: low nibble
            codes[v * 64 + 32 + p] = in_order[group * qint4_group_size + 2 * byte + 1];  // odd d: high nibble
        }
    // The minima meet the codes' own sum over each group, not the row's: the
    // score is then that of the rounded row, exactly, whose error is
    // sum_d (row[d] - code[d] * scale) * k[d], as for int8 keys. The row's
    // own sum would leave that rounding times (k[d] - minimum), up to a
    // group's whole range (several times |k| in a group with an outlier).
    std::fill(minimum_weights, minimum_weights + 16, 0.0f);
    for (int g = 0; g < Dim / qint4_group_size; ++g) {
        int total = 0;  // at most 32 x 32767: exact in a float
        for (int d = g * qint4_group_size; d < (g + 1) * qint4_group_size; ++d) total += in_order[d];
        minimum_weights[2 * g + 1] = float(total);
    }
    return true;
}

/// tile_scores for int4 keys with 16-bit integer dot products
/// (int4_key_dots_v): with s_g, m_g the key's group records, scores[r][t] =
/// code_scales[r] * (sum over lanes of (codes_r . k_t)'s lane times its
/// group's s_g + sum_g m_g * minimum_weights[r][2g + 1]); the integer sums are
/// exact (at most 8 products of 15 x 32767 a lane) and converted once.
/// ahead as for tile_scores.
/// @tparam Rows query rows (at most row_block)
/// @tparam Dim head dimension
/// @tparam Value the stored type of the tile's value rows (not read)
/// @tparam Ahead the tile type of `ahead`
template <int Rows, int Dim, class Value, class Ahead = key_tile<qint4, Value>>
void tile_scores_int4_dots(const std::int16_t* codes, const float* code_scales, const float* minimum_weights,
                           const key_tile<qint4, Value>& tile, int keys, float* scores, const Ahead* ahead = nullptr) {
#if KVCACHE_CPU_AVX512_VNNI
    constexpr int groups = Dim / qint4_group_size, vectors = groups / 2, lanes_per_group = 16 / groups;
    constexpr int step = 4;
    // Lane L of a key's sums takes its group's scale, half 2 (L / lanes_per_group) of the records.
    alignas(64) static constexpr std::int32_t spread[16] = {
        2 * (0 / lanes_per_group),  2 * (1 / lanes_per_group),  2 * (2 / lanes_per_group),  2 * (3 / lanes_per_group),
        2 * (4 / lanes_per_group),  2 * (5 / lanes_per_group),  2 * (6 / lanes_per_group),  2 * (7 / lanes_per_group),
        2 * (8 / lanes_per_group),  2 * (9 / lanes_per_group),  2 * (10 / lanes_per_group), 2 * (11 / lanes_per_group),
        2 * (12 / lanes_per_group), 2 * (13 / lanes_per_group), 2 * (14 / lanes_per_group), 2 * (15 / lanes_per_group)};
    const __m512i spread_index = _mm512_load_si512(static_cast<const void*>(spread));
    const __m512i nibble = _mm512_set1_epi16(0xf);
    for (int t = 0; t < keys; t += step) {
        __m512i accumulators[Rows][step];
        start_integer_step<Dim>(ahead, t, accumulators);
        for (int j = 0; j < step; ++j) {
            const void* const row = static_cast<const void*>(tile.keys[t + j]);
            __m512i words[vectors];  // maskz forms: g++ 12 warns (-Werror) on the unmasked ones' undefined source
            if constexpr (vectors == 1) {
                words[0] = _mm512_maskz_cvtepu8_epi16(~__mmask32(0), _mm256_loadu_si256(static_cast<const __m256i*>(row)));
            } else {
                const __m512i bytes = _mm512_maskz_permutexvar_epi64(0xff, _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0),
                                                                     _mm512_loadu_si512(row));
                words[0] = _mm512_maskz_cvtepu8_epi16(~__mmask32(0), _mm512_maskz_extracti64x4_epi64(0xf, bytes, 0));
                words[1] = _mm512_maskz_cvtepu8_epi16(~__mmask32(0), _mm512_maskz_extracti64x4_epi64(0xf, bytes, 1));
            }
            for (int v = 0; v < vectors; ++v) {
                const __m512i low = _mm512_and_si512(words[v], nibble);
                const __m512i high = _mm512_maskz_srli_epi16(~__mmask32(0), words[v], 4);
                for (int r = 0; r < Rows; ++r) {
                    const std::int16_t* const row_codes = codes + r * Dim + v * 64;
                    accumulators[r][j] = _mm512_dpwssd_epi32(
                        accumulators[r][j], _mm512_loadu_si512(static_cast<const void*>(row_codes)), low);
                    accumulators[r][j] = _mm512_dpwssd_epi32(
                        accumulators[r][j], _mm512_loadu_si512(static_cast<const void*>(row_codes + 32)), high);
                }
            }
        }
        __m512 records[step], scales[step];
        for (int j = 0; j < step; ++j) {
            const void* const record = static_cast<const void*>(tile.keys[t + j] + qint4_code_bytes(Dim));
            const __m128i halves = groups == 2 ? _mm_loadl_epi64(static_cast<const __m128i*>(record))
                                               : _mm_loadu_si128(static_cast<const __m128i*>(record));
            records[j] = _mm512_maskz_cvtph_ps(0xffff, _mm256_zextsi128_si256(halves));  // halves past the records: 0
            scales[j] = _mm512_maskz_permutexvar_ps(0xffff, spread_index, records[j]);
        }
        for (int r = 0; r < Rows; ++r) {
            const __m512 weights = _mm512_loadu_ps(minimum_weights + r * 16);
            float16 sums[step];
            float factors[step];
            for (int j = 0; j < step; ++j) {
                sums[j] = {_mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, accumulators[r][j]), scales[j],
                                           _mm512_mul_ps(records[j], weights))};
                factors[j] = code_scales[r];
            }
            store_sums4(sums, factors, scores + r * tile_keys + t);
        }
    }
#else
    (void)codes, (void)code_scales, (void)minimum_weights, (void)tile, (void)keys, (void)scores, (void)ahead;
    static_assert(Dim < 0, "16-bit dot products are an AVX-512 VNNI path (int4_key_dots_v)");
#endif
}

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
