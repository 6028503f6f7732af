// Prefill attention as tiled matrix products: a block of query rows (query
// tokens x the GQA group, all on one KV head) against a tile of keys. The
// rows lie in vector lanes (queries, scores and outputs stored transposed,
// [dim][rows]), so S = Q K^T and O += P V are register-blocked outer-product
// kernels (a key or value element broadcast against a vector of rows, FMA
// over the head dimension) and the online softmax runs lane-wise over rows
// with no horizontal reductions. A 16-bit tile is widened to float once
// for all the block's rows. Decode keeps tile_attention.hpp: one token's few
// rows would leave most lanes empty here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/key_tiles.hpp"
#include "kvcache/backend/cpu/non_finite_rows.hpp"
#include "kvcache/backend/cpu/row_math.hpp"
#include "kvcache/backend/cpu/score_record.hpp"
#include "kvcache/backend/cpu/simd.hpp"
#include "kvcache/backend/cpu/vector_exp.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/kernels/softmax_math.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// The vector of rows the prefill kernels use: one row per lane.
#if KVCACHE_CPU_AVX512
using row_vector = float16;
#else
using row_vector = float8;
#endif

/// Accumulator registers a product kernel may hold: with 16 registers, 12
/// accumulators leave 3 row vectors and a broadcast; fewer leave the FMA
/// units waiting on their latency (measured: 8 ran no faster than the
/// row-by-row kernel of tile_attention.hpp). With 32 registers, 24 (3 row
/// vectors x 8 keys or dims) leave 3 row vectors, a broadcast and the rescale
/// factors, and each load serves more FMAs: with 192-row blocks about 1.25
/// times 4 x 4 with 128 rows on AVX-512 (docs/performance.md, issue 13).
inline constexpr int product_accumulators = vector_registers == 32 ? 24 : 12;

/// Row vectors one kernel call covers (3 x 16 rows on AVX-512, 3 x 8 otherwise).
inline constexpr int max_row_vectors = 3;

/// Query rows a prefill block aims at: several kernel passes' worth, so each
/// widened tile, its masks and the walk over the keys serve many rows (96
/// with AVX2; 192 with AVX-512, where 144 and more measured alike and 96
/// slower; the transposed queries and outputs, 96 KiB each at D = 128, stay in L2).
inline constexpr int prefill_block_rows = 4 * max_row_vectors * row_vector::lanes;

/// The largest of 8, 4, 2, 1 that is at most `budget` and divides n.
constexpr int dividing_step(int budget, int n) {
    for (int step = 8; step > 1; step /= 2)
        if (step <= budget && n % step == 0) return step;
    return 1;
}

#if KVCACHE_CPU_AVX2_FMA
#if KVCACHE_CPU_AVX512
#define KVCACHE_EXP_OP(name) _mm512_##name
#else
#define KVCACHE_EXP_OP(name) _mm256_##name
#endif
#endif

/// The softmax weights of a tile in one pass: x[t][r] = exp(x[t][r] -
/// base[r]) for t < count and r < stride (a multiple of row_vector::lanes),
/// and sums[r] = the sum over t of the new x[t][r], added in t order. One
/// pass instead of a subtraction, an exp and a sum pass each over the scores
/// (the same operations in the same order, so the same bits).
inline void exp_shifted_rows(float* x, int count, std::size_t stride, const float* base, float* sums) noexcept {
#if KVCACHE_CPU_AVX2_FMA
    constexpr std::size_t lanes = sizeof(exp_register) / sizeof(float);
    for (std::size_t r = 0; r < stride; r += lanes) {
        const exp_register shift = KVCACHE_EXP_OP(loadu_ps)(base + r);
        exp_register sum = KVCACHE_EXP_OP(setzero_ps)();
        for (int t = 0; t < count; ++t) {
            float* at = x + std::size_t(t) * stride + r;
            const exp_register weight = exp_vector(KVCACHE_EXP_OP(sub_ps)(KVCACHE_EXP_OP(loadu_ps)(at), shift));
            KVCACHE_EXP_OP(storeu_ps)(at, weight);
            sum = KVCACHE_EXP_OP(add_ps)(sum, weight);
        }
        KVCACHE_EXP_OP(storeu_ps)(sums + r, sum);
    }
#else
    for (int t = 0; t < count; ++t) {
        float* row = x + std::size_t(t) * stride;
        for (std::size_t r = 0; r < stride; ++r) row[r] -= base[r];
    }
    exp_rows(x, int(std::size_t(count) * stride));
    std::fill(sums, sums + stride, 0.0f);
    for (int t = 0; t < count; ++t) {
        const float* row = x + std::size_t(t) * stride;
        for (std::size_t r = 0; r < stride; ++r) sums[r] += row[r];
    }
#endif
}
#if KVCACHE_CPU_AVX2_FMA
#undef KVCACHE_EXP_OP
#endif

