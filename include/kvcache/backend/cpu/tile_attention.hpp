// One work item of the CPU attention: query rows that share a KV head (the
// query heads of a GQA group in decode; query tokens x group in prefill),
// each at its own position, stream that head's visible keys once, tile by
// tile, with the FP32 online softmax. Decode and prefill differ only in which
// rows they load and at which positions.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/key_dots.hpp"
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

static_assert(tile_keys <= 32, "a tile's visibility is one 32-bit mask per query row");
static_assert(tile_keys % exp_lanes == 0, "a tile's scores are exponentiated in whole vectors");

/// Tiles of a decode walk in flight: the one computed and the next, whose
/// rows the score step asks of memory key by key (tile_scores' `ahead`).
inline constexpr int decode_ring = 2;

/// Query rows above which a binary16 tile is widened once into float rows
/// instead of on every load: past two row blocks, each key row would be
/// converted three times or more.
inline constexpr int widen_tile_rows = 2 * row_block;

/// What a walk over one KV head's keys may do beyond them, when walks of
/// several heads follow one another (decode over pages that interleave heads):
/// ask memory for the first tile of the next walk while folding its own last
/// tile, and leave its own first tile unasked when the walk before asked for it.
struct walk_links {
    int next_kv_head = -1;          ///< the KV head of the next walk (same sequence); -1: none
    int next_begin = 0;             ///< the next walk's visible keys [next_begin, next_end)
    int next_end = 0;
    bool first_tile_asked = false;  ///< the walk before asked for this walk's first tile
};

/// The online-softmax state of `rows` query rows of head dimension Dim that
/// share one KV head, and the loop that folds that head's keys into them.
/// @tparam Dim head dimension (a multiple of 8)
template <int Dim>
class tile_attention {
public:
    explicit tile_attention(int rows)
        : rows_(rows), floats_(std::size_t(rows) * (2 * Dim + tile_keys + 3)), positions_(rows),
          masks_(std::size_t(rows) * decode_ring) {
        std::fill(running_max(), running_max() + rows, kvcache::detail::negative_infinity());
    }

    /// Loads query row r, multiplied by the softmax scale, at logical position `position`.
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Query>
    void load(int r, const Query* query, float scale, int position) {
        float* row = queries() + std::size_t(r) * Dim;
        for (int d = 0; d < Dim; ++d) row[d] = to_float(query[d]) * scale;
        if constexpr (nibble_order_possible)
            if (queries_in_nibble_order_) reorder_row(row, /*to_nibble_order=*/true);
        positions_[r] = position;
        query_codes_current_ = false;
    }

    /// Folds the visible keys [begin, end) of (sequence, kv_head) into every
    /// row; a row sees a key when view.visibility() allows it at the row's
    /// position. Tiles no row sees are neither fetched nor computed, and the
    /// walk ends at the first key past every row's position. record (nullable)
    /// keeps the weights of the rows it lists. Calls over consecutive key
    /// ranges fold into the same state.
    /// @tparam Layout a layout view over host memory
    template <class Layout>
    void attend(const Layout& view, int sequence, int kv_head, int begin, int end, float soft_cap,
                score_record* record = nullptr, walk_links links = {}) {
        using tile = tile_of_t<Layout>;
        // The walk reads int4 rows in nibble order: the queries (int4 keys)
        // and the accumulators (int4 values) take it at the first walk and
        // keep it (load and store translate), so walks in blocks pay it once.
        if constexpr (int4_nibble_order_v<typename tile::key_type, Dim>) {
            if (!queries_in_nibble_order_) reorder_rows(queries(), /*to_nibble_order=*/true);
            queries_in_nibble_order_ = true;
        }
        if constexpr (int4_nibble_order_v<typename tile::value_type, Dim>) {
            if (!accumulators_in_nibble_order_) reorder_rows(accumulators(), /*to_nibble_order=*/true);
            accumulators_in_nibble_order_ = true;
        }
        // int8 keys: one row (MHA) is scored in float (see fold), no codes to take.
        if constexpr (int8_key_dots_v<typename tile::key_type, Dim>)
            if (rows_ > 1 && !query_codes_current_) quantise_queries<typename tile::key_type>();
        if constexpr (int4_key_dots_v<typename tile::key_type, Dim>)
            if (!query_codes_current_) quantise_queries<typename tile::key_type>();
        walk(view, sequence, kv_head, begin, end, soft_cap, record, links);
    }

