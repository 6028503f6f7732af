// A Llama-architecture decoder computing in float on the CPU: RMSNorm,
// rotary position embedding, grouped-query attention (through an
// attention_backend), SwiGLU MLP, and greedy generation.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "kvcache_engine/attention_backend.hpp"
#include "kvcache_engine/model_weights.hpp"
#include "kvcache_engine/rope.hpp"
#include "kvcache_engine/tensor_ops.hpp"
#include "kvcache_engine/thread_pool.hpp"
#include "kvcache_engine/timing.hpp"

namespace kvcache::examples {

/// The decoder: weights plus the forward pass. Attention is delegated so the same
/// model runs with and without kvcache.
class llama_model {
public:
    llama_model(model_weights weights, thread_pool& pool)
        : weights_(std::move(weights)), rope_(weights_.config), pool_(pool) {
        weights_.config.validate();
    }

    const model_config& config() const noexcept { return weights_.config; }
    const model_weights& weights() const noexcept { return weights_; }
    thread_pool& pool() noexcept { return pool_; }

    /// Runs `count` tokens at positions first_position.. through every layer and returns the
    /// logits of the last one ([vocab_size]).
    std::vector<float> forward(const int* tokens, int count, int first_position, attention_backend& attention) {
        const model_config& c = weights_.config;
        require(count > 0, error_code::invalid_argument, "forward: token count ", count, " must be positive");
        const std::size_t h = c.hidden_size, rows = count;
        x_.resize(rows * h);
        for (int t = 0; t < count; ++t) {
            require(tokens[t] >= 0 && tokens[t] < c.vocab_size, error_code::out_of_range, "token id ", tokens[t],
                    " is outside the vocabulary of ", c.vocab_size);
            const float* e = weights_.embedding.data() + static_cast<std::size_t>(tokens[t]) * h;
            std::copy(e, e + h, x_.data() + t * h);
        }
        normed_.resize(rows * h);
        q_.resize(rows * c.q_width());
        k_.resize(rows * c.kv_width());
        v_.resize(rows * c.kv_width());
        attn_.resize(rows * c.q_width());
        proj_.resize(rows * h);
        gate_.resize(rows * c.intermediate_size);
        up_.resize(rows * c.intermediate_size);

        attention.begin_tokens(first_position, count);
        for (int l = 0; l < c.num_layers; ++l) {
            const layer_weights& w = weights_.layers[l];
            rms_norm(x_.data(), count, c.hidden_size, w.attention_norm.data(), c.rms_norm_eps, normed_.data());
            matmul(pool_, normed_.data(), count, c.hidden_size, w.wq.data(), bias(w.bq), c.q_width(), q_.data());
            matmul(pool_, normed_.data(), count, c.hidden_size, w.wk.data(), bias(w.bk), c.kv_width(), k_.data());
            matmul(pool_, normed_.data(), count, c.hidden_size, w.wv.data(), bias(w.bv), c.kv_width(), v_.data());
            rope_.apply(q_.data(), count, c.num_query_heads, first_position);
            rope_.apply(k_.data(), count, c.num_kv_heads, first_position);
            attention.attend(l, q_.data(), k_.data(), v_.data(), count, attn_.data());
            matmul(pool_, attn_.data(), count, c.q_width(), w.wo.data(), bias(w.bo), c.hidden_size, proj_.data());
            for (std::size_t i = 0; i < rows * h; ++i) x_[i] += proj_[i];

            rms_norm(x_.data(), count, c.hidden_size, w.mlp_norm.data(), c.rms_norm_eps, normed_.data());
            matmul(pool_, normed_.data(), count, c.hidden_size, w.w_gate.data(), nullptr, c.intermediate_size,
                   gate_.data());
            matmul(pool_, normed_.data(), count, c.hidden_size, w.w_up.data(), nullptr, c.intermediate_size, up_.data());
            swiglu(gate_.data(), up_.data(), rows * c.intermediate_size);
            matmul(pool_, gate_.data(), count, c.intermediate_size, w.w_down.data(), nullptr, c.hidden_size,
                   proj_.data());
            for (std::size_t i = 0; i < rows * h; ++i) x_[i] += proj_[i];
        }
        // Only the last token's logits drive greedy decoding.
        std::vector<float> last(h), logits(c.vocab_size);
        rms_norm(x_.data() + (rows - 1) * h, 1, c.hidden_size, weights_.final_norm.data(), c.rms_norm_eps, last.data());
        matmul(pool_, last.data(), 1, c.hidden_size, weights_.output_matrix(), nullptr, c.vocab_size, logits.data());
        return logits;
    }

private:
    static const float* bias(const std::vector<float>& b) noexcept { return b.empty() ? nullptr : b.data(); }

    model_weights weights_;
    rope_table rope_;
    thread_pool& pool_;
    std::vector<float> x_, normed_, q_, k_, v_, attn_, proj_, gate_, up_;
};

/// What greedy generation produced, with the time of each step.
struct generation_trace {
    std::vector<int> tokens;                  ///< the generated ids, prompt excluded
    std::vector<std::vector<float>> logits;   ///< per step, when kept
    std::vector<double> step_seconds;         ///< step 0 includes the prompt (prefill)
};

/// How generate() feeds the model.
enum class generation_mode {
    recompute,  ///< every step runs the whole sequence so far from position 0
    cached      ///< step 0 runs the prompt, later steps only the newest token
};

/// Knobs of generate().
struct generation_options {
    bool keep_logits = false;             ///< keep every step's logits in the trace
    int prefill_chunk = 0;                ///< cached mode: feed the prompt in chunks of at most this many tokens (0: whole)
    std::function<void(int)> progress;    ///< called with the step index after each step, when set
};

/// Greedy generation of new_tokens ids after the prompt. The attention backend must match the
/// mode (recompute_attention for recompute, a cache for cached).
inline generation_trace generate(llama_model& model, const std::vector<int>& prompt, int new_tokens,
                                 attention_backend& attention, generation_mode mode,
                                 const generation_options& options = {}) {
    require(!prompt.empty(), error_code::invalid_argument, "generate: the prompt is empty");
    require(new_tokens > 0, error_code::invalid_argument, "generate: new_tokens = ", new_tokens, " must be positive");
    generation_trace trace;
    std::vector<int> sequence = prompt;
    for (int step = 0; step < new_tokens; ++step) {
        auto start = std::chrono::steady_clock::now();
        std::vector<float> logits;
        const int length = static_cast<int>(sequence.size());
        if (mode == generation_mode::recompute) {
            logits = model.forward(sequence.data(), length, 0, attention);
        } else if (step == 0) {
            int chunk = options.prefill_chunk > 0 ? options.prefill_chunk : length;
            for (int first = 0; first < length; first += chunk)
                logits = model.forward(&sequence[first], std::min(chunk, length - first), first, attention);
        } else {
            logits = model.forward(&sequence[length - 1], 1, length - 1, attention);
        }
        int next = argmax(logits.data(), static_cast<int>(logits.size()));
        trace.step_seconds.push_back(seconds_since(start));
        trace.tokens.push_back(next);
        if (options.keep_logits) trace.logits.push_back(std::move(logits));
        sequence.push_back(next);
        if (options.progress) options.progress(step);
    }
    return trace;
}

}  // namespace kvcache::examples
