// The reference backend: obvious attention in double precision over K/V rows
// gathered through the layout interface alone. It is the oracle of every
// kernel test, so it is written for clarity, not speed, and shares no code
// with the kernels beyond the layout interface and the options.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/kernels/attention_options.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace reference {

/// The present key/value rows of one (sequence, KV head) in visible order, widened to double.
struct gathered_rows {
    int head_dim = 0;
    std::vector<int> positions;   ///< logical position of each row
    std::vector<double> keys;     ///< [rows][head_dim]
    std::vector<double> values;   ///< [rows][head_dim]
    int rows() const noexcept { return static_cast<int>(positions.size()); }
};

/// Reads every visible row of (sequence, kv_head) through key()/value().
/// @tparam Layout a layout view over host-accessible memory
template <class Layout>
gathered_rows gather(const Layout& view, int sequence, int kv_head) {
    static_assert(is_layout_view_v<Layout>, "kvcache::reference::gather needs a layout view");
    constexpr int dim = Layout::heads::head_dim;
    gathered_rows rows;
    rows.head_dim = dim;
    const int count = view.visible_count(sequence);
    for (int i = 0; i < count; ++i) {
        const int position = view.visible_position(sequence, i);
        const auto* key = view.key(sequence, kv_head, position);
        const auto* value = view.value(sequence, kv_head, position);
        rows.positions.push_back(position);
        for (int d = 0; d < dim; ++d) rows.keys.push_back(static_cast<double>(to_float(key[d])));
        for (int d = 0; d < dim; ++d) rows.values.push_back(static_cast<double>(to_float(value[d])));
    }
    return rows;
}

/// Outputs and log-sum-exps of a reference attention call, in double.
struct attention_result {
    std::vector<double> outputs;  ///< [query rows][query_heads][head_dim]
    std::vector<double> lse;      ///< [query rows][query_heads]; -inf for a query that sees nothing
};

namespace detail {

/// Attention of one query row over gathered rows; writes head_dim outputs, returns the lse.
inline double attend(const double* query, const gathered_rows& rows, int query_position,
                     const attention_visibility& visibility, double scale, double cap, double* output) {
    const int dim = rows.head_dim;
    std::vector<double> logits;
    std::vector<int> seen;
    double max_logit = -std::numeric_limits<double>::infinity();
    for (int r = 0; r < rows.rows(); ++r) {
        if (!visibility.allows(query_position, rows.positions[r])) continue;
        double dot = 0.0;
        for (int d = 0; d < dim; ++d) dot += query[d] * rows.keys[static_cast<std::size_t>(r) * dim + d];
        double logit = dot * scale;
        if (cap > 0.0) logit = cap * std::tanh(logit / cap);
        logits.push_back(logit);
        seen.push_back(r);
        if (logit > max_logit) max_logit = logit;
    }
    for (int d = 0; d < dim; ++d) output[d] = 0.0;
    if (seen.empty()) return -std::numeric_limits<double>::infinity();
    double sum = 0.0;
    for (std::size_t i = 0; i < seen.size(); ++i) {
        const double weight = std::exp(logits[i] - max_logit);
        sum += weight;
        for (int d = 0; d < dim; ++d) output[d] += weight * rows.values[static_cast<std::size_t>(seen[i]) * dim + d];
    }
    for (int d = 0; d < dim; ++d) output[d] /= sum;
    return max_logit + std::log(sum);
}

/// Attention of `tokens` query tokens of one sequence, the last positions of it.
template <class Layout, class Query>
void attend_sequence(const Layout& view, int sequence, int tokens, const Query* queries,
                     const attention_options& options, double* outputs, double* lse) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim;
    const double scale = options.softmax_scale != 0.0f ? options.softmax_scale : 1.0 / std::sqrt(double(dim));
    const int length = view.length(sequence);
    require(tokens <= length, error_code::invalid_argument, "sequence ", sequence, " has ", tokens,
            " query tokens but only length ", length);
    std::vector<double> query(dim);
    for (int kv = 0; kv < heads::kv_heads; ++kv) {
        const gathered_rows rows = gather(view, sequence, kv);
        for (int t = 0; t < tokens; ++t) {
            for (int g = 0; g < heads::group_size; ++g) {
                const int head = kv * heads::group_size + g;
                const std::size_t row = static_cast<std::size_t>(t) * heads::query_heads + head;
                for (int d = 0; d < dim; ++d) query[d] = to_float(queries[row * dim + d]);
                lse[row] = attend(query.data(), rows, length - tokens + t, view.visibility(), scale,
                                  options.logits_soft_cap, outputs + row * dim);
            }
        }
    }
}