    /// Writes row r normalised and times output_scale (an fp8 cache's value
    /// scale; zeros when it saw no key) and, when lse is not null, its
    /// log-sum-exp (-inf when it saw no key).
    /// @tparam Output float, kvcache::half or kvcache::bfloat16
    template <class Output>
    void store(int r, Output* output, float* lse, float output_scale = 1.0f) const {
        const float sum = running_sum()[r];
        const float inverse = sum > 0.0f ? output_scale / sum : 0.0f;
        const float* row = accumulators() + std::size_t(r) * Dim;
        [[maybe_unused]] float in_order[Dim];
        if constexpr (nibble_order_possible) {
            if (accumulators_in_nibble_order_) {
                std::copy(row, row + Dim, in_order);
                reorder_row(in_order, /*to_nibble_order=*/false);
                row = in_order;
            }
        }
        for (int d = 0; d < Dim; ++d) output[d] = from_float<Output>(row[d] * inverse);
        if (lse) *lse = kvcache::detail::log_sum_exp(running_max()[r], sum);
    }

    /// Row r's log-sum-exp so far (-inf when it saw no key).
    float lse(int r) const { return kvcache::detail::log_sum_exp(running_max()[r], running_sum()[r]); }

private:
    /// True where int4 rows of this head dimension are walked in nibble order,
    /// so the nibble-order flags below can be set at all (the reorder is only
    /// defined for whole groups of 32).
    static constexpr bool nibble_order_possible = int4_nibble_order_v<qint4, Dim>;

    // floats_: queries [rows][Dim], accumulators [rows][Dim], scores
    // [rows][tile_keys], running max, running sum and rescale [rows] each.
    float* queries() noexcept { return floats_.data(); }
    float* accumulators() noexcept { return floats_.data() + std::size_t(rows_) * Dim; }
    const float* accumulators() const noexcept { return floats_.data() + std::size_t(rows_) * Dim; }
    float* scores() noexcept { return floats_.data() + std::size_t(rows_) * 2 * Dim; }
    float* running_max() noexcept { return scores() + std::size_t(rows_) * tile_keys; }
    const float* running_max() const noexcept { return floats_.data() + std::size_t(rows_) * (2 * Dim + tile_keys); }
    float* running_sum() noexcept { return running_max() + rows_; }
    const float* running_sum() const noexcept { return running_max() + rows_; }
    float* rescale() noexcept { return running_sum() + rows_; }
    std::uint32_t* slot_masks(int slot) noexcept { return masks_.data() + std::size_t(slot) * rows_; }

    /// attend's walk over the tiles, rows in the order the loads give them.
    template <class Layout>
    void walk(const Layout& view, int sequence, int kv_head, int begin, int end, float soft_cap,
              score_record* record, walk_links links) {
        using tile = tile_of_t<Layout>;
        const attention_visibility visibility = view.visibility();
        const int last_position = *std::max_element(positions_.begin(), positions_.end());
        tile_cursor<Layout> cursor(view, sequence, kv_head, begin, end, last_position);
        auto next_seen = [&](tile& tile, std::uint32_t* masks) {
            while (cursor.fill(tile))
                if (visibility_masks(tile, visibility, masks)) return true;
            return false;
        };
        // Two tiles: the one computed now and the next, asked of memory
        // while the current one is folded. The first is asked at once.
        tile tiles[decode_ring];
        tile following;  // the next walk's first tile, asked during this walk's last
        auto next_walk_first = [&] {
            return links.next_kv_head >= 0 &&
                   tile_cursor<Layout>(view, sequence, links.next_kv_head, links.next_begin, links.next_end,
                                       last_position)
                       .fill(following);
        };
        if (!next_seen(tiles[0], slot_masks(0))) {
            if (next_walk_first()) prefetch_tile<Dim, decode_prefetch>(following);  // the next walk counts on it
            return;
        }
        if (!links.first_tile_asked) prefetch_tile<Dim, decode_prefetch>(tiles[0]);
        for (int current = 0;; current ^= 1) {
            const int next = current ^ 1;
            const bool more = next_seen(tiles[next], slot_masks(next));
            const tile* ahead = more ? &tiles[next] : nullptr;
            if (!more && next_walk_first()) ahead = &following;
            // 16-bit and fp8 rows past two row blocks; int8 and int4 rows are
            // always read in place, their widening costs a few instructions a
            // vector and their scales stay per row (int4: per group, load_int4).
            if constexpr (widens_v<typename tile::key_type> || widens_v<typename tile::value_type>) {
                if (rows_ > widen_tile_rows) {
                    fold(widened(tiles[current]), slot_masks(current), soft_cap, record, ahead);
                } else {
                    fold(tiles[current], slot_masks(current), soft_cap, record, ahead);
                }
            } else {
                fold(tiles[current], slot_masks(current), soft_cap, record, ahead);
            }
            if (!more) return;
        }
    }

