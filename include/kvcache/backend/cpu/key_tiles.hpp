// The CPU attention kernels' inner steps: tiles of keys gathered across run
// boundaries (a 16-token page costs no more than a contiguous slab), each key
// row scored against a block of query rows while it is in registers, and the
// weighted values folded into those rows' accumulators. Decode and prefill
// both run on these (tile_attention.hpp drives them).
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/row_math.hpp"
#include "kvcache/backend/cpu/simd.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/stored_row.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// Keys scored and folded into the softmax state at a time (a multiple of 8).
inline constexpr int tile_keys = 32;

/// Tiles whose rows are asked of memory ahead of the one being computed:
/// two (64 keys) give a page-crossing tile's table walks time to finish.
inline constexpr int prefetch_tiles = 2;

/// Row pointers and positions of up to tile_keys keys; slots past
/// count repeat the last row (so fixed-width steps stay in bounds) and carry
/// position INT_MAX, which no query sees.
/// @tparam Key the stored element type of the key rows
/// @tparam Value that of the value rows (Key but for a kv_elements pair's tile)
template <class Key, class Value = Key>
struct key_tile {
    using key_type = Key;
    using value_type = Value;
    const Key* keys[tile_keys];
    const Value* values[tile_keys];
    int positions[tile_keys];
    int count = 0;
    int first_visible = 0;  ///< visible index of keys[0]: a tile's keys are consecutive visible rows
};

/// The tile type of a layout view's rows (const dropped: tiles only read).
/// @tparam Layout a layout view
template <class Layout>
using tile_of_t = key_tile<std::remove_cv_t<key_element_t<typename Layout::element_type>>,
                           std::remove_cv_t<value_element_t<typename Layout::element_type>>>;

/// Hands out the visible keys [begin, end) of (sequence, kv_head) tile by
/// tile, taking each tile's rows from as many consecutive runs as it needs,
/// and none past last_position (positions ascend with the visible index, so
/// no query row at or before last_position sees anything after it).
/// @tparam Layout a layout view over host memory
template <class Layout>
class tile_cursor {
public:
    using element = typename Layout::element_type;
    using tile_type = tile_of_t<Layout>;

    tile_cursor(const Layout& view, int sequence, int kv_head, int begin, int end, int last_position)
        : view_(view), sequence_(sequence), kv_head_(kv_head), next_(begin), end_(end), last_position_(last_position),
          handed_(begin) {}

    /// Fills the tile; false when no key is left.
    bool fill(tile_type& tile) {
        tile.count = 0;
        tile.first_visible = handed_;
        while (tile.count < tile_keys) {
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
                if (run_.first_position + (run_.count - 1) > last_position_) {  // the run goes past every query
                    run_.count = last_position_ - run_.first_position + 1;
                    next_ = end_;
                }
                used_ = 0;
            }
            const int n = std::min(tile_keys - tile.count, run_.count - used_);
            const std::size_t value_stride = std::size_t(value_stride_of(run_));
            for (int i = 0; i < n; ++i) {
                tile.keys[tile.count + i] = run_.keys + std::size_t(used_ + i) * std::size_t(run_.stride);
                tile.values[tile.count + i] = run_.values + std::size_t(used_ + i) * value_stride;
                tile.positions[tile.count + i] = run_.first_position + used_ + i;
            }
            used_ += n;
            tile.count += n;
        }
        for (int i = tile.count; i > 0 && i < tile_keys; ++i) {
            tile.keys[i] = tile.keys[tile.count - 1];
            tile.values[i] = tile.values[tile.count - 1];
            tile.positions[i] = INT_MAX;
        }
        handed_ += tile.count;
        return tile.count > 0;
    }

private:
    const Layout& view_;
    int sequence_, kv_head_, next_, end_, last_position_;
    int handed_;  ///< visible index of the next key handed out
    position_run<element> run_{};
    int used_ = 0;
};

/// Asks the cache for every line of the tile's K row t (a qint8 row's
/// scale included: its 4 bytes after the values may start a line of their own).
/// @tparam Into the cache the lines are asked into
template <int Dim, prefetch_into Into, class Key, class Value>
void prefetch_key_row(const key_tile<Key, Value>& tile, int t) {
    for (int d = 0; d < row_elements<Key>(Dim); d += int(64 / sizeof(Key))) prefetch<Into>(tile.keys[t] + d);
}

/// Asks the cache for every line of the tile's V row t (scale included, as above).
/// @tparam Into the cache the lines are asked into
template <int Dim, prefetch_into Into, class Key, class Value>
void prefetch_value_row(const key_tile<Key, Value>& tile, int t) {
    for (int d = 0; d < row_elements<Value>(Dim); d += int(64 / sizeof(Value))) prefetch<Into>(tile.values[t] + d);
}

