// A test-only cache: K/V rows kept in plain vectors and attended naively,
// each layer over all its keys or, with a window w, the newest w of them.
// It checks the model's cached generation path independently of kvcache.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "kvcache_engine/attention_backend.hpp"

namespace kvcache::examples::testing {

class naive_cache_attention final : public kvcache::examples::attention_backend {
public:
    /// windows[l]: keys of layer l a query sees, its own included (0 or absent: all).
    explicit naive_cache_attention(const model_config& config, std::vector<int> windows = {})
        : heads_(config.heads()), windows_(std::move(windows)), keys_(config.num_layers), values_(config.num_layers) {}

    void begin_tokens(int first_position, int) override { first_ = first_position; }

    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        const int qh = heads_.query_heads, kvh = heads_.kv_heads, d = heads_.head_dim;
        const int window = static_cast<std::size_t>(layer) < windows_.size() ? windows_[layer] : 0;
        keys_[layer].insert(keys_[layer].end(), k, k + tokens * kvh * d);
        values_[layer].insert(values_[layer].end(), v, v + tokens * kvh * d);
        for (int t = 0; t < tokens; ++t) {
            int position = first_ + t;
            for (int h = 0; h < qh; ++h) {
                int kv = h / heads_.group_size();
                const float* qrow = q + (t * qh + h) * d;
                const int oldest = window > 0 ? std::max(0, position - window + 1) : 0;
                std::vector<double> scores(position + 1);
                double best = -1e300;
                for (int j = oldest; j <= position; ++j) {
                    double s = 0;
                    for (int i = 0; i < d; ++i) s += double(qrow[i]) * keys_[layer][(j * kvh + kv) * d + i];
                    scores[j] = s / std::sqrt(double(d));
                    best = std::max(best, scores[j]);
                }
                double total = 0;
                std::vector<double> acc(d, 0.0);
                for (int j = oldest; j <= position; ++j) {
                    double p = std::exp(scores[j] - best);
                    total += p;
                    for (int i = 0; i < d; ++i) acc[i] += p * values_[layer][(j * kvh + kv) * d + i];
                }
                for (int i = 0; i < d; ++i) out[(t * qh + h) * d + i] = float(acc[i] / total);
            }
        }
    }

private:
    head_shape heads_;
    std::vector<int> windows_;
    int first_ = 0;
    std::vector<std::vector<float>> keys_, values_;
};

}  // namespace kvcache::examples::testing