    /// Rounds every query row to 16-bit codes for int8 or int4 keys' integer
    /// dot products (int8_key_dots_v, int4_key_dots_v); a row that is not
    /// finite makes the walks score in float instead.
    /// @tparam Key the stored element type of the key rows
    template <class Key>
    void quantise_queries() {
        query_codes_.resize(std::size_t(rows_) * Dim);
        query_code_scales_.resize(std::size_t(rows_));
        query_codes_usable_ = true;
        for (int r = 0; r < rows_ && query_codes_usable_; ++r) {
            const float* row = queries() + std::size_t(r) * Dim;
            std::int16_t* const codes = query_codes_.data() + std::size_t(r) * Dim;
            if constexpr (int4_key_dots_v<Key, Dim>) {
                query_minimum_weights_.resize(std::size_t(rows_) * 16);
                float in_order[Dim];  // the codes' own order starts from d order, not nibble order
                std::copy(row, row + Dim, in_order);
                if (queries_in_nibble_order_) reorder_row(in_order, /*to_nibble_order=*/false);
                query_codes_usable_ = quantise_query_int4_dots<Dim>(
                    in_order, codes, query_minimum_weights_.data() + std::size_t(r) * 16, query_code_scales_[r]);
            } else {
                query_codes_usable_ = quantise_query<Dim>(row, codes, query_code_scales_[r]);
            }
        }
        query_codes_current_ = true;
    }

    /// Puts every row of `rows` (queries() or accumulators()) into int4 nibble order.
    void reorder_rows(float* rows, bool to_nibble_order) {
        for (int r = 0; r < rows_; ++r) reorder_row(rows + std::size_t(r) * Dim, to_nibble_order);
    }

    /// Puts one row into int4 nibble order, or back to d order.
    static void reorder_row(float* at, bool to_nibble_order) {
        float row[Dim];
        for (int p = 0; p < Dim; ++p) {
            if (to_nibble_order) row[p] = at[int4_nibble_index(p)];
            else row[int4_nibble_index(p)] = at[p];
        }
        std::copy(row, row + Dim, at);
    }