/// Asks the cache for every line of the tile's K and V rows at once.
/// @tparam Into the cache the lines are asked into
template <int Dim, prefetch_into Into, class Key, class Value>
void prefetch_tile(const key_tile<Key, Value>& tile) {
    for (int t = 0; t < tile.count; ++t) {
        prefetch_key_row<Dim, Into>(tile, t);
        prefetch_value_row<Dim, Into>(tile, t);
    }
}

/// Where decode asks for the rows of the tile after the one it computes:
/// into L2. Decode reads each row once; asked into L1, the prefetches hold
/// the L1 miss slots that the current tile's loads need (L1, L2 and L3
/// compared in docs/performance.md, "Decode's prefetches into L2").
inline constexpr prefetch_into decode_prefetch = prefetch_into::l2;

/// True for a stored type whose rows carry their own scale (qint8): the
/// kernels widen such rows unscaled and apply each row's scale once.
/// @tparam Element the stored element type
template <class Element>
inline constexpr bool has_row_scales_v = std::is_same_v<Element, qint8>;

/// The scales of a tile's K and V rows, every slot (padding repeats the last row's).
struct tile_scales {
    float keys[tile_keys];
    float values[tile_keys];
};

/// Reads the scale stored after each of rows[first], .., rows[first + count - 1]
/// into scales (rows of a type without row scales are not read).
/// @tparam Dim head dimension
/// @tparam Element the rows' stored element type
template <int Dim, class Element>
void read_row_scales(const Element* const* rows, int first, int count, float* scales) noexcept {
    if constexpr (has_row_scales_v<Element>)
        for (int t = 0; t < count; ++t) scales[t] = row_scale_of(rows[first + t], Dim);
}

/// Reads the scales of the tile's qint8 K rows and qint8 V rows, every slot.
template <int Dim, class Key, class Value>
void read_tile_scales(const key_tile<Key, Value>& tile, tile_scales& scales) noexcept {
    read_row_scales<Dim>(tile.keys, 0, tile_keys, scales.keys);
    read_row_scales<Dim>(tile.values, 0, tile_keys, scales.values);
}

/// scores[r][t] = q_r . k_t for Rows query rows (scaled already) and the
/// first `keys` keys of the tile (a multiple of the key step). For a qint8
/// tile the dot product of the unscaled row is multiplied by the row's
/// scale, read as the step stores its scores (read for the whole tile
/// before the step, the scales' lines stalled it while still in flight:
/// docs/performance.md). ahead (nullable) is the tile computed next: each
/// step asks memory for its K rows of the same slots (tile_values asks for
/// the V rows), so the next tile's misses are spread over this tile's
/// arithmetic (a whole tile asked at once fills the core's miss queue and
/// stalls it, measured in docs/performance.md).
/// @tparam Ahead the tile type of `ahead` (a widened tile's is its stored one)
template <int Rows, int Dim, class Element, class Value, class Ahead = key_tile<Element, Value>>
void tile_scores(const float* queries, const key_tile<Element, Value>& tile, int keys, float* scores,
                 const Ahead* ahead = nullptr) {
    using vec = typename vector_for<Dim>::type;
    constexpr int chunks = Dim / vec::lanes;
    // Keys per step: as many as keep Rows x step accumulators within half the registers.
    constexpr int step = std::max(1, std::min(4, vector_registers / 2 / Rows));
    for (int t = 0; t < keys; t += step) {
        if (ahead)
            for (int j = 0; j < step && t + j < ahead->count; ++j) prefetch_key_row<Dim, decode_prefetch>(*ahead, t + j);
        vec accumulators[Rows][step];
        for (int r = 0; r < Rows; ++r)
            for (int j = 0; j < step; ++j) accumulators[r][j] = vec::zero();
        const auto add_products = [&](int c, const vec (&k)[step]) {
            for (int r = 0; r < Rows; ++r) {
                const vec q = vec::load(queries + r * Dim + c * vec::lanes);
                for (int j = 0; j < step; ++j) accumulators[r][j] = fma(q, k[j], accumulators[r][j]);
            }
        };
        if constexpr (int4_nibble_order_v<Element, Dim>) {
            // A group's byte blocks in turn, each unpacked once into its low
            // and high nibbles (two consecutive nibble-order chunks).
            constexpr int chunks_per_group = qint4_group_size / vec::lanes;
            for (int g = 0; g < Dim / qint4_group_size; ++g)
                for (int h = 0; h < chunks_per_group / 2; ++h) {
                    vec low[step], high[step];
                    for (int j = 0; j < step; ++j) load_int4_nibble_pair<Dim>(tile.keys[t + j], g, h, low[j], high[j]);
                    add_products(g * chunks_per_group + 2 * h, low);
                    add_products(g * chunks_per_group + 2 * h + 1, high);
                }
        } else {
            for (int c = 0; c < chunks; ++c) {
                vec k[step];
                for (int j = 0; j < step; ++j) k[j] = load_row<vec, Dim>(tile.keys[t + j], c * vec::lanes);
                add_products(c, k);
            }
        }
        [[maybe_unused]] float key_scales[step];
        read_row_scales<Dim>(tile.keys, t, step, key_scales);
        if constexpr (step == 4) {
            for (int r = 0; r < Rows; ++r)
                store_sums4(accumulators[r], has_row_scales_v<Element> ? key_scales : nullptr,
                            scores + r * tile_keys + t);
            continue;
        }
        for (int r = 0; r < Rows; ++r)
            for (int j = 0; j < step; ++j) {
                if constexpr (has_row_scales_v<Element>) {
                    scores[r * tile_keys + t + j] = sum(accumulators[r][j]) * key_scales[j];
                } else {
                    scores[r * tile_keys + t + j] = sum(accumulators[r][j]);
                }
            }
    }
}