template <class Output>
void narrow(const attention_result& result, Output* outputs, float* lse) {
    for (std::size_t i = 0; i < result.outputs.size(); ++i) outputs[i] = from_float<Output>(float(result.outputs[i]));
    if (lse)
        for (std::size_t i = 0; i < result.lse.size(); ++i) lse[i] = static_cast<float>(result.lse[i]);
}

}  // namespace detail

/// Decode attention in double: one query per sequence at position length-1.
/// queries: [batch][query_heads][head_dim].
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Query float or kvcache::half
template <class Layout, class Query>
attention_result decode_attention_exact(const Layout& view, const Query* queries, const attention_options& options = {}) {
    using heads = typename Layout::heads;
    const int batch = view.sequence_count();
    attention_result result;
    result.outputs.assign(static_cast<std::size_t>(batch) * heads::query_heads * heads::head_dim, 0.0);
    result.lse.assign(static_cast<std::size_t>(batch) * heads::query_heads, 0.0);
    for (int b = 0; b < batch; ++b) {
        const std::size_t row = static_cast<std::size_t>(b) * heads::query_heads;
        const int tokens = view.length(b) > 0 ? 1 : 0;
        if (tokens == 0) {
            for (int h = 0; h < heads::query_heads; ++h) result.lse[row + h] = -std::numeric_limits<double>::infinity();
            continue;
        }
        detail::attend_sequence(view, b, 1, queries + row * heads::head_dim, options,
                                result.outputs.data() + row * heads::head_dim, result.lse.data() + row);
    }
    return result;
}

/// Prefill attention in double: the last n_b positions of sequence b query the
/// cached prefix and, causally, their own chunk. queries: [total tokens][query_heads][head_dim],
/// query_offsets[batch + 1] CSR.
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Query float or kvcache::half
template <class Layout, class Query>
attention_result prefill_attention_exact(const Layout& view, const Query* queries, const int* query_offsets,
                                         const attention_options& options = {}) {
    using heads = typename Layout::heads;
    const int batch = view.sequence_count();
    const int total = query_offsets[batch];
    attention_result result;
    result.outputs.assign(static_cast<std::size_t>(total) * heads::query_heads * heads::head_dim, 0.0);
    result.lse.assign(static_cast<std::size_t>(total) * heads::query_heads, 0.0);
    for (int b = 0; b < batch; ++b) {
        const int tokens = query_offsets[b + 1] - query_offsets[b];
        require(tokens >= 0, error_code::invalid_argument, "query_offsets decrease at sequence ", b);
        const std::size_t row = static_cast<std::size_t>(query_offsets[b]) * heads::query_heads;
        detail::attend_sequence(view, b, tokens, queries + row * heads::head_dim, options,
                                result.outputs.data() + row * heads::head_dim, result.lse.data() + row);
    }
    return result;
}

/// Decode attention, results narrowed to Query. See decode_attention_exact.
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Query float or kvcache::half
template <class Layout, class Query>
void decode_attention(const Layout& view, const Query* queries, Query* outputs, const attention_options& options = {}) {
    detail::narrow(decode_attention_exact(view, queries, options), outputs, nullptr);
}

/// Decode attention that also writes the log-sum-exp of each (sequence, query head) (may be null).
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Query float or kvcache::half
template <class Layout, class Query>
void decode_attention_with_lse(const Layout& view, const Query* queries, Query* outputs, float* lse,
                               const attention_options& options = {}) {
    detail::narrow(decode_attention_exact(view, queries, options), outputs, lse);
}

