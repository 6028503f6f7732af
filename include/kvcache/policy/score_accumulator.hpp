// Running attention sums per row of one sequence (H2O's heavy-hitter
// statistic), per layer and KV head, that follow the sequence's compaction:
// keep() drops the same rows the cache drops.
#pragma once

#include <cstddef>
#include <vector>

#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"

namespace kvcache {

/// Accumulated attention of one sequence: for each layer, [kv_heads][rows]
/// sums of the scores its steps gave each visible row. Rows are visible
/// indices; a layer's row count grows as scores for more rows are added and
/// shrinks by keep().
class score_accumulator {
public:
    /// An accumulator for `layers` layers of `kv_heads` KV heads, every layer empty.
    score_accumulator(int layers, int kv_heads) : kv_heads_(kv_heads) {
        require(layers > 0, error_code::invalid_argument, "score_accumulator layers = ", layers, " must be positive");
        require(kv_heads > 0, error_code::invalid_argument, "score_accumulator kv_heads = ", kv_heads,
                " must be positive");
        layers_.resize(std::size_t(layers));
    }

    int layers() const noexcept { return int(layers_.size()); }
    int kv_heads() const noexcept { return kv_heads_; }
    /// Rows the layer holds sums for.
    int rows(int layer) const { return layers_[checked(layer)].rows; }

    /// Adds one step's scores of this sequence, [kv_heads][stride] (a block of
    /// decode_params::scores or prefill_params::scores), for its first `rows`
    /// rows: the layer grows to `rows` (new rows start at 0), which must not
    /// be fewer than it holds.
    void add(int layer, span<const float> scores, int stride, int rows) {
        layer_sums& sums = layers_[checked(layer)];
        require(rows >= sums.rows, error_code::invalid_argument, "score_accumulator::add rows = ", rows,
                " is below the ", sums.rows, " rows layer ", layer, " holds (compact it with keep() first)");
        require(stride >= rows, error_code::invalid_argument, "score_accumulator::add stride = ", stride,
                " is below rows = ", rows);
        require(scores.size() == std::size_t(kv_heads_) * std::size_t(stride), error_code::invalid_argument,
                "score_accumulator::add scores hold ", scores.size(), " values but kv_heads ", kv_heads_,
                " x stride ", stride, " = ", std::size_t(kv_heads_) * stride, " are needed");
        grow(sums, rows);
        for (int h = 0; h < kv_heads_; ++h)
            for (int i = 0; i < rows; ++i)
                sums.values[std::size_t(h) * rows + i] += scores[std::size_t(h) * stride + i];
    }

    /// The layer's sums, [kv_heads][rows(layer)] (a row_scores with stride rows(layer)).
    span<const float> scores(int layer) const {
        const layer_sums& sums = layers_[checked(layer)];
        return span<const float>(sums.values.data(), sums.values.size());
    }

    /// Keeps only the rows `kept` (ascending visible indices below rows(layer))
    /// of one layer, in that order: what a compaction with the same indices
    /// does to the cache. Nothing changes when an index is wrong.
    void keep(int layer, span<const int> kept) {
        layer_sums& sums = layers_[checked(layer)];
        check_kept(sums, layer, kept);
        std::vector<float> values(std::size_t(kv_heads_) * kept.size());
        for (int h = 0; h < kv_heads_; ++h)
            for (std::size_t j = 0; j < kept.size(); ++j)
                values[std::size_t(h) * kept.size() + j] = sums.values[std::size_t(h) * sums.rows + kept[j]];
        sums.values.swap(values);
        sums.rows = int(kept.size());
    }

    /// keep(layer, kept) for every layer (a compaction of all layers alike);
    /// checked for every layer before any changes.
    void keep(span<const int> kept) {
        for (int l = 0; l < layers(); ++l) check_kept(layers_[std::size_t(l)], l, kept);
        for (int l = 0; l < layers(); ++l) keep(l, kept);
    }

    /// Forgets every sum (the sequence was reset or removed).
    void clear() {
        for (layer_sums& sums : layers_) sums = layer_sums{};
    }

private:
    struct layer_sums {
        int rows = 0;
        std::vector<float> values;  ///< [kv_heads][rows]
    };

    std::size_t checked(int layer) const {
        require(layer >= 0 && layer < layers(), error_code::out_of_range, "score_accumulator layer ", layer,
                " is outside [0, ", layers(), ")");
        return std::size_t(layer);
    }

    static void check_kept(const layer_sums& sums, int layer, span<const int> kept) {
        for (std::size_t j = 0; j < kept.size(); ++j) {
            require(kept[j] >= 0 && kept[j] < sums.rows, error_code::out_of_range, "kept[", j, "] = ", kept[j],
                    " is outside the ", sums.rows, " rows of layer ", layer);
            require(j == 0 || kept[j] > kept[j - 1], error_code::invalid_argument, "kept[", j, "] = ", kept[j],
                    " does not ascend from kept[", j - 1, "] = ", kept[j == 0 ? 0 : j - 1]);
        }
    }

    void grow(layer_sums& sums, int rows) const {
        if (rows == sums.rows) return;
        std::vector<float> values(std::size_t(kv_heads_) * rows, 0.0f);
        for (int h = 0; h < kv_heads_; ++h)
            for (int i = 0; i < sums.rows; ++i)
                values[std::size_t(h) * rows + i] = sums.values[std::size_t(h) * sums.rows + i];
        sums.values.swap(values);
        sums.rows = rows;
    }

    int kv_heads_;
    std::vector<layer_sums> layers_;
};

}  // namespace kvcache
