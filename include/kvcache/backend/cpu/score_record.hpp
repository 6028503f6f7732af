// Attention scores on the CPU backend. The kernels' online softmax knows a
// key's final weight only once every key is folded in (the running max and
// sum keep changing), so the weights each tile computed anyway are kept,
// with the per-row base (the running max) they are relative to, and
// normalised at the end against each row's final log-sum-exp: no second
// pass over K or V and no exp per key, only one per (tile, row).
#pragma once

#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/kernels/softmax_math.hpp"

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// The softmax weights some query rows of one work item gave its keys, tile
/// by tile, and their sum per key once normalised.
class score_record {
public:
    /// Records the kernel rows listed (the rows whose weights count).
    explicit score_record(std::vector<int> rows) : rows_(std::move(rows)), lse_(rows_.size(), 0.0f) {}

    /// Keeps one tile: `count` keys from visible index first_visible; the
    /// weight of kernel row r and key t is weights[r * row_stride + t * key_stride],
    /// relative to exp(bases[r]).
    void add(int first_visible, int count, const float* weights, std::size_t row_stride, std::size_t key_stride,
             const float* bases) {
        tiles_.push_back({first_visible, count, weights_.size(), bases_.size()});
        for (const int r : rows_) bases_.push_back(bases[r]);
        for (int t = 0; t < count; ++t)
            for (const int r : rows_) weights_.push_back(weights[r * row_stride + t * key_stride]);
    }

    /// Sets the final log-sum-exp of the j-th recorded row (-inf: it saw nothing).
    void set_lse(std::size_t j, float lse) { lse_[j] = lse; }

    /// The j-th recorded row's kernel row.
    const std::vector<int>& rows() const noexcept { return rows_; }

    /// Adds each key's normalised weight, summed over the recorded rows, to
    /// scores[visible index].
    void add_to(float* scores) const {
        const std::size_t n = rows_.size();
        std::vector<float> factors(n);
        for (const tile& k : tiles_) {
            for (std::size_t j = 0; j < n; ++j) {
                const float base = bases_[k.first_base + j];
                // A row that saw nothing (lse -inf) or nothing yet at this tile (base -inf) adds 0.
                factors[j] = lse_[j] == kvcache::detail::negative_infinity() ? 0.0f
                                                                              : kvcache::detail::exp_difference(base, lse_[j]);
            }
            const float* w = weights_.data() + k.first_weight;
            for (int t = 0; t < k.count; ++t, w += n) {
                float sum = 0.0f;
                // A weight of 0 (a key the row does not see) adds 0, also to a
                // row whose lse is NaN (it saw a NaN key): the reference gives
                // such a row's NaN only to the keys it sees.
                for (std::size_t j = 0; j < n; ++j) sum += w[j] == 0.0f ? 0.0f : factors[j] * w[j];
                scores[k.first_visible + t] += sum;
            }
        }
    }

private:
    struct tile {
        int first_visible, count;
        std::size_t first_weight, first_base;
    };
    std::vector<int> rows_;
    std::vector<float> lse_;      ///< [recorded rows]
    std::vector<tile> tiles_;
    std::vector<float> bases_;    ///< [tile][recorded rows]
    std::vector<float> weights_;  ///< [tile][key][recorded rows]
};

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