/// Keeps a loaded vector in a register: g++ otherwise folds each of its
/// uses into an FMA as a memory operand, which makes the product kernels
/// wait on loads instead of FMAs.
template <class Vec>
inline void keep_in_register(Vec& x) noexcept {
#if KVCACHE_CPU_AVX512 && defined(__GNUC__)
    asm("" : "+v"(x.v));
#elif KVCACHE_CPU_AVX2_FMA && defined(__GNUC__)
    asm("" : "+x"(x.v));
#else
    (void)x;
#endif
}

/// scores[t][rows] = sum_d queries[d][rows] * keys[t][d] for Keys keys and
/// Vectors row vectors; stride is the row count of the transposed arrays.
template <int Vectors, int Keys, int Dim>
void score_step(const float* queries, std::size_t stride, const float* const* keys, float* scores) {
    using vec = row_vector;
    vec accumulators[Keys][Vectors];
    for (int j = 0; j < Keys; ++j)
        for (int v = 0; v < Vectors; ++v) accumulators[j][v] = vec::zero();
    for (int d = 0; d < Dim; ++d) {
        vec q[Vectors];
        for (int v = 0; v < Vectors; ++v) {
            q[v] = vec::load(queries + d * stride + v * vec::lanes);
            keep_in_register(q[v]);
        }
        for (int j = 0; j < Keys; ++j) {
            const vec k = vec::broadcast(keys[j][d]);
            for (int v = 0; v < Vectors; ++v) accumulators[j][v] = fma(q[v], k, accumulators[j][v]);
        }
    }
    for (int j = 0; j < Keys; ++j)
        for (int v = 0; v < Vectors; ++v) accumulators[j][v].store(scores + j * stride + v * vec::lanes);
}

/// Scores of Vectors row vectors against the first `count` keys.
template <int Vectors, int Dim>
void score_rows(const float* queries, std::size_t stride, const float* const* keys, int count, float* scores) {
    constexpr int step = std::min(8, product_accumulators / Vectors);
    int t = 0;
    for (; t + step <= count; t += step) score_step<Vectors, step, Dim>(queries, stride, keys + t, scores + t * stride);
    for (; t < count; ++t) score_step<Vectors, 1, Dim>(queries, stride, keys + t, scores + t * stride);
}

/// outputs[d][rows] = outputs[d][rows] * rescale[rows] + sum_t weights[t][rows] * values[t][d]
/// for Vectors row vectors over the first `count` keys.
template <int Vectors, int Dim>
void value_rows(const float* weights, std::size_t stride, const float* rescale, const float* const* values, int count,
                float* outputs) {
    using vec = row_vector;
    constexpr int step = dividing_step(product_accumulators / Vectors, Dim);  // dims per pass
    vec factor[Vectors];
    for (int v = 0; v < Vectors; ++v) factor[v] = vec::load(rescale + v * vec::lanes);
    for (int d = 0; d < Dim; d += step) {
        vec sums[step][Vectors];
        for (int i = 0; i < step; ++i)
            for (int v = 0; v < Vectors; ++v)
                sums[i][v] = vec::load(outputs + (d + i) * stride + v * vec::lanes) * factor[v];
        for (int t = 0; t < count; ++t) {
            vec p[Vectors];
            for (int v = 0; v < Vectors; ++v) {
                p[v] = vec::load(weights + t * stride + v * vec::lanes);
                keep_in_register(p[v]);
            }
            for (int i = 0; i < step; ++i) {
                const vec x = vec::broadcast(values[t][d + i]);
                for (int v = 0; v < Vectors; ++v) sums[i][v] = fma(p[v], x, sums[i][v]);
            }
        }
        for (int i = 0; i < step; ++i)
            for (int v = 0; v < Vectors; ++v) sums[i][v].store(outputs + (d + i) * stride + v * vec::lanes);
    }
}

/// Calls f with std::integral_constant<int, n> for n in 1..max_row_vectors (3).
template <class F>
void with_row_vectors(int n, F&& f) {
    static_assert(max_row_vectors == 3, "one case per row-vector count");
    switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 3>{}); break;
    }
}

