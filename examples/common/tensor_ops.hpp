// The dense float kernels of the example model: matmul, RMSNorm, SwiGLU.
// Every output element of matmul is computed by the same sequence of float
// operations whatever the number of rows, so the one-token (cached) and the
// many-token (recompute) forward passes produce bit-identical projections.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "common/thread_pool.hpp"

namespace kvcache::examples {

namespace detail {

// Independent partial sums per lane: the compiler turns the lane loop into
// vector instructions without reassociating any single sum.
constexpr int dot_lanes = 8;

template <int Rows>
inline void dot_rows(const float* x, std::size_t x_stride, const float* w, int k, float* out) {
    float acc[Rows][dot_lanes] = {};
    int i = 0;
    for (; i + dot_lanes <= k; i += dot_lanes) {
        for (int r = 0; r < Rows; ++r) {
            const float* xr = x + r * x_stride + i;
            for (int l = 0; l < dot_lanes; ++l) acc[r][l] += xr[l] * w[i + l];
        }
    }
    for (int r = 0; r < Rows; ++r) {
        float tail = 0.0f;
        for (int j = i; j < k; ++j) tail += x[r * x_stride + j] * w[j];
        float s = ((acc[r][0] + acc[r][4]) + (acc[r][1] + acc[r][5])) + ((acc[r][2] + acc[r][6]) + (acc[r][3] + acc[r][7]));
        out[r] = s + tail;
    }
}

}  // namespace detail

/// out[t][n] = sum_k in[t][k] * weight[n][k] + bias[n] (bias may be null):
/// a row-major [rows][in_features] input times the transpose of a
/// [out_features][in_features] weight, threads splitting the output columns.
inline void matmul(thread_pool& pool, const float* in, int rows, int in_features, const float* weight,
                   const float* bias, int out_features, float* out) {
    constexpr int row_block = 4;
    constexpr int column_tile = 32;  // weight rows kept hot in L1 while the input rows stream past
    pool.parallel_for(
        out_features,
        [&](int begin, int end) {
            float result[row_block];
            for (int n0 = begin; n0 < end; n0 += column_tile) {
                int n1 = std::min(end, n0 + column_tile);
                int t = 0;
                for (; t + row_block <= rows; t += row_block) {
                    const float* x = in + static_cast<std::size_t>(t) * in_features;
                    for (int n = n0; n < n1; ++n) {
                        detail::dot_rows<row_block>(x, in_features, weight + static_cast<std::size_t>(n) * in_features,
                                                    in_features, result);
                        for (int r = 0; r < row_block; ++r)
                            out[static_cast<std::size_t>(t + r) * out_features + n] = result[r] + (bias ? bias[n] : 0.0f);
                    }
                }
                for (; t < rows; ++t) {
                    const float* x = in + static_cast<std::size_t>(t) * in_features;
                    for (int n = n0; n < n1; ++n) {
                        detail::dot_rows<1>(x, in_features, weight + static_cast<std::size_t>(n) * in_features,
                                            in_features, result);
                        out[static_cast<std::size_t>(t) * out_features + n] = result[0] + (bias ? bias[n] : 0.0f);
                    }
                }
            }
        },
        16);
}

/// out = x / sqrt(mean(x^2) + eps) * weight, for each of `rows` rows of `width`.
inline void rms_norm(const float* x, int rows, int width, const float* weight, float eps, float* out) {
    for (int t = 0; t < rows; ++t) {
        const float* xr = x + static_cast<std::size_t>(t) * width;
        float* yr = out + static_cast<std::size_t>(t) * width;
        double sum = 0.0;
        for (int i = 0; i < width; ++i) sum += static_cast<double>(xr[i]) * xr[i];
        float scale = static_cast<float>(1.0 / std::sqrt(sum / width + eps));
        for (int i = 0; i < width; ++i) yr[i] = xr[i] * scale * weight[i];
    }
}

/// gate[i] = silu(gate[i]) * up[i], the SwiGLU activation, in place.
inline void swiglu(float* gate, const float* up, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
        float g = gate[i];
        gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

/// Index of the largest value, the lowest index on ties (greedy decoding).
inline int argmax(const float* values, int count) {
    int best = 0;
    for (int i = 1; i < count; ++i)
        if (values[i] > values[best]) best = i;
    return best;
}

}  // namespace kvcache::examples
