// The CPU decode kernel: all query rows of a GQA group against one KV head,
// in tiles of keys gathered across run boundaries (a 16-token page costs no
// more than a contiguous slab), each key row scored against every row while
// it is in registers, one pass over K and V per (sequence, KV head, split).
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "kvcache/backend/cpu/row_math.hpp"
#include "kvcache/backend/cpu/simd.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/kernels/softmax_math.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace cpu {
namespace detail {

/// Keys scored and folded into the softmax state at a time (a multiple of 8).
inline constexpr int decode_tile_keys = 32;

/// Tiles whose rows are asked of memory ahead of the one being computed:
/// two (64 keys) give a page-crossing tile's table walks time to finish.
inline constexpr int decode_prefetch_tiles = 2;

/// Row pointers and positions of up to decode_tile_keys keys; slots past
/// count repeat the last row (so fixed-width steps stay in bounds) and carry
/// position INT_MAX, which no query sees.
/// @tparam Element the stored element type
template <class Element>
struct key_tile {
    const Element* keys[decode_tile_keys];
    const Element* values[decode_tile_keys];
    int positions[decode_tile_keys];
    int count = 0;
};

/// Hands out the visible keys [begin, end) of (sequence, kv_head) tile by
/// tile, taking each tile's rows from as many consecutive runs as it needs.
/// @tparam Layout a layout view over host memory
template <class Layout>
class tile_cursor {
public:
    using element = typename Layout::element_type;

    tile_cursor(const Layout& view, int sequence, int kv_head, int begin, int end, int last_position)
        : view_(view), sequence_(sequence), kv_head_(kv_head), next_(begin), end_(end), last_position_(last_position) {}

