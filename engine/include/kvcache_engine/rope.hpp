// Rotary position embedding in the Hugging Face "rotate half" convention:
// dimension i pairs with i + head_dim/2.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "kvcache_engine/model_config.hpp"

namespace kvcache::examples {

/// Inverse frequencies of a head, with the config's rope scaling applied.
class rope_table {
public:
    rope_table() = default;

    explicit rope_table(const model_config& config) : half_(config.head_dim / 2) {
        const double pi = 3.14159265358979323846;
        inv_freq_.resize(half_);
        for (int i = 0; i < half_; ++i) {
            double freq = 1.0 / std::pow(config.rope_theta, 2.0 * i / config.head_dim);
            const rope_scaling& s = config.scaling;
            if (s.type == rope_scaling::kind::linear) {
                freq /= s.factor;
            } else if (s.type == rope_scaling::kind::llama3) {
                // Long wavelengths are stretched by `factor`, short ones kept, and the band between blended.
                double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
                double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
                double wavelen = 2.0 * pi / freq;
                if (wavelen > low_wavelen) {
                    freq /= s.factor;
                } else if (wavelen >= high_wavelen) {
                    double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                                    (s.high_freq_factor - s.low_freq_factor);
                    freq = (1.0 - smooth) * freq / s.factor + smooth * freq;
                }
            }
            inv_freq_[i] = freq;
        }
    }

    /// Rotates `rows` rows of `heads` head vectors in place; row t is at position first_position + t.
    void apply(float* data, int rows, int heads, int first_position) const {
        std::vector<float> cos_v(half_), sin_v(half_);
        int dim = 2 * half_;
        for (int t = 0; t < rows; ++t) {
            double position = first_position + t;
            for (int i = 0; i < half_; ++i) {
                double angle = position * inv_freq_[i];
                cos_v[i] = static_cast<float>(std::cos(angle));
                sin_v[i] = static_cast<float>(std::sin(angle));
            }
            for (int h = 0; h < heads; ++h) {
                float* x = data + (static_cast<std::size_t>(t) * heads + h) * dim;
                for (int i = 0; i < half_; ++i) {
                    float a = x[i], b = x[i + half_];
                    x[i] = a * cos_v[i] - b * sin_v[i];
                    x[i + half_] = b * cos_v[i] + a * sin_v[i];
                }
            }
        }
    }

private:
    int half_ = 0;
    std::vector<double> inv_freq_;
};

}  // namespace kvcache::examples