/// The online-softmax state of `rows` query rows of head dimension Dim
/// sharing one KV head, kept transposed (rows in lanes), and the loop that
/// folds that head's keys into them as tiled products.
/// @tparam Dim head dimension
template <int Dim>
class prefill_block {
public:
    explicit prefill_block(int rows)
        : rows_(rows),
          stride_(std::size_t(rows + row_vector::lanes - 1) / row_vector::lanes * row_vector::lanes),
          queries_(stride_ * Dim, 0.0f), outputs_(stride_ * Dim, 0.0f), scores_(stride_ * tile_keys),
          state_(stride_ * 5), positions_(rows), masks_(std::size_t(rows) * (prefetch_tiles + 1)) {
        std::fill(running_max(), running_max() + stride_, kvcache::detail::negative_infinity());
        std::fill(running_sum(), running_sum() + stride_, 0.0f);
    }

    /// Loads query row r, multiplied by the softmax scale, at logical position `position`.
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Query>
    void load(int r, const Query* query, float scale, int position) {
        for (int d = 0; d < Dim; ++d) queries_[d * stride_ + r] = to_float(query[d]) * scale;
        positions_[r] = position;
    }

    /// Folds the visible keys [begin, end) of (sequence, kv_head) into every
    /// row; a row sees a key when view.visibility() allows it at the row's
    /// position. Tiles no row sees are neither fetched nor computed, and the
    /// walk ends at the first key past every row's position. record (nullable)
    /// keeps the weights of the rows it lists.
    /// @tparam Layout a layout view over host memory
    template <class Layout>
    void attend(const Layout& view, int sequence, int kv_head, int begin, int end, float soft_cap,
                score_record* record = nullptr) {
        using tile = tile_of_t<Layout>;
        constexpr int ring = prefetch_tiles + 1;
        const attention_visibility visibility = view.visibility();
        lowest_position_ = *std::min_element(positions_.begin(), positions_.end());
        highest_position_ = *std::max_element(positions_.begin(), positions_.end());
        tile_cursor<Layout> cursor(view, sequence, kv_head, begin, end, highest_position_);
        auto next_seen = [&](tile& tile, std::uint32_t* masks) {
            while (cursor.fill(tile))
                if (visibility_masks(tile, visibility, masks)) return true;
            return false;
        };
        // A ring of tiles: the one computed now and the ones whose rows were
        // asked of memory ahead of it, as in tile_attention.
        tile tiles[ring];
        int filled = 0;
        while (filled < ring && next_seen(tiles[filled], slot_masks(filled))) {
            if (filled > 0) prefetch_tile<Dim, prefetch_into::l1>(tiles[filled]);
            ++filled;
        }
        for (int current = 0; filled > 0; current = (current + 1) % ring, --filled) {
            fold(tiles[current], slot_masks(current), soft_cap, record);
            if (filled == ring && next_seen(tiles[current], slot_masks(current))) {
                prefetch_tile<Dim, prefetch_into::l1>(tiles[current]);
                ++filled;
            }
        }
    }

    /// Writes row r normalised and times output_scale (an fp8 cache's value
    /// scale; zeros when it saw no key) and, when lse is not null, its
    /// log-sum-exp (-inf when it saw no key).
    /// @tparam Output float, kvcache::half or kvcache::bfloat16
    template <class Output>
    void store(int r, Output* output, float* lse, float output_scale = 1.0f) const {
        const float sum = state_[stride_ + r];
        const float inverse = sum > 0.0f ? output_scale / sum : 0.0f;
        for (int d = 0; d < Dim; ++d) output[d] = from_float<Output>(outputs_[d * stride_ + r] * inverse);
        if (lse) *lse = kvcache::detail::log_sum_exp(state_[r], sum);
    }

    /// Row r's log-sum-exp so far (-inf when it saw no key).
    float lse(int r) const { return kvcache::detail::log_sum_exp(state_[r], state_[stride_ + r]); }

private:
    // state_: running max, running sum, rescale, the tile's max and its sum, [stride_] each.
    float* running_max() noexcept { return state_.data(); }
    float* running_sum() noexcept { return state_.data() + stride_; }
    float* rescale() noexcept { return state_.data() + 2 * stride_; }
    float* tile_max() noexcept { return state_.data() + 3 * stride_; }
    float* tile_sum() noexcept { return state_.data() + 4 * stride_; }
    std::uint32_t* slot_masks(int slot) noexcept { return masks_.data() + std::size_t(slot) * rows_; }

