// The dense float kernels of the example model: matmul, RMSNorm, SwiGLU.
// Every output element of matmul is computed by the same sequence of float
// operations whatever the number of rows, so the one-token (cached) and the
// many-token (recompute) forward passes produce bit-identical projections.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "kvcache_engine/thread_pool.hpp"

namespace kvcache::examples {

namespace detail {

// Eight independent partial sums per row, held in two 4-wide vectors (GCC/Clang
// vector extension: SSE or NEON, AVX pairs them when enabled). No single sum
// is ever reassociated, so results do not depend on how rows are blocked.
typedef float float4 __attribute__((vector_size(16)));

inline float4 load4(const float* p) noexcept {
    float4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

template <int Rows>
inline void dot_rows(const float* x, std::size_t x_stride, const float* w, int k, float* out) {
    float4 low[Rows], high[Rows];
    for (int r = 0; r < Rows; ++r) low[r] = high[r] = float4{};
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        float4 w0 = load4(w + i), w1 = load4(w + i + 4);
        for (int r = 0; r < Rows; ++r) {
            low[r] += load4(x + r * x_stride + i) * w0;
            high[r] += load4(x + r * x_stride + i + 4) * w1;
        }
    }
    for (int r = 0; r < Rows; ++r) {
        float tail = 0.0f;
        for (int j = i; j < k; ++j) tail += x[r * x_stride + j] * w[j];
        float4 a = low[r] + high[r];
        out[r] = ((a[0] + a[2]) + (a[1] + a[3])) + tail;
    }
}

}  // namespace detail

/// The dot product of two float vectors of length n, in the same operation order as matmul.
inline float dot(const float* a, const float* b, int n) {
    float result;
    detail::dot_rows<1>(a, 0, b, n, &result);
    return result;
}

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
        // Waking a worker costs microseconds: give each at least ~64K multiply-adds.
        std::max(16, static_cast<int>(65536 / (static_cast<long long>(rows) * in_features + 1))));
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
