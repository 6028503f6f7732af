// The seam between the model and attention: the forward pass hands each
// layer's rotated queries, keys and values to an attention_backend, which is
// either plain causal attention over the tokens of the call (recompute, no
// cache) or kvcache (append to the cache, then prefill/decode attention).
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "kvcache/core/element.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/layout/layout_interface.hpp"
#include "kvcache_engine/model_config.hpp"
#include "kvcache_engine/tensor_ops.hpp"
#include "kvcache_engine/thread_pool.hpp"

namespace kvcache::examples {

/// What the forward pass needs from attention.
class attention_backend {
public:
    virtual ~attention_backend() = default;

    /// Called once per forward pass before the layers: `tokens` new tokens at positions
    /// first_position .. first_position + tokens - 1 (a cache reserves their rows here).
    virtual void begin_tokens(int first_position, int tokens) = 0;

    /// One layer: q [tokens][query_heads][head_dim], k and v [tokens][kv_heads][head_dim] of the
    /// new tokens; writes out [tokens][query_heads][head_dim].
    virtual void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) = 0;
};

namespace detail {
template <class Element>
void round_scaled(float* data, std::size_t count, float scale) {
    for (std::size_t i = 0; i < count; ++i) data[i] = to_float_scaled(from_float_scaled<Element>(data[i], scale), scale);
}
// Each row of `row_length` values quantised with its own scales and read back (int8, int4).
template <class Element>
void round_rows(float* data, std::size_t count, int row_length) {
    std::vector<Element> row(static_cast<std::size_t>(row_elements<Element>(row_length)));
    for (std::size_t start = 0; start + static_cast<std::size_t>(row_length) <= count; start += std::size_t(row_length)) {
        float* values = data + start;
        quantise_row([values](int d) { return values[d]; }, row_length, row.data());
        widen_row(row.data(), row_length, 1.0f, values);
    }
}
}  // namespace detail

/// Rounds values through a storage element type, so recomputed K/V see the
/// same precision as K/V read back from a cache of that type (fp8: divided by
/// the layer's scale, rounded and saturated, multiplied back, as the cache
/// stores and reads them; int8 and int4: each row of row_length values, one head
/// of one token, quantised with its own scales as the cache's append does).
inline void round_through(element_kind kind, float* data, std::size_t count, float scale = 1.0f, int row_length = 0) {
    if (kind == element_kind::fp16) detail::round_scaled<half>(data, count, scale);
    if (kind == element_kind::bf16) detail::round_scaled<bfloat16>(data, count, scale);
    if (kind == element_kind::fp8_e4m3) detail::round_scaled<float8_e4m3>(data, count, scale);
    if (kind == element_kind::fp8_e5m2) detail::round_scaled<float8_e5m2>(data, count, scale);
    if (kind == element_kind::int8 || kind == element_kind::int4) {
        require(row_length > 0 && count % std::size_t(row_length) == 0, error_code::invalid_argument, "round_through ",
                to_string(kind), ": row_length = ", row_length, " must be positive and divide count = ", count);
        if (kind == element_kind::int8) detail::round_rows<qint8>(data, count, row_length);
        else detail::round_rows<qint4>(data, count, row_length);
    }
}

/// The type queries, outputs and new rows travel in to a GPU backend's cache
/// of this kind: the kind itself, fp16 for fp8, int8 and int4 (default_activation_t).
inline element_kind activation_kind(element_kind kind) noexcept {
    return is_scaled_kind(kind) || kind == element_kind::int8 || kind == element_kind::int4 ? element_kind::fp16 : kind;
}
/// The same for a cache's kinds: its keys' (a K/V pair's activation, default_activation_t).
inline element_kind activation_kind(kv_kinds kinds) noexcept { return activation_kind(kinds.key); }