    /// Bit t of masks[r]: row r sees key t of the tile. True when any row sees any key.
    template <class Tile>
    bool visibility_masks(const Tile& tile, const attention_visibility& visibility,
                          std::uint32_t* masks) const {
        // Keys ascend by position within a tile: when the last is at or
        // before every row and no window cuts any of them (every tile before
        // the causal diagonal), every row sees the whole tile.
        const int first_key = tile.positions[0], last_key = tile.positions[tile.count - 1];
        if (last_key <= lowest_position_ &&
            (visibility.window <= 0 || last_key < visibility.sinks ||
             first_key > highest_position_ - visibility.window)) {
            std::fill(masks, masks + rows_, tile.count == 32 ? ~0u : (1u << tile.count) - 1u);
            return true;
        }
        std::uint32_t any = 0;
        for (int r = 0; r < rows_; ++r) {
            if (r > 0 && positions_[r] == positions_[r - 1]) {  // the rows of one token (a GQA group) share it
                masks[r] = masks[r - 1];
                continue;
            }
            std::uint32_t mask = 0;
            for (int t = 0; t < tile.count; ++t)
                mask |= std::uint32_t(visibility.allows(positions_[r], tile.positions[t])) << t;
            masks[r] = mask;
            any |= mask;
        }
        return any != 0;
    }

    /// Float row pointers of the tile's keys and values: a 16-bit, fp8 or
    /// int8 tile is widened once here, for every row of the block (int8
    /// without its row scales, which fold applies; int4 dequantised whole,
    /// group scales and minima included); a kv_elements pair's sides each as its type asks.
    template <class Key, class Value>
    void float_rows(const key_tile<Key, Value>& tile, const float** keys, const float** values) {
        if constexpr (!std::is_same_v<Key, float> || !std::is_same_v<Value, float>)
            if (widened_.empty()) widened_.resize(std::size_t(2) * tile_keys * Dim);
        for (int t = 0; t < tile.count; ++t) {
            keys[t] = float_row(tile.keys[t], widened_.data() + std::size_t(t) * Dim);
            values[t] = float_row(tile.values[t], widened_.data() + std::size_t(tile_keys + t) * Dim);
        }
    }

    /// A stored row as float: the row itself for float, else widened into `room` (Dim floats).
    template <class Element>
    static const float* float_row(const Element* row, float* room) {
        if constexpr (std::is_same_v<Element, float>) {
            (void)room;
            return row;
        } else {
            using vec = typename vector_for<Dim % 8 == 0 ? Dim : 8>::type;
            if constexpr (std::is_same_v<Element, qint4>) {
                dequantise_row<Dim>(row, room);
            } else if constexpr (Dim % 8 == 0) {
                for (int d = 0; d < Dim; d += vec::lanes) vec::load(row + d).store(room + d);
            } else {
                widen(row, room, Dim);
            }
            return room;
        }
    }

