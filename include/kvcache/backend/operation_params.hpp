// One params struct per operation, the only argument every backend's members
// take: the view, the buffers as sized spans, where the tokens sit, and the
// options. Required fields come through the constructor (which deduces the
// template arguments from what is passed); optional ones are members set
// afterwards, so a call reads as what it asks for:
//
//   kvcache::prefill_params call(view, queries, query_offsets, outputs);
//   call.lse = lse;                       // also write log-sum-exps
//   call.options.logits_soft_cap = 30.0f;
//   backend.prefill(call);
//
// Buffers live where the backend reads them: host memory for reference, cpu
// and emulated, device memory for cuda. Every backend checks the same fields
// with the same messages (backend/detail/call_checks.hpp).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kvcache/backend/detail/call_checks.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/kernels/attention_options.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

/// Writes new tokens' key/value rows into the view's sequences.
/// Token t of sequence b (rows new_token_offsets[b] + t) goes to position
/// positions[new_token_offsets[b] + t] when positions is given, else to the
/// sequence's last n_b positions (the space a plan or begin_append reserved).
/// Rows are converted to the stored element type; positions the layout no
/// longer holds (a chunk longer than a sliding window) are skipped.
/// @tparam Layout a layout view
/// @tparam Input float, kvcache::half or kvcache::bfloat16: the rows' element type
template <class Layout, class Input>
struct append_params {
    static_assert(is_layout_view_v<Layout>, "kvcache::append_params needs a layout view");
    static_assert(is_activation_element_v<Input>, "kvcache::append_params: K/V rows are float, kvcache::half or kvcache::bfloat16");
    static_assert(!std::is_const_v<typename Layout::element_type>,
                  "kvcache::append_params: append writes the cache, and this view's elements are const (read-only)");
    Layout view;
    span<const Input> keys;             ///< [new tokens][kv_heads][head_dim]
    span<const Input> values;           ///< [new tokens][kv_heads][head_dim]
    span<const int> new_token_offsets;  ///< batch + 1 entries from 0 (CSR)
    span<const int> positions;          ///< optional: [new tokens], each token's position in its sequence

    append_params(const Layout& v, span<const Input> k, span<const Input> vals, span<const int> offsets)
        : view(v), keys(k), values(vals), new_token_offsets(offsets) {}
};

/// Decode attention: one query per sequence at position length - 1, over
/// every key the view presents and its visibility allows.
/// @tparam Layout a layout view
/// @tparam Query float, kvcache::half or kvcache::bfloat16: queries' and outputs' element type
template <class Layout, class Query>
struct decode_params {
    static_assert(is_layout_view_v<Layout>, "kvcache::decode_params needs a layout view");
    static_assert(is_activation_element_v<Query>, "kvcache::decode_params: queries are float, kvcache::half or kvcache::bfloat16");
    Layout view;
    span<const Query> queries;    ///< [batch][query_heads][head_dim]
    span<Query> outputs;          ///< [batch][query_heads][head_dim]
    span<float> lse;              ///< optional: [batch][query_heads] log-sum-exps (-inf: saw nothing)
    attention_options options;    ///< scale, soft cap, key splits
    /// optional: [batch][kv_heads][score_stride], entry i of (b, kv) the
    /// softmax weight the step gave visible row i of sequence b, summed over
    /// the KV head's query heads; entries no query saw and past the visible
    /// count are 0. Every backend fills it (the emulated and CUDA ones from
    /// the kernels' own softmax weights), in the memory the backend's views use.
    span<float> scores;
    int score_stride = 0;         ///< with scores: entries per (sequence, KV head), >= every visible count

    decode_params(const Layout& v, span<const Query> q, span<Query> o) : view(v), queries(q), outputs(o) {}
    /// From a read-only view of the same memory (elements const).
    /// @tparam ReadOnly the const-element form of Layout
    template <class ReadOnly, class = std::enable_if_t<!std::is_same_v<ReadOnly, Layout> &&
                                                       std::is_same_v<detail::attention_view_t<ReadOnly>, Layout>>>
    decode_params(const ReadOnly& v, span<const Query> q, span<Query> o)
        : decode_params(detail::attention_view_of(v), q, o) {}
};

