// The reference backend: obvious attention in double precision over K/V rows
// gathered through the layout interface alone. It is the oracle of every
// kernel test, so it is written for clarity, not speed, and shares no code
// with the kernels beyond the layout interface, the options and the argument
// checks every backend makes.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kvcache/backend/detail/call_checks.hpp"
#include "kvcache/backend/operation_params.hpp"
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

/// Appends the head_dim values a stored row means, in double: an int8 row's
/// values times its own scale, an int4 row's group minimum + code * scale, any
/// other type's values times the layer scale (1 but for fp8).
/// @tparam Element a stored element type
template <class Element>
void append_dequantised(const Element* row, int dim, float layer_scale, std::vector<double>& out) {
    if constexpr (std::is_same_v<std::remove_cv_t<Element>, qint4>) {
        (void)layer_scale;
        for (int d = 0; d < dim; ++d) {
            const qint4_group g = qint4_group_of(row, dim, d / qint4_group_size);
            out.push_back(double(g.minimum) + double(qint4_code(row, d)) * double(g.scale));
        }
    } else {
        const double scale = double(layer_scale) * row_scale_of(row, dim);  // an int8 row's own scale; 1 otherwise
        for (int d = 0; d < dim; ++d) out.push_back(static_cast<double>(to_float(row[d])) * scale);
    }
}

/// Reads every visible row of (sequence, kv_head) through key()/value().
/// @tparam Layout a layout view over host-accessible memory
template <class Layout>
gathered_rows gather(const Layout& view, int sequence, int kv_head) {
    static_assert(is_layout_view_v<Layout>, "kvcache::reference::gather needs a layout view");
    constexpr int dim = Layout::heads::head_dim;
    gathered_rows rows;
    const kv_scales scales = scales_of(view);
    rows.head_dim = dim;
    const int count = view.visible_count(sequence);
    for (int i = 0; i < count; ++i) {
        const int position = view.visible_position(sequence, i);
        const auto* key = view.key(sequence, kv_head, position);
        const auto* value = view.value(sequence, kv_head, position);
        rows.positions.push_back(position);
        append_dequantised(key, dim, scales.key, rows.keys);
        append_dequantised(value, dim, scales.value, rows.values);
    }
    return rows;
}

/// Outputs and log-sum-exps of a reference attention call, in double.
struct attention_result {
    std::vector<double> outputs;  ///< [query rows][query_heads][head_dim]
    std::vector<double> lse;      ///< [query rows][query_heads]; -inf for a query that sees nothing
    std::vector<double> scores;   ///< when the call asked for scores: [batch][kv_heads][score_stride]
};

namespace detail {

/// Attention of one query row over gathered rows; writes head_dim outputs,
/// adds each row's softmax weight to row_scores[visible index] when not null,
/// returns the lse.
inline double attend(const double* query, const gathered_rows& rows, int query_position,
                     const attention_visibility& visibility, double scale, double cap, double* output,
                     double* row_scores = nullptr) {
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
    if (row_scores)
        for (std::size_t i = 0; i < seen.size(); ++i) row_scores[seen[i]] += std::exp(logits[i] - max_logit) / sum;
    return max_logit + std::log(sum);
}

/// Attention of `tokens` query tokens of one sequence: at its last positions,
/// or at positions[t] when positions is not null. scores (nullable):
/// [kv_heads][score_stride] of this sequence, where the weights of the last
/// score_tokens tokens are added.
template <class Layout, class Query>
void attend_sequence(const Layout& view, int sequence, int tokens, const Query* queries, const int* positions,
                     const attention_options& options, double* outputs, double* lse, double* scores = nullptr,
                     int score_stride = 0, int score_tokens = 0) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim;
    const double scale = options.softmax_scale != 0.0f ? options.softmax_scale : 1.0 / std::sqrt(double(dim));
    const int length = view.length(sequence);  // tokens <= length: checked by check_offsets for every caller
    std::vector<double> query(dim);
    for (int kv = 0; kv < view.kv_heads(); ++kv) {
        const gathered_rows rows = gather(view, sequence, kv);
        for (int t = 0; t < tokens; ++t) {
            for (int g = 0; g < view.group_size(); ++g) {
                const int head = kv * view.group_size() + g;
                const std::size_t row = static_cast<std::size_t>(t) * view.query_heads() + head;
                for (int d = 0; d < dim; ++d) query[d] = to_float(queries[row * dim + d]);
                const int position = positions ? positions[t] : length - tokens + t;
                double* row_scores = scores && t >= tokens - score_tokens
                                         ? scores + static_cast<std::size_t>(kv) * score_stride
                                         : nullptr;
                lse[row] = attend(query.data(), rows, position, view.visibility(), scale,
                                  options.logits_soft_cap, outputs + row * dim, row_scores);
            }
        }
    }
}

