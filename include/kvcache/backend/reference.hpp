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

/// Attention of `tokens` query tokens of one sequence: at positions[t] when
/// positions is not null, else the last positions of the sequence.
template <class Layout, class Query>
void attend_sequence(const Layout& view, int sequence, int tokens, const Query* queries, const int* positions,
                     const attention_options& options, double* outputs, double* lse) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim;
    const double scale = options.softmax_scale != 0.0f ? options.softmax_scale : 1.0 / std::sqrt(double(dim));
    const int length = view.length(sequence);  // without positions, tokens <= length: check_offsets refuses more
    std::vector<double> query(dim);
    for (int kv = 0; kv < heads::kv_heads; ++kv) {
        const gathered_rows rows = gather(view, sequence, kv);
        for (int t = 0; t < tokens; ++t) {
            for (int g = 0; g < heads::group_size; ++g) {
                const int head = kv * heads::group_size + g;
                const std::size_t row = static_cast<std::size_t>(t) * heads::query_heads + head;
                for (int d = 0; d < dim; ++d) query[d] = to_float(queries[row * dim + d]);
                const int position = positions ? positions[t] : length - tokens + t;
                lse[row] = attend(query.data(), rows, position, view.visibility(), scale, options.logits_soft_cap,
                                  outputs + row * dim);
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
/// @tparam Queries a sized buffer of float or kvcache::half
template <class Layout, class Queries>
attention_result decode_attention_exact(const Layout& view, const Queries& query_rows,
                                        const attention_options& options = {}) {
    using heads = typename Layout::heads;
    const auto queries = make_span(query_rows);
    kvcache::detail::check_decode(view, queries.size(), queries.size(), false, 0, options);
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
        detail::attend_sequence(view, b, 1, queries.data() + row * heads::head_dim, nullptr, options,
                                result.outputs.data() + row * heads::head_dim, result.lse.data() + row);
    }
    return result;
}

/// Prefill attention in double: the last n_b positions of sequence b query the
/// cached prefix and, causally, their own chunk. queries: [total tokens][query_heads][head_dim],
/// query_offsets: batch + 1 entries from 0. With query_positions (one per
/// query token, each >= 0), token t of sequence b is at query_positions[query_offsets[b] + t]
/// instead and sees every present key at or before it that visibility() allows.
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Offsets a sized buffer of int
template <class Layout, class Queries, class Offsets>
attention_result prefill_attention_exact(const Layout& view, const Queries& query_rows, const Offsets& offsets,
                                         const attention_options& options = {},
                                         span<const int> query_positions = {}) {
    using heads = typename Layout::heads;
    const auto queries = make_span(query_rows);
    const span<const int> query_offsets = make_span(offsets);
    kvcache::detail::check_prefill(view, queries.size(), query_offsets, queries.size(), false, 0, options, true,
                                   query_positions);
    const int* positions = query_positions.empty() ? nullptr : query_positions.data();
    const int batch = view.sequence_count();
    const int total = batch == 0 ? 0 : query_offsets[batch];
    attention_result result;
    result.outputs.assign(static_cast<std::size_t>(total) * heads::query_heads * heads::head_dim, 0.0);
    result.lse.assign(static_cast<std::size_t>(total) * heads::query_heads, 0.0);
    for (int b = 0; b < batch; ++b) {
        const int tokens = query_offsets[b + 1] - query_offsets[b];
        const std::size_t row = static_cast<std::size_t>(query_offsets[b]) * heads::query_heads;
        detail::attend_sequence(view, b, tokens, queries.data() + row * heads::head_dim,
                                positions ? positions + query_offsets[b] : nullptr, options,
                                result.outputs.data() + row * heads::head_dim, result.lse.data() + row);
    }
    return result;
}

/// Decode attention, results narrowed to the queries' type. See decode_attention_exact.
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Outputs a sized buffer of the same element type
template <class Layout, class Queries, class Outputs>
void decode_attention(const Layout& view, const Queries& queries, Outputs&& outputs, const attention_options& options = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Queries>, kvcache::detail::range_element_t<Outputs>>();
    const auto o = make_span(outputs);
    kvcache::detail::check_decode(view, make_span(queries).size(), o.size(), false, 0, options);
    detail::narrow(decode_attention_exact(view, queries, options), o.data(), nullptr);
}

/// Decode attention that also writes the log-sum-exp of each (sequence, query head).
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Outputs a sized buffer of the same element type
/// @tparam Lse a sized buffer of float
template <class Layout, class Queries, class Outputs, class Lse>
void decode_attention_with_lse(const Layout& view, const Queries& queries, Outputs&& outputs, Lse&& lse,
                               const attention_options& options = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Queries>, kvcache::detail::range_element_t<Outputs>>();
    const auto o = make_span(outputs);
    const span<float> l = make_span(lse);
    kvcache::detail::check_decode(view, make_span(queries).size(), o.size(), true, l.size(), options);
    detail::narrow(decode_attention_exact(view, queries, options), o.data(), l.data());
}

/// Prefill attention, results narrowed to the queries' type. See prefill_attention_exact
/// (also for query_positions).
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Offsets a sized buffer of int
/// @tparam Outputs a sized buffer of the queries' element type
template <class Layout, class Queries, class Offsets, class Outputs>
void prefill_attention(const Layout& view, const Queries& queries, const Offsets& query_offsets, Outputs&& outputs,
                       const attention_options& options = {}, span<const int> query_positions = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Queries>, kvcache::detail::range_element_t<Outputs>>();
    const auto o = make_span(outputs);
    kvcache::detail::check_prefill(view, make_span(queries).size(), make_span(query_offsets), o.size(), false, 0,
                                   options, true, query_positions);
    detail::narrow(prefill_attention_exact(view, queries, query_offsets, options, query_positions), o.data(), nullptr);
}

/// Prefill attention that also writes the log-sum-exp of each (token, query head);
/// query_positions as in prefill_attention_exact.
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Offsets a sized buffer of int
/// @tparam Outputs a sized buffer of the queries' element type
/// @tparam Lse a sized buffer of float
template <class Layout, class Queries, class Offsets, class Outputs, class Lse>
void prefill_attention_with_lse(const Layout& view, const Queries& queries, const Offsets& query_offsets,
                                Outputs&& outputs, Lse&& lse, const attention_options& options = {},
                                span<const int> query_positions = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Queries>, kvcache::detail::range_element_t<Outputs>>();
    const auto o = make_span(outputs);
    const span<float> l = make_span(lse);
    kvcache::detail::check_prefill(view, make_span(queries).size(), make_span(query_offsets), o.size(), true, l.size(),
                                   options, true, query_positions);
    detail::narrow(prefill_attention_exact(view, queries, query_offsets, options, query_positions), o.data(), l.data());
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
/// keys/values: [total new tokens][kv_heads][head_dim]; new_token_offsets: batch + 1 entries from 0.
/// @tparam Layout a layout view over host-accessible memory
/// @tparam Keys a sized buffer of float or kvcache::half
/// @tparam Values a sized buffer of the same element type
/// @tparam Offsets a sized buffer of int
template <class Layout, class Keys, class Values, class Offsets>
void append(const Layout& view, const Keys& key_rows, const Values& value_rows, const Offsets& offsets) {
    using heads = typename Layout::heads;
    using element = typename Layout::element_type;
    constexpr int dim = heads::head_dim;
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Keys>, kvcache::detail::range_element_t<Values>>();
    const auto keys = make_span(key_rows);
    const auto values = make_span(value_rows);
    const span<const int> new_token_offsets = make_span(offsets);
    kvcache::detail::check_append(view, keys.size(), values.size(), new_token_offsets, true);
    for (int b = 0; b < view.sequence_count(); ++b) {
        const int tokens = new_token_offsets[b + 1] - new_token_offsets[b];
        const int length = view.length(b);
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
/// Writes merged[rows][head_dim] and merged_lse[rows] (nullptr or empty: not written).
/// @tparam States a sized buffer of float or kvcache::half
/// @tparam StateLse a sized buffer of float
/// @tparam Merged a sized buffer of float or kvcache::half
/// @tparam MergedLse a sized buffer of float, or std::nullptr_t
template <class States, class StateLse, class Merged, class MergedLse>
void merge_states(int states, int rows, int head_dim, const States& state_outputs, const StateLse& state_lse,
                  Merged&& merged_rows, MergedLse&& merged_row_lse) {
    using State = kvcache::detail::range_element_t<States>;
    using Output = kvcache::detail::range_element_t<Merged>;
    const auto outputs = make_span(state_outputs);
    const span<const float> lse = make_span(state_lse);
    const auto merged = make_span(merged_rows);
    const span<float> merged_lse_span = kvcache::detail::optional_lse(merged_row_lse);
    kvcache::detail::check_merge(states, rows, head_dim, outputs.size(), lse.size(), merged.size(),
                                 !merged_lse_span.empty(), merged_lse_span.size());
    float* const merged_lse = merged_lse_span.empty() ? nullptr : merged_lse_span.data();
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
                const State* o = outputs.data() + (static_cast<std::size_t>(s) * rows + r) * head_dim;
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
