// A model's quality measured through the cached decode path: every token of a
// sequence goes into a kvcache owner one at a time (as generation feeds it
// after the prompt), and the logits of each step are scored against the next
// token (teacher forcing). Perplexity of text and accuracy of recall queries
// come out of the same pass, so a cache that drops, windows or quantises K/V
// (the owner's layout and element type) shows up in both.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/tensor_ops.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace kvcache::examples {

/// Feeds tokens[0 .. count-2] one at a time at positions 0, 1, ... into a fresh owner of the
/// layout and element type `cache` asks for, and calls observe(position, logits, vocab) after
/// each: the logits predict tokens[position + 1]. Models that window some of their own layers
/// (Mistral, some Qwen2) are refused: their cached path routes layers to two owners.
/// @tparam Configurations a type_list of kvcache::configuration to dispatch over
/// @tparam Observe a callable taking (int position, const float* logits, int vocab)
template <class Configurations = engine_configurations, class Observe>
void teacher_force_with_kvcache(llama_model& model, const std::vector<int>& tokens, int count,
                                const cache_options& cache, Observe&& observe) {
    const model_config& c = model.config();
    require(count >= 2 && static_cast<std::size_t>(count) <= tokens.size(), error_code::invalid_argument,
            "teacher forcing: count = ", count, " must be in [2, ", tokens.size(), "] (the sequence's length)");
    require(c.layer_window.empty(), error_code::unsupported_configuration,
            "teacher forcing: the model windows some of its own layers; only full-attention models are evaluated");
    dispatch(Configurations{}, wanted_configuration(model, cache), [&](auto config) {
        using configuration = decltype(config);
        using element = typename configuration::element;
        using heads = typename configuration::heads;
        return detail::with_owner<element, heads, host_memory>(
            typename configuration::layout{}, config.head_counts(), cache, c.num_layers, count, [&](auto& owner) {
                kvcache_attention<std::decay_t<decltype(owner)>> attention(owner);
                for (int t = 0; t + 1 < count; ++t) {
                    const std::vector<float> logits = model.forward(&tokens[static_cast<std::size_t>(t)], 1, t, attention);
                    observe(t, logits.data(), static_cast<int>(logits.size()));
                }
                return 0;
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
