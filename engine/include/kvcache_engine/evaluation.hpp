// A model's quality measured through the cached decode path: every token of a
// sequence goes into a kvcache owner one at a time (as generation feeds it
// after the prompt), and the logits of each step are scored against the next
// token (teacher forcing). Perplexity of text and accuracy of recall queries
// come out of the same pass, so a cache that drops, windows or quantises K/V
// (the owner's layout and element type) shows up in both.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/tensor_ops.hpp"
#include "kvcache_engine/timing.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace kvcache::examples {

/// What a teacher-forced sequence left in its cache, and the time its decode steps took.
struct cache_footprint {
    std::vector<int> rows_held;   ///< per layer, rows the sequence held after its last step
    std::size_t bytes_used = 0;   ///< the owner's bytes in use then (paged: its pages; else reserved)
    int compactions = 0;          ///< compactions the policy ran
    double decode_seconds = 0.0;  ///< the one-token forward passes, summed
    int decode_steps = 0;         ///< their number
};

/// Feeds tokens[0 .. count-2] into a fresh owner of the layout and element type `cache` asks
/// for (with its compression policy): the first `prompt` tokens as one prefill (its logits,
/// those of position prompt - 1, observed), then one at a time at positions prompt, prompt + 1,
/// ..., calling observe(position, logits, vocab) after each: the logits predict
/// tokens[position + 1]. Models that window some of their own layers (Mistral, some Qwen2) are
/// refused: their cached path routes layers to two owners.
/// @tparam Configurations a type_list of kvcache::configuration to dispatch over
/// @tparam Observe a callable taking (int position, const float* logits, int vocab)
template <class Configurations = engine_configurations, class Observe>
cache_footprint teacher_force_with_kvcache(llama_model& model, const std::vector<int>& tokens, int count,
                                           const cache_options& cache, Observe&& observe, int prompt = 1) {
    const model_config& c = model.config();
    require(count >= 2 && static_cast<std::size_t>(count) <= tokens.size(), error_code::invalid_argument,
            "teacher forcing: count = ", count, " must be in [2, ", tokens.size(), "] (the sequence's length)");
    require(prompt >= 1 && prompt < count, error_code::invalid_argument, "teacher forcing: prompt = ", prompt,
            " must be in [1, count - 1 = ", count - 1, "]");
    require(c.layer_window.empty(), error_code::unsupported_configuration,
            "teacher forcing: the model windows some of its own layers; only full-attention models are evaluated");
    return dispatch(Configurations{}, wanted_configuration(model, cache), [&](auto config) {
        using configuration = decltype(config);
        using element = typename configuration::element;
        using heads = typename configuration::heads;
        return detail::with_owner<element, heads, host_memory>(
            typename configuration::layout{}, config.head_counts(), cache, c.num_layers, count, [&](auto& owner) {
                kvcache_attention<std::decay_t<decltype(owner)>> attention(owner);
                attention.compress_with(cache.compression);
                cache_footprint footprint;
                std::vector<float> logits = model.forward(tokens.data(), prompt, 0, attention);
                observe(prompt - 1, logits.data(), static_cast<int>(logits.size()));
                for (int t = prompt; t + 1 < count; ++t) {
                    const auto start = std::chrono::steady_clock::now();
                    logits = model.forward(&tokens[static_cast<std::size_t>(t)], 1, t, attention);
                    footprint.decode_seconds += seconds_since(start);
                    ++footprint.decode_steps;
                    observe(t, logits.data(), static_cast<int>(logits.size()));
                }
                footprint.rows_held = attention.rows_held();
                footprint.compactions = attention.compactions();
                footprint.bytes_used = bytes_used_of(owner);
                return footprint;
            });
    });
}

/// -log softmax(logits)[target], in double.
inline double negative_log_likelihood(const float* logits, int vocab, int target) {
    require(target >= 0 && target < vocab, error_code::out_of_range, "token id ", target,
            " is outside the vocabulary of ", vocab);
    double best = logits[0];
    for (int i = 1; i < vocab; ++i) best = std::max(best, double(logits[i]));
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - best);
    return best + std::log(sum) - double(logits[target]);
}

/// log softmax(logits), in double: one next-token distribution as log-probabilities.
inline std::vector<double> log_probabilities(const float* logits, int vocab) {
    double best = logits[0];
    for (int i = 1; i < vocab; ++i) best = std::max(best, double(logits[i]));
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - best);
    const double log_sum = best + std::log(sum);
    std::vector<double> out(static_cast<std::size_t>(vocab));
    for (int i = 0; i < vocab; ++i) out[static_cast<std::size_t>(i)] = double(logits[i]) - log_sum;
    return out;
}