/// accumulators[r] = accumulators[r] * rescale[r] + sum_t weights[r][t] v_t
/// for Rows rows over the first `keys` keys of the tile. For a qint8 tile
/// value_scales[t] folds into the weight, so the unscaled row is used as loaded.
/// (Element: the value rows' stored type; the key rows' is not read.)
/// ahead (nullable): the tile computed next, whose V rows the first pass
/// asks memory for, one a key, as tile_scores asks for its K rows.
/// @tparam Ahead the tile type of `ahead` (a widened tile's is its stored one)
template <int Rows, int Dim, class Key, class Element, class Ahead = key_tile<Key, Element>>
void tile_values(const float* weights, const float* rescale, const key_tile<Key, Element>& tile, int keys,
                 float* accumulators, const float* value_scales = nullptr, const Ahead* ahead = nullptr) {
    using vec = typename vector_for<Dim>::type;
    constexpr int chunks = Dim / vec::lanes;
    // Chunks per pass: as many as keep Rows x width sums within half the
    // registers (each weight is broadcast once per pass, so wider passes
    // broadcast less, and one pass reads a value row whole instead of in
    // parts); the int4 nibble-order loads come in pairs.
    constexpr int width = chunks % 8 == 0 && Rows * 8 <= vector_registers / 2   ? 8
                          : chunks % 4 == 0 && Rows * 4 <= vector_registers / 2 ? 4
                          : chunks % 2 == 0 && Rows * 2 <= vector_registers / 2 ? 2
                                                                                 : 1;
    static_assert(!int4_nibble_order_v<Element, Dim> || width % 2 == 0, "nibble-order chunks load in pairs");
    (void)value_scales;
    for (int c = 0; c < chunks; c += width) {
        vec sums[Rows][width];
        for (int r = 0; r < Rows; ++r)
            for (int w = 0; w < width; ++w)
                sums[r][w] = vec::load(accumulators + r * Dim + (c + w) * vec::lanes) * vec::broadcast(rescale[r]);
        for (int t = 0; t < keys; ++t) {
            if (c == 0 && ahead && t < ahead->count) prefetch_value_row<Dim, decode_prefetch>(*ahead, t);
            vec v[width];
            if constexpr (int4_nibble_order_v<Element, Dim>) {
                constexpr int chunks_per_group = qint4_group_size / vec::lanes;
                for (int w = 0; w < width; w += 2)  // c + w is even: a byte block's low, then high nibbles
                    load_int4_nibble_pair<Dim>(tile.values[t], (c + w) / chunks_per_group,
                                               (c + w) % chunks_per_group / 2, v[w], v[w + 1]);
            } else {
                for (int w = 0; w < width; ++w) v[w] = load_row<vec, Dim>(tile.values[t], (c + w) * vec::lanes);
            }
            for (int r = 0; r < Rows; ++r) {
                float weight = weights[r * tile_keys + t];
                if constexpr (has_row_scales_v<Element>) weight *= value_scales[t];
                const vec p = vec::broadcast(weight);
                for (int w = 0; w < width; ++w) sums[r][w] = fma(p, v[w], sums[r][w]);
            }
        }
        for (int r = 0; r < Rows; ++r)
            for (int w = 0; w < width; ++w) sums[r][w].store(accumulators + r * Dim + (c + w) * vec::lanes);
    }
}

/// Query rows the score and value steps hold in registers at once.
inline constexpr int row_block = 4;

/// Calls f with std::integral_constant<int, rows> for rows in 1..row_block (4).
template <class F>
void with_row_block(int rows, F&& f) {
    switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
    }
}

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