    /// Fills the tile; false when no key is left.
    bool fill(key_tile<element>& tile) {
        tile.count = 0;
        while (tile.count < decode_tile_keys) {
            if (used_ == run_.count) {
                if (next_ >= end_) break;
                run_ = view_.run(sequence_, kv_head_, next_);
                require(run_.count > 0, error_code::out_of_range, "layout returned an empty run at visible index ", next_,
                        " of sequence ", sequence_, " below its visible count ", end_);
                if (run_.first_position > last_position_) {  // no query row sees this or anything after it
                    run_.count = used_ = 0;
                    next_ = end_;
                    break;
                }
                run_.count = std::min(run_.count, end_ - next_);
                next_ += run_.count;
                used_ = 0;
            }
            const int n = std::min(decode_tile_keys - tile.count, run_.count - used_);
            for (int i = 0; i < n; ++i) {
                const std::size_t offset = std::size_t(used_ + i) * std::size_t(run_.stride);
                tile.keys[tile.count + i] = run_.keys + offset;
                tile.values[tile.count + i] = run_.values + offset;
                tile.positions[tile.count + i] = run_.first_position + used_ + i;
            }
            used_ += n;
            tile.count += n;
        }
        for (int i = tile.count; i > 0 && i < decode_tile_keys; ++i) {
            tile.keys[i] = tile.keys[tile.count - 1];
            tile.values[i] = tile.values[tile.count - 1];
            tile.positions[i] = INT_MAX;
        }
        return tile.count > 0;
    }

private:
    const Layout& view_;
    int sequence_, kv_head_, next_, end_, last_position_;
    position_run<element> run_{};
    int used_ = 0;
};

/// Asks the cache for every line of the tile's K and V rows.
template <int Dim, class Element>
void prefetch_tile(const key_tile<Element>& tile) {
    constexpr int line_elements = int(64 / sizeof(Element));
    for (int t = 0; t < tile.count; ++t)
        for (int d = 0; d < Dim; d += line_elements) {
            prefetch(tile.keys[t] + d);
            prefetch(tile.values[t] + d);
        }
}

/// scores[r][t] = q_r . k_t for Rows query rows (scaled already) and the
/// first `keys` keys of the tile (a multiple of the key step).
template <int Rows, int Dim, class Element>
void tile_scores(const float* queries, const key_tile<Element>& tile, int keys, float* scores) {
    using vec = typename vector_for<Dim>::type;
    constexpr int chunks = Dim / vec::lanes;
    // Keys per step: as many as keep Rows x step accumulators within half the registers.
    constexpr int step = std::max(1, std::min(4, vector_registers / 2 / Rows));
    for (int t = 0; t < keys; t += step) {
        vec accumulators[Rows][step];
        for (int r = 0; r < Rows; ++r)
            for (int j = 0; j < step; ++j) accumulators[r][j] = vec::zero();
        for (int c = 0; c < chunks; ++c) {
            vec k[step];
            for (int j = 0; j < step; ++j) k[j] = vec::load(tile.keys[t + j] + c * vec::lanes);
            for (int r = 0; r < Rows; ++r) {
                const vec q = vec::load(queries + r * Dim + c * vec::lanes);
                for (int j = 0; j < step; ++j) accumulators[r][j] = fma(q, k[j], accumulators[r][j]);
            }
        }
        for (int r = 0; r < Rows; ++r)
            for (int j = 0; j < step; ++j) scores[r * decode_tile_keys + t + j] = sum(accumulators[r][j]);
    }
}

/// accumulators[r] = accumulators[r] * rescale[r] + sum_t weights[r][t] v_t
/// for Rows rows over the first `keys` keys of the tile.
template <int Rows, int Dim, class Element>
void tile_values(const float* weights, const float* rescale, const key_tile<Element>& tile, int keys,
                 float* accumulators) {
    using vec = typename vector_for<Dim>::type;
    constexpr int chunks = Dim / vec::lanes;
    constexpr int width = chunks % 2 == 0 && Rows * 2 <= vector_registers / 2 ? 2 : 1;  // chunks per pass
    for (int c = 0; c < chunks; c += width) {
        vec sums[Rows][width];
        for (int r = 0; r < Rows; ++r)
            for (int w = 0; w < width; ++w)
                sums[r][w] = vec::load(accumulators + r * Dim + (c + w) * vec::lanes) * vec::broadcast(rescale[r]);
        for (int t = 0; t < keys; ++t) {
            vec v[width];
            for (int w = 0; w < width; ++w) v[w] = vec::load(tile.values[t] + (c + w) * vec::lanes);
            for (int r = 0; r < Rows; ++r) {
                const vec p = vec::broadcast(weights[r * decode_tile_keys + t]);
                for (int w = 0; w < width; ++w) sums[r][w] = fma(p, v[w], sums[r][w]);
            }
        }
        for (int r = 0; r < Rows; ++r)
            for (int w = 0; w < width; ++w) sums[r][w].store(accumulators + r * Dim + (c + w) * vec::lanes);
    }
}

/// Calls f with std::integral_constant<int, rows> for rows in 1..4.
template <class F>
void with_row_block(int rows, F&& f) {
    switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
    }
}

/// Rows of query heads processed together by the tile kernels.
inline constexpr int decode_row_block = 4;