/// KL(reference || other) of two next-token distributions given as log-probabilities
/// (log_probabilities), in nats; rounding below zero is clamped to 0.
inline double kl_divergence(const std::vector<double>& reference, const std::vector<double>& other) {
    double kl = 0.0;
    for (std::size_t i = 0; i < reference.size(); ++i) kl += std::exp(reference[i]) * (reference[i] - other[i]);
    return std::max(kl, 0.0);
}

/// Summed negative log-likelihood of sequences, each scored from its second token on.
struct perplexity_result {
    double nats = 0.0;                  ///< over all sequences
    std::int64_t predicted_tokens = 0;  ///< tokens scored (each sequence's length minus one)
    std::vector<double> sequence_nats;  ///< per sequence, in order

    /// Mean negative log-likelihood per scored token.
    double nats_per_token() const noexcept { return predicted_tokens ? nats / double(predicted_tokens) : 0.0; }
    /// The same in bits (bits per byte for a byte-level model).
    double bits_per_token() const noexcept { return nats_per_token() / std::log(2.0); }
};

/// Perplexity through the cached decode path (teacher_force_with_kvcache): each sequence in a
/// fresh cache, every token after its first scored.
/// @tparam Configurations a type_list of kvcache::configuration to dispatch over
template <class Configurations = engine_configurations>
perplexity_result evaluate_perplexity(llama_model& model, const std::vector<std::vector<int>>& sequences,
                                      const cache_options& cache = {}) {
    perplexity_result result;
    for (const std::vector<int>& sequence : sequences) {
        double nats = 0.0;
        teacher_force_with_kvcache<Configurations>(
            model, sequence, static_cast<int>(sequence.size()), cache,
            [&](int t, const float* logits, int vocab) {
                nats += negative_log_likelihood(logits, vocab, sequence[static_cast<std::size_t>(t) + 1]);
            });
        result.sequence_nats.push_back(nats);
        result.nats += nats;
        result.predicted_tokens += static_cast<std::int64_t>(sequence.size()) - 1;
    }
    return result;
}

/// One recall query: the answer is tokens[first .. first + length - 1] of its item.
struct recall_query {
    int first = 0;
    int length = 0;
};

/// A recall text as token ids and the positions of the answers it asks for.
struct recall_item {
    std::vector<int> tokens;
    std::vector<recall_query> answers;
};

/// Which queries the model answered: all of an answer's tokens are the argmax of the logits
/// before them, given the true text before each (what greedy generation would produce).
struct recall_result {
    std::vector<bool> correct;               ///< per query, items in order
    std::vector<std::vector<int>> predicted;  ///< per query, the argmax token at each answer position

    /// Queries answered right.
    int right() const noexcept {
        int n = 0;
        for (bool c : correct) n += c;
        return n;
    }
    /// right() over the number of queries.
    double accuracy() const noexcept { return correct.empty() ? 0.0 : double(right()) / double(correct.size()); }
};

/// Recall accuracy through the cached decode path (teacher_force_with_kvcache), each item in
/// a fresh cache, fed up to its last answer token.
/// @tparam Configurations a type_list of kvcache::configuration to dispatch over
template <class Configurations = engine_configurations>
recall_result evaluate_recall(llama_model& model, const std::vector<recall_item>& items,
                              const cache_options& cache = {}) {
    recall_result result;
    for (std::size_t i = 0; i < items.size(); ++i) {
        const recall_item& item = items[i];
        int end = 0;
        for (const recall_query& q : item.answers) {
            require(q.first >= 1 && q.length >= 1 && q.first + q.length <= static_cast<int>(item.tokens.size()),
                    error_code::out_of_range, "recall item ", i, ": answer [", q.first, ", ", q.first + q.length,
                    ") is outside its ", item.tokens.size(), " tokens (an answer starts at token 1 or later)");
            end = std::max(end, q.first + q.length);
        }
        std::vector<int> predicted(item.tokens.size(), -1);
        if (end > 0)
            teacher_force_with_kvcache<Configurations>(model, item.tokens, end, cache,
                                                       [&](int t, const float* logits, int vocab) {
                                                           predicted[static_cast<std::size_t>(t) + 1] =
                                                               argmax(logits, vocab);
                                                       });
        for (const recall_query& q : item.answers) {
            const auto first = predicted.begin() + q.first;
            result.predicted.emplace_back(first, first + q.length);
            result.correct.push_back(std::equal(first, first + q.length, item.tokens.begin() + q.first));
        }
    }
    return result;
}

}  // namespace kvcache::examples