template <class Output>
void narrow(const attention_result& result, Output* outputs, float* lse, float* scores) {
    for (std::size_t i = 0; i < result.outputs.size(); ++i) outputs[i] = from_float<Output>(float(result.outputs[i]));
    if (lse)
        for (std::size_t i = 0; i < result.lse.size(); ++i) lse[i] = static_cast<float>(result.lse[i]);
    if (scores)
        for (std::size_t i = 0; i < result.scores.size(); ++i) scores[i] = static_cast<float>(result.scores[i]);
}

}  // namespace detail

/// True when position is present in the sequence (the sliding window may have dropped it).
/// @tparam Layout a layout view
template <class Layout>
bool is_present(const Layout& view, int sequence, int position) {
    const int count = view.visible_count(sequence);
    for (int i = 0; i < count; ++i)
        if (view.visible_position(sequence, i) == position) return true;
    return false;
}

}  // namespace reference

/// The reference backend: every operation in double precision through the
/// layout interface alone, for host-accessible views. Same members and
/// params as cpu_backend, emulated_backend and cuda_backend; decode_exact and
/// prefill_exact also return the unrounded results the kernel tests compare with.
class reference_backend {
public:
    /// Writes new tokens' K/V rows (see append_params).
    /// @tparam Layout a layout view over host memory
    /// @tparam Input float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Input>
    void append(const append_params<Layout, Input>& p) const {
        using heads = typename Layout::heads;
        constexpr int dim = heads::head_dim;
        detail::check_call_append(p, true);
        const Layout& view = p.view;
        const kv_scales scales = scales_of(view);
        for (int b = 0; b < view.sequence_count(); ++b) {
            const int first = p.new_token_offsets[b], tokens = p.new_token_offsets[b + 1] - first;
            const int length = view.length(b);
            for (int t = 0; t < tokens; ++t) {
                const int position = p.positions.empty() ? length - tokens + t : p.positions[first + t];
                if (!reference::is_present(view, b, position)) continue;
                for (int kv = 0; kv < view.kv_heads(); ++kv) {
                    const std::size_t source = (static_cast<std::size_t>(first + t) * view.kv_heads() + kv) * dim;
                    const auto store = [&](const Input* in, auto* out, float layer_scale) {
                        store_row([&](int d) { return to_float(in[source + std::size_t(d)]); }, dim, layer_scale, out);
                    };
                    store(p.keys.data(), view.key(b, kv, position), scales.key);
                    store(p.values.data(), view.value(b, kv, position), scales.value);
                }
            }
        }
    }

    /// Decode attention in double; outputs need not be given (not checked, not written).
    /// @tparam Layout a layout view over host memory
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Query>
    reference::attention_result decode_exact(const decode_params<Layout, Query>& p) const {
        detail::check_call_decode(p, false);
        return decode_checked(p);
    }

    /// Prefill attention in double; outputs need not be given (not checked, not written).
    /// @tparam Layout a layout view over host memory
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Query>
    reference::attention_result prefill_exact(const prefill_params<Layout, Query>& p) const {
        detail::check_call_prefill(p, true, false);
        return prefill_checked(p);
    }

    /// Decode attention, results rounded to the queries' type.
    /// @tparam Layout a layout view over host memory
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Query>
    void decode(const decode_params<Layout, Query>& p) const {
        detail::check_call_decode(p);
        reference::detail::narrow(decode_checked(p), p.outputs.data(), p.lse.empty() ? nullptr : p.lse.data(),
                                  p.scores.empty() ? nullptr : p.scores.data());
    }

    /// Prefill attention, results rounded to the queries' type.
    /// @tparam Layout a layout view over host memory
    /// @tparam Query float, kvcache::half or kvcache::bfloat16
    template <class Layout, class Query>
    void prefill(const prefill_params<Layout, Query>& p) const {
        detail::check_call_prefill(p, true);
        reference::detail::narrow(prefill_checked(p), p.outputs.data(), p.lse.empty() ? nullptr : p.lse.data(),
                                  p.scores.empty() ? nullptr : p.scores.data());
    }