    /// Bit t of masks[r]: row r sees key t of the tile. True when any row sees any key.
    template <class Tile>
    bool visibility_masks(const Tile& tile, const attention_visibility& visibility,
                          std::uint32_t* masks) const {
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

    /// True for the stored types whose tiles widened() converts (16-bit and
    /// fp8): float is read as it is, int8 and int4 in place.
    template <class Element>
    static constexpr bool widens_v =
        !std::is_same_v<Element, float> && !has_row_scales_v<Element> && !std::is_same_v<Element, qint4>;
    /// What a side of a widened tile holds: float for the types widened() converts.
    template <class Element>
    using widened_t = std::conditional_t<widens_v<Element>, float, Element>;

    /// The tile with its 16-bit or fp8 rows converted once into float rows
    /// (same positions); a side of another type (a kv_elements pair's) keeps its rows.
    /// @tparam Key, Value the tile's stored types, one of them kvcache::half, kvcache::bfloat16 or an fp8 type
    template <class Key, class Value>
    key_tile<widened_t<Key>, widened_t<Value>> widened(const key_tile<Key, Value>& tile) {
        using vec = typename vector_for<Dim>::type;
        if (widened_.empty()) widened_.resize(std::size_t(2) * tile_keys * Dim);
        key_tile<widened_t<Key>, widened_t<Value>> result;
        result.count = tile.count;
        result.first_visible = tile.first_visible;
        for (int t = 0; t < tile_keys; ++t) {
            float* key = widened_.data() + std::size_t(t) * Dim;
            float* value = key + std::size_t(tile_keys) * Dim;
            result.positions[t] = tile.positions[t];
            if (t >= tile.count) {  // padding repeats the last row, as key_tile promises
                result.keys[t] = result.keys[tile.count - 1];
                result.values[t] = result.values[tile.count - 1];
                continue;
            }
            if constexpr (widens_v<Key>) {
                for (int d = 0; d < Dim; d += vec::lanes) vec::load(tile.keys[t] + d).store(key + d);
                result.keys[t] = key;
            } else {
                result.keys[t] = tile.keys[t];
            }
            if constexpr (widens_v<Value>) {
                for (int d = 0; d < Dim; d += vec::lanes) vec::load(tile.values[t] + d).store(value + d);
                result.values[t] = value;
            } else {
                result.values[t] = tile.values[t];
            }
        }
        return result;
    }

    /// One tile into every row that sees part of it: scores, mask and soft
    /// cap, the online-softmax update, and the weighted values. ahead (nullable):
    /// the tile folded next, its K rows asked during the scores, its V rows during the values.
    template <class Key, class Value, class Ahead>
    void fold(const key_tile<Key, Value>& tile, const std::uint32_t* masks, float soft_cap, score_record* record,
              const Ahead* ahead) {
        const float minus_infinity = kvcache::detail::negative_infinity();
        // Fixed-width steps over the tile: whole groups of 8 for the lane reductions.
        const int keys = (tile.count + 7) / 8 * 8;
        float* const all_scores = scores();
        // A qint8 V side's row scales, read after the softmax (the score
        // steps read the K rows' own): the V rows were asked of memory last,
        // and read before the scores they stalled the fold on lines still in
        // flight (docs/performance.md).
        [[maybe_unused]] float value_scales[tile_keys];
        for (int r0 = 0; r0 < rows_; r0 += row_block) {
            const int rows = std::min(row_block, rows_ - r0);
            if (!any_seen(masks + r0, rows)) continue;
            with_row_block(rows, [&](auto block) {
                // One row a key (MHA) keeps the float scores: measured 0.91x at
                // 16K cold with the dot products (docs/performance.md), the
                // faster score step bunching the next tile's prefetches.
                if constexpr (int8_key_dots_v<Key, Dim> && decltype(block)::value > 1) {
                    if (query_codes_usable_) {
                        tile_scores_int8_dots<decltype(block)::value, Dim>(
                            query_codes_.data() + std::size_t(r0) * Dim, query_code_scales_.data() + r0, tile, keys,
                            all_scores + std::size_t(r0) * tile_keys, r0 == 0 ? ahead : nullptr);
                        return;
                    }
                }
                // int4 keys: every row count, MHA's one included (0.82x at 16K
                // cold, docs/performance.md): the float step converts each
                // code and applies its group's scale and minimum for one row.
                if constexpr (int4_key_dots_v<Key, Dim>) {
                    if (query_codes_usable_) {
                        tile_scores_int4_dots<decltype(block)::value, Dim>(
                            query_codes_.data() + std::size_t(r0) * Dim, query_code_scales_.data() + r0,
                            query_minimum_weights_.data() + std::size_t(r0) * 16, tile, keys,
                            all_scores + std::size_t(r0) * tile_keys, r0 == 0 ? ahead : nullptr);
                        return;
                    }
                }
                tile_scores<decltype(block)::value, Dim>(queries() + std::size_t(r0) * Dim, tile, keys,
                                                         all_scores + std::size_t(r0) * tile_keys,
                                                         r0 == 0 ? ahead : nullptr);
            });
        }
        for (int r = 0; r < rows_; ++r) {
            float* row = all_scores + std::size_t(r) * tile_keys;
            const std::uint32_t mask = masks[r];
            if (mask == 0) {  // nothing seen here: weights 0, state unchanged
                std::fill(row, row + keys, 0.0f);
                rescale()[r] = 1.0f;
                continue;
            }
            for (int t = 0; t < keys; ++t) {
                const float logit = soft_cap > 0.0f ? kvcache::detail::apply_soft_cap(row[t], soft_cap) : row[t];
                row[t] = (mask >> t) & 1u ? logit : minus_infinity;
            }
            const float block_max = lane_max(row, keys);
            const float new_max = std::max(running_max()[r], block_max);
            rescale()[r] = kvcache::detail::exp_difference(running_max()[r], new_max);
            for (int t = 0; t < keys; ++t) row[t] -= new_max;
            exp_rows(row, (keys + exp_lanes - 1) / exp_lanes * exp_lanes);  // within the row: tile_keys is a multiple
            running_sum()[r] = running_sum()[r] * rescale()[r] + lane_sum(row, keys);
            running_max()[r] = new_max;
        }
        // The weights are relative to the running max just set (0 where a row saw nothing).
        if (record) record->add(tile.first_visible, tile.count, all_scores, tile_keys, 1, running_max());
        read_row_scales<Dim>(tile.values, 0, tile_keys, value_scales);
        // NaN or infinite value rows of a tile some row sees in part (non_finite_rows.hpp).
        const std::uint32_t full = full_tile_mask(tile.count);
        bool partly_seen = false;
        for (int r = 0; r < rows_; ++r) partly_seen = partly_seen || masks[r] != full;
        const std::uint32_t non_finite = partly_seen ? non_finite_values<Dim>(tile) : 0u;
        for (int r0 = 0; r0 < rows_; r0 += row_block) {
            const int rows = std::min(row_block, rows_ - r0);
            if (!any_seen(masks + r0, rows)) continue;
            std::uint32_t hidden = 0;  // non-finite rows some row of the block does not see
            for (int r = r0; r < r0 + rows; ++r) hidden |= non_finite & ~masks[r];
            if (hidden == 0) {
                with_row_block(rows, [&](auto block) {
                    tile_values<decltype(block)::value, Dim>(all_scores + std::size_t(r0) * tile_keys, rescale() + r0,
                                                             tile, tile.count, accumulators() + std::size_t(r0) * Dim,
                                                             value_scales, r0 == 0 ? ahead : nullptr);
                });
                continue;
            }
            // Row by row, each reading zeros in place of the rows it does not see.
            for (int r = r0; r < r0 + rows; ++r) {
                const std::uint32_t unseen = non_finite & ~masks[r];
                [[maybe_unused]] float row_value_scales[tile_keys];
                if constexpr (has_row_scales_v<Value>)
                    for (int t = 0; t < tile_keys; ++t) row_value_scales[t] = (unseen >> t) & 1u ? 0.0f : value_scales[t];
                tile_values<1, Dim>(all_scores + std::size_t(r) * tile_keys, rescale() + r,
                                    with_zero_values<Dim>(tile, unseen), tile.count,
                                    accumulators() + std::size_t(r) * Dim, row_value_scales, r == 0 ? ahead : nullptr);
            }
        }
    }

    static bool any_seen(const std::uint32_t* masks, int rows) noexcept {
        std::uint32_t any = 0;
        for (int r = 0; r < rows; ++r) any |= masks[r];
        return any != 0;
    }

    int rows_;
    std::vector<float> floats_;
    std::vector<int> positions_;
    std::vector<std::uint32_t> masks_;  ///< [decode_ring slot][rows]
    std::vector<float> widened_;        ///< [2][tile_keys][Dim] float copies of a binary16 tile's K and V rows
    bool queries_in_nibble_order_ = false;       ///< set by the first walk over int4 keys
    bool accumulators_in_nibble_order_ = false;  ///< set by the first walk over int4 values
    std::vector<std::int16_t> query_codes_;       ///< [rows][Dim] 16-bit query codes (int8 and int4 keys' dot products)
    std::vector<float> query_minimum_weights_;    ///< [rows][16] int4 keys' group minima weights (quantise_query_int4_dots)
    std::vector<float> query_code_scales_;        ///< [rows] their scales
    bool query_codes_current_ = false;            ///< the codes are those of the rows loaded now
    bool query_codes_usable_ = false;             ///< every row was finite when they were taken
};

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