/// Prefill attention, results narrowed to Query. See prefill_attention_exact.
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Query float or kvcache::half
template <class Layout, class Query>
void prefill_attention(const Layout& view, const Query* queries, const int* query_offsets, Query* outputs,
                       const attention_options& options = {}) {
    detail::narrow(prefill_attention_exact(view, queries, query_offsets, options), outputs, nullptr);
}

/// Prefill attention that also writes the log-sum-exp of each (token, query head) (may be null).
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Query float or kvcache::half
template <class Layout, class Query>
void prefill_attention_with_lse(const Layout& view, const Query* queries, const int* query_offsets, Query* outputs,
                                float* lse, const attention_options& options = {}) {
    detail::narrow(prefill_attention_exact(view, queries, query_offsets, options), outputs, lse);
}

/// True when position is present in the sequence (the sliding window may have dropped it).
/// @tparam Layout a layout view
template <class Layout>
bool is_present(const Layout& view, int sequence, int position) {
    const int count = view.visible_count(sequence);
    for (int i = 0; i < count; ++i)
        if (view.visible_position(sequence, i) == position) return true;
    return false;
}

/// Writes the new tokens' K/V (the last n_b positions of sequence b) through
/// key()/value(); positions the layout no longer holds are skipped.
/// keys/values: [total new tokens][kv_heads][head_dim]; new_token_offsets[batch + 1].
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Input float or kvcache::half
template <class Layout, class Input>
void append(const Layout& view, const Input* keys, const Input* values, const int* new_token_offsets) {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    constexpr int dim = heads::head_dim;
    for (int b = 0; b < view.sequence_count(); ++b) {
        const int tokens = new_token_offsets[b + 1] - new_token_offsets[b];
        const int length = view.length(b);
        require(tokens >= 0 && tokens <= length, error_code::invalid_argument, "sequence ", b, " appends ", tokens,
                " tokens but its length is ", length);
        for (int t = 0; t < tokens; ++t) {
            const int position = length - tokens + t;
            if (!is_present(view, b, position)) continue;
            for (int kv = 0; kv < heads::kv_heads; ++kv) {
                const std::size_t source = (static_cast<std::size_t>(new_token_offsets[b] + t) * heads::kv_heads + kv) * dim;
                element* key = view.key(b, kv, position);
                element* value = view.value(b, kv, position);
                for (int d = 0; d < dim; ++d) {
                    key[d] = from_float<element>(to_float(keys[source + d]));
                    value[d] = from_float<element>(to_float(values[source + d]));
                }
            }
        }
    }
}

/// Merges partial attention states in double. outputs: [states][rows][head_dim],
/// lse: [states][rows]; a state with lse = -inf is empty and weighs nothing.
/// Writes merged[rows][head_dim] and merged_lse[rows] (may be null).
/// @tparam State float or kvcache::half
/// @tparam Output float or kvcache::half
template <class State, class Output>
void merge_states(int states, int rows, int head_dim, const State* outputs, const float* lse, Output* merged,
                  float* merged_lse) {
    for (int r = 0; r < rows; ++r) {
        double max_lse = -std::numeric_limits<double>::infinity();
        for (int s = 0; s < states; ++s) max_lse = std::fmax(max_lse, double(lse[static_cast<std::size_t>(s) * rows + r]));
        std::vector<double> sum(head_dim, 0.0);
        double total = 0.0;
        if (max_lse != -std::numeric_limits<double>::infinity()) {
            for (int s = 0; s < states; ++s) {
                const double l = lse[static_cast<std::size_t>(s) * rows + r];
                if (l == -std::numeric_limits<double>::infinity()) continue;
                const double weight = std::exp(l - max_lse);
                total += weight;
                const State* o = outputs + (static_cast<std::size_t>(s) * rows + r) * head_dim;
                for (int d = 0; d < head_dim; ++d) sum[d] += weight * to_float(o[d]);
            }
        }
        for (int d = 0; d < head_dim; ++d)
            merged[static_cast<std::size_t>(r) * head_dim + d] = from_float<Output>(total > 0 ? float(sum[d] / total) : 0.0f);
        if (merged_lse)
            merged_lse[r] = total > 0 ? float(max_lse + std::log(total)) : -std::numeric_limits<float>::infinity();
    }
}

}  // namespace reference
}  // namespace kvcache