    /// Merges partial states in double (see merge_params).
    /// @tparam State float, kvcache::half or kvcache::bfloat16
    /// @tparam Output float, kvcache::half or kvcache::bfloat16
    template <class State, class Output>
    void merge(const merge_params<State, Output>& p) const {
        detail::check_call_merge(p);
        const int rows = p.rows, states = p.states, head_dim = p.head_dim;
        constexpr double empty = -std::numeric_limits<double>::infinity();
        for (int r = 0; r < rows; ++r) {
            double max_lse = empty;
            for (int s = 0; s < states; ++s) max_lse = std::fmax(max_lse, double(p.lse[static_cast<std::size_t>(s) * rows + r]));
            std::vector<double> sum(head_dim, 0.0);
            double total = 0.0;
            if (max_lse != empty) {
                for (int s = 0; s < states; ++s) {
                    const double l = p.lse[static_cast<std::size_t>(s) * rows + r];
                    if (l == empty) continue;
                    const double weight = std::exp(l - max_lse);
                    total += weight;
                    const State* o = p.outputs.data() + (static_cast<std::size_t>(s) * rows + r) * head_dim;
                    for (int d = 0; d < head_dim; ++d) sum[d] += weight * to_float(o[d]);
                }
            }
            for (int d = 0; d < head_dim; ++d)
                p.merged[static_cast<std::size_t>(r) * head_dim + d] = from_float<Output>(total > 0 ? float(sum[d] / total) : 0.0f);
            if (!p.merged_lse.empty())
                p.merged_lse[r] = total > 0 ? float(max_lse + std::log(total)) : -std::numeric_limits<float>::infinity();
        }
    }

    /// Waits for the calls made so far: nothing to wait for, each call's
    /// work is done when it returns (cuda_backend's is not).
    void synchronize() const noexcept {}

private:
    // The exact results of a call whose params were checked (the public
    // members check once, with or without the outputs).
    template <class Layout, class Query>
    static reference::attention_result decode_checked(const decode_params<Layout, Query>& p) {
        using heads = typename Layout::heads;
        const Layout view = detail::masked(p.view, p.options);
        const int batch = view.sequence_count();
        reference::attention_result result;
        result.outputs.assign(static_cast<std::size_t>(batch) * view.query_heads() * heads::head_dim, 0.0);
        result.lse.assign(static_cast<std::size_t>(batch) * view.query_heads(), 0.0);
        const std::size_t block = static_cast<std::size_t>(view.kv_heads()) * p.score_stride;
        if (!p.scores.empty()) result.scores.assign(batch * block, 0.0);
        for (int b = 0; b < batch; ++b) {
            const std::size_t row = static_cast<std::size_t>(b) * view.query_heads();
            if (view.length(b) == 0) {
                for (int h = 0; h < view.query_heads(); ++h)
                    result.lse[row + h] = -std::numeric_limits<double>::infinity();
                continue;
            }
            reference::detail::attend_sequence(view, b, 1, p.queries.data() + row * heads::head_dim, nullptr,
                                               p.options, result.outputs.data() + row * heads::head_dim,
                                               result.lse.data() + row,
                                               p.scores.empty() ? nullptr : result.scores.data() + b * block,
                                               p.score_stride, 1);
        }
        return result;
    }

    template <class Layout, class Query>
    static reference::attention_result prefill_checked(const prefill_params<Layout, Query>& p) {
        using heads = typename Layout::heads;
        const Layout view = detail::masked(p.view, p.options);
        const int batch = view.sequence_count();
        const int total = batch == 0 ? 0 : p.query_offsets[batch];
        reference::attention_result result;
        result.outputs.assign(static_cast<std::size_t>(total) * view.query_heads() * heads::head_dim, 0.0);
        result.lse.assign(static_cast<std::size_t>(total) * view.query_heads(), 0.0);
        const std::size_t block = static_cast<std::size_t>(view.kv_heads()) * p.score_stride;
        if (!p.scores.empty()) result.scores.assign(batch * block, 0.0);
        for (int b = 0; b < batch; ++b) {
            const int first = p.query_offsets[b], tokens = p.query_offsets[b + 1] - first;
            const std::size_t row = static_cast<std::size_t>(first) * view.query_heads();
            reference::detail::attend_sequence(view, b, tokens, p.queries.data() + row * heads::head_dim,
                                               p.query_positions.empty() ? nullptr : p.query_positions.data() + first,
                                               p.options, result.outputs.data() + row * heads::head_dim,
                                               result.lse.data() + row,
                                               p.scores.empty() ? nullptr : result.scores.data() + b * block,
                                               p.score_stride, p.score_queries > 0 ? p.score_queries : tokens);
        }
        return result;
    }
};

}  // namespace kvcache