    /// One tile into every row: S = Q K^T, the mask and soft cap, the
    /// online-softmax update lane-wise over rows, then O = O * rescale + P V.
    template <class Key, class Value>
    void fold(const key_tile<Key, Value>& tile, const std::uint32_t* masks, float soft_cap, score_record* record) {
        const float minus_infinity = kvcache::detail::negative_infinity();
        const int count = tile.count;
        const float* keys[tile_keys];
        const float* values[tile_keys];
        float_rows(tile, keys, values);
        const std::size_t stride = stride_;
        float* const scores = scores_.data();
        constexpr int chunk_rows = max_row_vectors * row_vector::lanes;
        for (std::size_t r0 = 0; r0 < stride; r0 += chunk_rows) {
            const int vectors = int(std::min<std::size_t>(chunk_rows, stride - r0) / row_vector::lanes);
            with_row_vectors(vectors, [&](auto n) {
                score_rows<decltype(n)::value, Dim>(queries_.data() + r0, stride, keys, count, scores + r0);
            });
        }
        tile_scales scales;  // a qint8 side's row scales: each key's scores times its K scale
        if constexpr (has_row_scales_v<Key> || has_row_scales_v<Value>) read_tile_scales<Dim>(tile, scales);
        if constexpr (has_row_scales_v<Key>) scale_key_rows(scores, count, stride, scales.keys);
        if (soft_cap > 0.0f)
            for (int t = 0; t < count; ++t)
                for (int r = 0; r < rows_; ++r)
                    scores[t * stride + r] = kvcache::detail::apply_soft_cap(scores[t * stride + r], soft_cap);
        // Only tiles some row sees in part (the causal diagonal, a window's
        // edge) are masked; the padding rows past rows_ are never read back.
        const std::uint32_t full = full_tile_mask(count);
        bool partly_seen = false;
        for (int r = 0; r < rows_; ++r) {
            const std::uint32_t mask = masks[r];
            if (mask == full) continue;
            partly_seen = true;
            for (int t = 0; t < count; ++t)
                if (!((mask >> t) & 1u)) scores[t * stride + r] = minus_infinity;
        }
        // The softmax, lane-wise over rows: loops g++ vectorises without intrinsics.
        float* const old_max = running_max();
        float* const new_max = tile_max();
        float* const factor = rescale();
        float* const added = tile_sum();
        std::copy(old_max, old_max + stride, new_max);
        for (int t = 0; t < count; ++t) {
            const float* row = scores + t * stride;
            for (std::size_t r = 0; r < stride; ++r) new_max[r] = new_max[r] < row[r] ? row[r] : new_max[r];
        }
        // A row that has seen nothing yet keeps max -inf; subtracting 0 instead
        // keeps its exps at 0 rather than exp(-inf + inf) = NaN.
        for (std::size_t r = 0; r < stride; ++r) {
            const float base = new_max[r] == minus_infinity ? 0.0f : new_max[r];
            factor[r] = old_max[r] - base;
            old_max[r] = new_max[r];
            new_max[r] = base;
        }
        exp_rows(factor, int(stride));
        exp_shifted_rows(scores, count, stride, new_max, added);
        float* const sum = running_sum();
        for (std::size_t r = 0; r < stride; ++r) sum[r] = sum[r] * factor[r] + added[r];
        // The weights are relative to the base just subtracted (0 for a row that saw nothing yet).
        if (record) record->add(tile.first_visible, count, scores, 1, stride, new_max);
        // The V scales fold into the weights, after the sums and the record took them unscaled.
        if constexpr (has_row_scales_v<Value>) scale_key_rows(scores, count, stride, scales.values);
        // A NaN or infinite value row of a tile some row sees in part
        // (non_finite_rows.hpp) is left out of the products, its weight 0
        // for the rows that do not see it, and added after to those that do.
        const std::uint32_t non_finite = partly_seen ? non_finite_values<Dim>(tile) : 0u;
        const float* patched_values[tile_keys] = {};
        const float* const* product_values = values;
        if (non_finite != 0) {
            for (int t = 0; t < count; ++t) {
                const bool hidden = (non_finite >> t) & 1u;
                patched_values[t] = hidden ? zero_row<Dim, float>() : values[t];
                if (hidden)
                    for (int r = 0; r < rows_; ++r)
                        if (!((masks[r] >> t) & 1u)) scores[t * stride + r] = 0.0f;
            }
            product_values = patched_values;
        }
        for (std::size_t r0 = 0; r0 < stride; r0 += chunk_rows) {
            const int vectors = int(std::min<std::size_t>(chunk_rows, stride - r0) / row_vector::lanes);
            with_row_vectors(vectors, [&](auto n) {
                value_rows<decltype(n)::value, Dim>(scores + r0, stride, factor + r0, product_values, count,
                                                    outputs_.data() + r0);
            });
        }
        for (int t = 0; t < count; ++t)
            if ((non_finite >> t) & 1u)
                for (int r = 0; r < rows_; ++r)
                    if ((masks[r] >> t) & 1u)
                        for (int d = 0; d < Dim; ++d)
                            outputs_[d * stride + r] += scores[t * stride + r] * values[t][d];
    }

    /// x[t][rows] *= factors[t] for the first `count` keys: one scale per stored row.
    static void scale_key_rows(float* x, int count, std::size_t stride, const float* factors) noexcept {
        for (int t = 0; t < count; ++t) {
            float* row = x + std::size_t(t) * stride;
            const float factor = factors[t];
            for (std::size_t r = 0; r < stride; ++r) row[r] *= factor;
        }
    }

    int rows_;
    std::size_t stride_;               ///< rows_ rounded up to whole row vectors
    std::vector<float> queries_;       ///< [Dim][stride_], scaled
    std::vector<float> outputs_;       ///< [Dim][stride_], unnormalised
    std::vector<float> scores_;        ///< [tile_keys][stride_]: scores, then weights
    std::vector<float> state_;         ///< see running_max()
    std::vector<int> positions_;       ///< [rows_]
    int lowest_position_ = 0, highest_position_ = 0;  ///< over positions_, set by attend
    std::vector<std::uint32_t> masks_; ///< [ring slot][rows_]
    std::vector<float> widened_;       ///< [2][tile_keys][Dim] float copies of a 16-bit tile's K and V rows
};

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