/// Prefill attention: the query tokens of each sequence attend to the keys
/// the view presents at positions up to their own (causal) and allowed by its
/// visibility. Token t of sequence b (rows query_offsets[b] + t) sits at
/// query_positions[query_offsets[b] + t] when given, else at the sequence's
/// last n_b positions (a chunk just appended). Explicit positions may exceed
/// the sequence's length: cascade attention places other requests' queries
/// past a shared prefix that way, so each sees all of it.
/// @tparam Layout a layout view
/// @tparam Query float, kvcache::half or kvcache::bfloat16: queries' and outputs' element type
template <class Layout, class Query>
struct prefill_params {
    static_assert(is_layout_view_v<Layout>, "kvcache::prefill_params needs a layout view");
    static_assert(is_activation_element_v<Query>, "kvcache::prefill_params: queries are float, kvcache::half or kvcache::bfloat16");
    Layout view;
    span<const Query> queries;      ///< [query tokens][query_heads][head_dim]
    span<const int> query_offsets;  ///< batch + 1 entries from 0 (CSR)
    span<Query> outputs;            ///< [query tokens][query_heads][head_dim]
    span<float> lse;                ///< optional: [query tokens][query_heads]
    span<const int> query_positions;  ///< optional: [query tokens], each token's position
    attention_options options;      ///< scale and soft cap (kv_splits is ignored)
    /// optional: [batch][kv_heads][score_stride] as in decode_params, summed
    /// over the query heads of the group and the contributing query tokens.
    span<float> scores;
    int score_stride = 0;           ///< with scores: entries per (sequence, KV head), >= every visible count
    int score_queries = 0;          ///< with scores: only each sequence's last score_queries tokens contribute; 0: all

    prefill_params(const Layout& v, span<const Query> q, span<const int> offsets, span<Query> o)
        : view(v), queries(q), query_offsets(offsets), outputs(o) {}
    /// From a read-only view of the same memory (elements const).
    /// @tparam ReadOnly the const-element form of Layout
    template <class ReadOnly, class = std::enable_if_t<!std::is_same_v<ReadOnly, Layout> &&
                                                       std::is_same_v<detail::attention_view_t<ReadOnly>, Layout>>>
    prefill_params(const ReadOnly& v, span<const Query> q, span<const int> offsets, span<Query> o)
        : prefill_params(detail::attention_view_of(v), q, offsets, o) {}
};

/// Merges partial attention states of the same query rows (split keys,
/// cascade levels): state s of row r is outputs[(s * rows + r) * head_dim ...]
/// with log-sum-exp lse[s * rows + r]; a state with lse = -inf is empty.
/// @tparam State float, kvcache::half or kvcache::bfloat16: the states' element type
/// @tparam Output float, kvcache::half or kvcache::bfloat16: the merged rows' element type
template <class State, class Output>
struct merge_params {
    static_assert(is_activation_element_v<State> && is_activation_element_v<Output>, "kvcache::merge_params: float, kvcache::half or kvcache::bfloat16 rows");
    int states;               ///< partial states per row
    int rows;                 ///< query rows (tokens x query heads)
    int head_dim;             ///< elements per row, a multiple of 8
    span<const State> outputs;  ///< [states][rows][head_dim]
    span<const float> lse;    ///< [states][rows]
    span<Output> merged;      ///< [rows][head_dim]
    span<float> merged_lse;   ///< optional: [rows]

    merge_params(int state_count, int row_count, int dim, span<const State> o, span<const float> l, span<Output> m)
        : states(state_count), rows(row_count), head_dim(dim), outputs(o), lse(l), merged(m) {}
};

// Deduction from what callers pass: views, and spans or contiguous containers.
template <class Layout, class Keys, class Values, class Offsets>
append_params(const Layout&, Keys&&, Values&&, Offsets&&) -> append_params<Layout, detail::range_element_t<Keys>>;
template <class Layout, class Queries, class Outputs>
decode_params(const Layout&, Queries&&, Outputs&&)
    -> decode_params<detail::attention_view_t<Layout>, detail::range_element_t<Queries>>;
template <class Layout, class Queries, class Offsets, class Outputs>
prefill_params(const Layout&, Queries&&, Offsets&&, Outputs&&)
    -> prefill_params<detail::attention_view_t<Layout>, detail::range_element_t<Queries>>;
template <class States, class Lse, class Merged>
merge_params(int, int, int, States&&, Lse&&, Merged&&)
    -> merge_params<detail::range_element_t<States>, detail::range_element_t<Merged>>;

}  // namespace kvcache