/// Attention without a cache: every call holds the whole sequence from position 0,
/// causal. A layer the model windows (model_config::layer_window) sees its window and no
/// sinks; the other layers see what `visibility` allows, the rule a sliding-window cache
/// of the full layers applies.
/// With round_queries_outputs, queries and outputs are rounded through the
/// activation type too (activation_kind), as the CUDA backend takes and gives
/// them in it, and K/V through it before the storage type. fp8 K/V round with
/// the model's per-layer cache scales.
class recompute_attention final : public attention_backend {
public:
    recompute_attention(const model_config& config, thread_pool& pool, kv_kinds storage,
                        attention_visibility visibility = {}, bool round_queries_outputs = false)
        : heads_(config.heads()), layer_window_(config.layer_window), cache_scales_(config.cache_scales), pool_(pool), storage_(storage),
          visibility_(visibility), round_queries_outputs_(round_queries_outputs) {}

    void begin_tokens(int first_position, int) override {
        require(first_position == 0, error_code::invalid_argument, "recompute_attention: first_position = ",
                first_position, " must be 0 (nothing is cached)");
    }

    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        const int model_window = layer_window_.empty() ? 0 : layer_window_.at(static_cast<std::size_t>(layer));
        const attention_visibility visibility = model_window > 0 ? attention_visibility{model_window, 0} : visibility_;
        const int qh = heads_.query_heads, kvh = heads_.kv_heads, d = heads_.head_dim, group = heads_.group_size();
        std::size_t kv_count = static_cast<std::size_t>(tokens) * kvh * d;
        keys_.assign(k, k + kv_count);
        values_.assign(v, v + kv_count);
        const element_kind travel = activation_kind(storage_);
        if (round_queries_outputs_ && travel != storage_) {
            round_through(travel, keys_.data(), kv_count);
            round_through(travel, values_.data(), kv_count);
        }
        const kv_scales scales = cache_scales_.empty() ? kv_scales{} : cache_scales_.at(static_cast<std::size_t>(layer));
        round_through(storage_.key, keys_.data(), kv_count, scales.key, d);
        round_through(storage_.value, values_.data(), kv_count, scales.value, d);
        if (round_queries_outputs_) {
            std::size_t q_count = static_cast<std::size_t>(tokens) * qh * d;
            queries_.assign(q, q + q_count);
            round_through(travel, queries_.data(), q_count);
            q = queries_.data();
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        pool_.parallel_for(tokens * qh, [&](int begin, int end) {
            std::vector<float> scores(tokens);
            std::vector<float> acc(d);
            for (int item = begin; item < end; ++item) {
                int t = item / qh, h = item % qh, kv = h / group;
                const float* qrow = q + (static_cast<std::size_t>(t) * qh + h) * d;
                float best = -INFINITY;
                for (int j = 0; j <= t; ++j) {
                    if (!visibility.allows(t, j)) {
                        scores[j] = -INFINITY;
                        continue;
                    }
                    const float* krow = keys_.data() + (static_cast<std::size_t>(j) * kvh + kv) * d;
                    scores[j] = dot(qrow, krow, d) * scale;
                    if (scores[j] > best) best = scores[j];
                }
                float total = 0.0f;
                for (int i = 0; i < d; ++i) acc[i] = 0.0f;
                for (int j = 0; j <= t; ++j) {
                    if (scores[j] == -INFINITY) continue;
                    float p = std::exp(scores[j] - best);
                    total += p;
                    const float* vrow = values_.data() + (static_cast<std::size_t>(j) * kvh + kv) * d;
                    for (int i = 0; i < d; ++i) acc[i] += p * vrow[i];
                }
                float* orow = out + (static_cast<std::size_t>(t) * qh + h) * d;
                for (int i = 0; i < d; ++i) orow[i] = acc[i] / total;
                if (round_queries_outputs_) round_through(travel, orow, static_cast<std::size_t>(d));
            }
        });
    }

private:
    head_shape heads_;
    std::vector<int> layer_window_;
    std::vector<kv_scales> cache_scales_;  ///< model_config::cache_scales
    thread_pool& pool_;
    kv_kinds storage_;
    attention_visibility visibility_;
    bool round_queries_outputs_;
    std::vector<float> keys_, values_, queries_;
};

}  // namespace kvcache::examples