/// Decode attention of the Group query rows of (sequence, kv_head) over its
/// visible keys [begin, end), all rows at query position `position`. Writes
/// the normalised rows (zeros when nothing was seen) and, when lse is not
/// null, their log-sum-exp (-inf when nothing was seen).
/// @tparam Group query rows sharing the KV head
/// @tparam Layout a layout view over host memory
/// @tparam Query float or kvcache::half
/// @tparam Output float or kvcache::half
template <int Group, class Layout, class Query, class Output>
void decode_range(const Layout& view, int sequence, int kv_head, int begin, int end, int position, const Query* queries,
                  float scale, float soft_cap, Output* outputs, float* lse) {
    using element = typename Layout::element_type;
    constexpr int dim = Layout::heads::head_dim, tile_keys = decode_tile_keys;
    const float minus_infinity = kvcache::detail::negative_infinity();
    std::vector<float> buffer(static_cast<std::size_t>(Group) * (2 * dim + tile_keys));
    float* query = buffer.data();
    float* accumulator = query + Group * dim;
    float* scores = accumulator + Group * dim;
    for (int i = 0; i < Group * dim; ++i) query[i] = to_float(queries[i]) * scale;
    std::fill(accumulator, accumulator + Group * dim, 0.0f);
    float running_max[Group], running_sum[Group], rescale[Group];
    std::fill(running_max, running_max + Group, minus_infinity);
    std::fill(running_sum, running_sum + Group, 0.0f);
    const attention_visibility visibility = view.visibility();

    tile_cursor<Layout> cursor(view, sequence, kv_head, begin, end, position);
    // A ring of tiles: the one computed now and the ones whose rows were
    // asked of memory ahead of it (distance decode_prefetch_tiles).
    key_tile<element> tiles[decode_prefetch_tiles + 1];
    int filled = 0;
    while (filled < decode_prefetch_tiles + 1 && cursor.fill(tiles[filled])) {
        if (filled > 0) prefetch_tile<dim>(tiles[filled]);
        ++filled;
    }
    for (int current = 0; filled > 0; current = (current + 1) % (decode_prefetch_tiles + 1), --filled) {
        const key_tile<element>& tile = tiles[current];
        // Fixed-width steps over the tile: whole groups of 8 for the lane reductions.
        const int keys = (tile.count + 7) / 8 * 8;
        for (int r0 = 0; r0 < Group; r0 += decode_row_block)
            with_row_block(std::min(decode_row_block, Group - r0), [&](auto rows) {
                tile_scores<decltype(rows)::value, dim>(query + r0 * dim, tile, keys, scores + r0 * tile_keys);
            });
        bool visible[tile_keys];
        for (int t = 0; t < keys; ++t) visible[t] = visibility.allows(position, tile.positions[t]);
        bool any = false;
        for (int r = 0; r < Group; ++r) {
            float* row = scores + r * tile_keys;
            for (int t = 0; t < keys; ++t) {
                const float logit = soft_cap > 0.0f ? kvcache::detail::apply_soft_cap(row[t], soft_cap) : row[t];
                row[t] = visible[t] ? logit : minus_infinity;
            }
            const float block_max = lane_max(row, keys);
            if (block_max == minus_infinity) {  // nothing visible here: weights 0, state unchanged
                std::fill(row, row + keys, 0.0f);
                rescale[r] = 1.0f;
                continue;
            }
            any = true;
            const float new_max = std::max(running_max[r], block_max);
            rescale[r] = kvcache::detail::exp_difference(running_max[r], new_max);
            for (int t = 0; t < keys; ++t) row[t] -= new_max;
            exp_non_positive(row, keys);
            running_sum[r] = running_sum[r] * rescale[r] + lane_sum(row, keys);
            running_max[r] = new_max;
        }
        if (any)
            for (int r0 = 0; r0 < Group; r0 += decode_row_block)
                with_row_block(std::min(decode_row_block, Group - r0), [&](auto rows) {
                    tile_values<decltype(rows)::value, dim>(scores + r0 * tile_keys, rescale + r0, tile, tile.count,
                                                            accumulator + r0 * dim);
                });
        // The slot just used takes the next tile not yet asked for.
        if (filled == decode_prefetch_tiles + 1 && cursor.fill(tiles[current])) {
            prefetch_tile<dim>(tiles[current]);
            ++filled;
        }
    }
    for (int r = 0; r < Group; ++r) {
        const float inverse = running_sum[r] > 0.0f ? 1.0f / running_sum[r] : 0.0f;
        for (int d = 0; d < dim; ++d) outputs[r * dim + d] = from_float<Output>(accumulator[r * dim + d] * inverse);
        if (lse) lse[r] = running_sum[r] > 0.0f ? running_max[r] + ::logf(running_sum[r]) : minus_infinity;
    }
}

}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
