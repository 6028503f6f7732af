// The argument checks of every backend's calls, written once so that the
// reference, CPU, emulated and CUDA backends refuse the same input with the
// same message: sizes of every buffer against what the batch needs, the CSR
// token offsets, the options. Messages name the field, the value, the limit,
// and the sequence id where the view knows it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/kernels/attention_options.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {
namespace detail {

/// Compile-time checks of a call's buffer element types: queries (or K/V
/// rows) float, half or bfloat16, and outputs of the same type.
/// @tparam Input the element type of the input buffers
/// @tparam Output the element type of the output buffers
template <class Input, class Output>
constexpr void check_element_types() {
    static_assert(is_activation_element_v<Input>, "kvcache: queries and K/V rows are float, kvcache::half or kvcache::bfloat16");
    static_assert(std::is_same_v<Input, Output>, "kvcache: outputs have the queries' element type");
}

/// The merged_lse argument of merge_states: a sized float buffer, or nullptr for none.
inline span<float> optional_lse(std::nullptr_t) noexcept { return {}; }
/// @tparam Lse a sized buffer of float
template <class Lse>
span<float> optional_lse(Lse&& lse) noexcept {
    return make_span(lse);
}

/// Most key/value splits a decode may be asked for (bounds workspace and merge).
inline constexpr int max_kv_splits = 32;

/// The options check of every attention call.
inline void check_options(const attention_options& options) {
    require(options.kv_splits >= 0 && options.kv_splits <= max_kv_splits, error_code::invalid_argument,
            "attention_options.kv_splits = ", options.kv_splits, " is outside [0, ", max_kv_splits,
            "] (0 lets the backend choose)");
    require(std::isfinite(options.softmax_scale), error_code::invalid_argument, "attention_options.softmax_scale = ",
            options.softmax_scale, " is not finite (0 means 1/sqrt(head_dim))");
    require(std::isfinite(options.logits_soft_cap) && options.logits_soft_cap >= 0.0f, error_code::invalid_argument,
            "attention_options.logits_soft_cap = ", options.logits_soft_cap, " must be finite and >= 0 (0 is off)");
    require(options.window >= 0, error_code::invalid_argument, "attention_options.window = ", options.window,
            " is negative (0 is no window)");
    require(options.sinks >= 0, error_code::invalid_argument, "attention_options.sinks = ", options.sinks,
            " is negative");
    require(options.window > 0 || options.sinks == 0, error_code::invalid_argument, "attention_options.sinks = ",
            options.sinks, " needs a window (attention_options.window is 0)");
}

template <class Layout, class = void>
struct has_mask : std::false_type {};
template <class Layout>
struct has_mask<Layout, std::void_t<decltype(std::declval<Layout&>().mask)>> : std::true_type {};

/// The view a call attends over: the options' window and sinks set as its
/// mask (contiguous and paged views), or checked against the window the
/// layout applies itself (a sliding-window cache), which must be the same.
/// @tparam Layout a layout view
template <class Layout>
Layout masked(const Layout& view, const attention_options& options) {
    if (options.window == 0) return view;
    if constexpr (has_mask<Layout>::value) {
        Layout masked_view = view;
        masked_view.mask = attention_visibility{options.window, options.sinks};
        return masked_view;
    } else {
        const attention_visibility own = view.visibility();
        require(own.window == options.window && own.sinks == options.sinks, error_code::invalid_argument,
                "attention_options.window = ", options.window, " and sinks = ", options.sinks, " differ from the ",
                to_string(Layout::kind), " layout's own window ", own.window, " and sinks ", own.sinks);
        return view;
    }
}

template <class Layout, class = void>
struct has_sequence_ids : std::false_type {};
template <class Layout>
struct has_sequence_ids<Layout, std::void_t<decltype(std::declval<const Layout&>().sequence_ids)>> : std::true_type {};

/// Batch entry b of a view for messages: "sequence 7 (batch entry 1)" when
/// the view was made by an owner, which records the ids; else "batch entry 1".
/// @tparam Layout a layout view
template <class Layout>
std::string sequence_name(const Layout& view, int b) {
    if constexpr (has_sequence_ids<Layout>::value)
        if (view.sequence_ids) return concat("sequence ", view.sequence_ids[b], " (batch entry ", b, ")");
    return concat("batch entry ", b);
}

/// Checks CSR token offsets of a batch and returns the total tokens (-1 when
/// they are device memory). For a batch of b sequences, b + 1 entries,
/// non-decreasing from offsets[0] = 0; an empty batch may pass no entries.
/// When they are host memory and the tokens sit at each sequence's last
/// positions (tokens_within_length), each count is checked against its length.
/// @tparam Layout a layout view
template <class Layout>
int check_offsets(const Layout& view, span<const int> offsets, const char* field, const char* verb,
                  bool host_lengths, bool tokens_within_length = true) {
    const int batch = view.sequence_count();
    require(batch >= 0, error_code::invalid_argument, "view.sequences = ", batch, " is negative");
    if (batch == 0 && offsets.empty()) return 0;
    require(offsets.size() == std::size_t(batch) + 1, error_code::invalid_argument, field, " has ", offsets.size(),
            " entries but a batch of ", batch, " sequences needs ", batch + 1);
    if (!host_lengths) return -1;  // device memory: the entries cannot be read here
    require(offsets[0] == 0, error_code::invalid_argument, field, "[0] = ", offsets[0], " must be 0");
    for (int b = 0; b < batch; ++b) {
        const int tokens = offsets[b + 1] - offsets[b];
        require(offsets[b + 1] >= offsets[b], error_code::invalid_argument, field, " decreases at ",
                sequence_name(view, b), ": ", field, "[", b + 1, "] = ", offsets[b + 1], " < ", offsets[b]);
        require(!tokens_within_length || tokens <= view.length(b), error_code::invalid_argument, sequence_name(view, b), " ", verb, " ", tokens,
                " tokens but its length is ", view.length(b), " (begin_append reserves the positions first)");
    }
    return offsets[batch];
}

/// A view over a dynamic head configuration must carry its counts.
/// @tparam Layout a layout view
template <class Layout>
void check_heads(const Layout& view) {
    if constexpr (!Layout::heads::static_counts) {
        require(view.query_heads() > 0 && view.kv_heads() > 0, error_code::invalid_argument, "the view's head counts ",
                view.query_heads(), "q/", view.kv_heads(),
                "kv are not set: a view over a dynamic head_config takes its counts (packed(), strided())");
        kvcache::head_shape{view.query_heads(), view.kv_heads(), Layout::heads::head_dim}.validate();
    }
}

/// append: keys and values hold total tokens x kv_heads x head_dim. Returns
/// the total tokens (-1 when the offsets are device memory).
/// @tparam Layout a layout view
template <class Layout>
int check_append(const Layout& view, std::size_t keys, std::size_t values, span<const int> offsets, bool host_lengths,
                  bool tokens_within_length = true) {
    using heads = typename Layout::heads;
    check_heads(view);
    const int total = check_offsets(view, offsets, "new_token_offsets", "appends", host_lengths, tokens_within_length);
    const std::int64_t row = std::int64_t(view.kv_heads()) * heads::head_dim;
    if (total < 0) {  // offsets on the device: at least the two buffers must agree and be whole rows
        require(keys == values && keys % row == 0, error_code::invalid_argument, "keys (", keys, " elements) and values (",
                values, ") must hold the same whole rows of ", row, " elements");
        return total;
    }
    require_elements(keys, total, row, "keys", "new tokens x (kv_heads x head_dim)");
    require_elements(values, total, row, "values", "new tokens x (kv_heads x head_dim)");
    return total;
}

/// decode: queries and outputs hold batch x query_heads x head_dim; lse, when asked for, batch x query_heads.
/// @tparam Layout a layout view
template <class Layout>
void check_decode(const Layout& view, std::size_t queries, std::size_t outputs, bool with_lse, std::size_t lse_size,
                  const attention_options& options) {
    using heads = typename Layout::heads;
    check_heads(view);
    check_options(options);
    const int batch = view.sequence_count();
    require(batch >= 0, error_code::invalid_argument, "view.sequences = ", batch, " is negative");
    const std::int64_t row = std::int64_t(view.query_heads()) * heads::head_dim;
    require_elements(queries, batch, row, "queries", "sequences x (query_heads x head_dim)");
    require_elements(outputs, batch, row, "outputs", "sequences x (query_heads x head_dim)");
    if (with_lse) require_elements(lse_size, batch, view.query_heads(), "lse", "sequences x query_heads");
}

/// prefill: queries and outputs hold total tokens x query_heads x head_dim; lse total tokens x query_heads.
/// Returns the total tokens (-1 when the offsets are device memory).
/// @tparam Layout a layout view
template <class Layout>
int check_prefill(const Layout& view, std::size_t queries, span<const int> offsets, std::size_t outputs,
                   bool with_lse, std::size_t lse_size, const attention_options& options, bool host_lengths,
                   bool tokens_within_length = true) {
    using heads = typename Layout::heads;
    check_heads(view);
    check_options(options);
    const int total = check_offsets(view, offsets, "query_offsets", "has", host_lengths, tokens_within_length);
    const std::int64_t row = std::int64_t(view.query_heads()) * heads::head_dim;
    if (total < 0) {
        require(outputs >= queries && queries % row == 0, error_code::invalid_argument, "queries (", queries,
                " elements) must be whole rows of ", row, " and outputs (", outputs, ") at least as large");
        if (with_lse) require_elements(lse_size, std::int64_t(queries / row), view.query_heads(), "lse", "query tokens x query_heads");
        return total;
    }
    require_elements(queries, total, row, "queries", "query tokens x (query_heads x head_dim)");
    require_elements(outputs, total, row, "outputs", "query tokens x (query_heads x head_dim)");
    if (with_lse) require_elements(lse_size, total, view.query_heads(), "lse", "query tokens x query_heads");
    return total;
}

/// merge_states: outputs [states][rows][head_dim], lse [states][rows], merged [rows][head_dim], merged_lse [rows].
inline void check_merge(int states, int rows, int head_dim, std::size_t outputs, std::size_t lse, std::size_t merged,
                        bool with_merged_lse, std::size_t merged_lse_size) {
    require(states >= 0, error_code::invalid_argument, "merge states = ", states, " is negative");
    require(rows >= 0, error_code::invalid_argument, "merge rows = ", rows, " is negative");
    require(head_dim > 0 && head_dim % 8 == 0, error_code::invalid_argument, "merge head_dim = ", head_dim,
            " must be a positive multiple of 8");
    require_elements(outputs, std::int64_t(states) * rows, head_dim, "outputs", "states x rows x head_dim");
    require_elements(lse, std::int64_t(states) * rows, 1, "lse", "states x rows");
    require_elements(merged, rows, head_dim, "merged", "rows x head_dim");
    if (with_merged_lse) require_elements(merged_lse_size, rows, 1, "merged_lse", "rows");
}

/// Explicit positions of a call (append's positions, prefill's
/// query_positions): none, or one per token of the total check_offsets
/// returned; each is also checked to be >= 0 and, for append, inside its
/// sequence. Offsets in device memory (total < 0) cannot be read: nothing is checked.
/// @tparam Layout a layout view
template <class Layout>
void check_positions(const Layout& view, span<const int> positions, span<const int> offsets, int total,
                     const char* field, bool within_length) {
    if (positions.empty() || total < 0) return;
    require(positions.size() == std::size_t(total), error_code::invalid_argument, field, " has ", positions.size(),
            " entries but the batch has ", total, " tokens (one each, or none)");
    for (int b = 0; b < view.sequence_count(); ++b)
        for (int i = offsets[b]; i < offsets[b + 1]; ++i) {
            const int position = positions[i];
            require(position >= 0, error_code::invalid_argument, field, "[", i, "] = ", position, " of ",
                    sequence_name(view, b), " is negative");
            if (within_length)
                require(position < view.length(b), error_code::out_of_range, field, "[", i, "] = ", position, " of ",
                        sequence_name(view, b), " is outside its length ", view.length(b),
                        " (reserve the positions first)");
        }
}

/// Every check of an append_params call; host_memory: the view's lengths,
/// the offsets and the positions can be read here.
/// @tparam Params an append_params
template <class Params>
void check_call_append(const Params& p, bool host_memory) {
    const int total =
        check_append(p.view, p.keys.size(), p.values.size(), p.new_token_offsets, host_memory, p.positions.empty());
    check_positions(p.view, p.positions, p.new_token_offsets, total, "positions", true);
}

/// The optional scores of a decode or prefill: batch x kv_heads x stride
/// entries, the stride at least every sequence's visible count (checked when
/// the view's lengths are host memory), score_queries >= 0.
/// @tparam Layout a layout view
template <class Layout>
void check_scores(const Layout& view, std::size_t size, int stride, int score_queries, bool host_lengths) {
    require(stride > 0, error_code::invalid_argument, "score_stride = ", stride,
            " must be positive when scores are given (entries per sequence and KV head)");
    require(score_queries >= 0, error_code::invalid_argument, "score_queries = ", score_queries,
            " is negative (0: every query token contributes)");
    const int batch = view.sequence_count();
    require(size == std::size_t(batch) * std::size_t(view.kv_heads()) * std::size_t(stride),
            error_code::invalid_argument, "scores holds ", size, " entries but ", batch, " sequences x ",
            view.kv_heads(), " kv_heads x score_stride ", stride, " = ",
            std::int64_t(batch) * view.kv_heads() * stride, " are needed");
    if (!host_lengths) return;
    for (int b = 0; b < batch; ++b) {
        const int visible = view.length(b) > 0 ? view.visible_count(b) : 0;
        require(visible <= stride, error_code::invalid_argument, sequence_name(view, b), " has ", visible,
                " visible rows but score_stride is ", stride);
    }
}

/// Every check of a decode_params call; check_outputs false: the outputs are
/// not written (the reference's exact results), so not checked either.
/// @tparam Params a decode_params
template <class Params>
void check_call_decode(const Params& p, bool check_outputs = true) {
    const std::size_t outputs = check_outputs ? p.outputs.size() : p.queries.size();
    check_decode(p.view, p.queries.size(), outputs, check_outputs && !p.lse.empty(), p.lse.size(), p.options);
    if (!p.scores.empty()) check_scores(p.view, p.scores.size(), p.score_stride, 0, true);
}

/// Every check of a prefill_params call (see check_call_append for host_memory).
/// @tparam Params a prefill_params
template <class Params>
void check_call_prefill(const Params& p, bool host_memory, bool check_outputs = true) {
    const std::size_t outputs = check_outputs ? p.outputs.size() : p.queries.size();
    const int total = check_prefill(p.view, p.queries.size(), p.query_offsets, outputs, check_outputs && !p.lse.empty(),
                                    p.lse.size(), p.options, host_memory, p.query_positions.empty());
    check_positions(p.view, p.query_positions, p.query_offsets, total, "query_positions", false);
    if (!p.scores.empty()) check_scores(p.view, p.scores.size(), p.score_stride, p.score_queries, host_memory);
}

/// Every check of a merge_params call.
/// @tparam Params a merge_params
template <class Params>
void check_call_merge(const Params& p) {
    check_merge(p.states, p.rows, p.head_dim, p.outputs.size(), p.lse.size(), p.merged.size(), !p.merged_lse.empty(),
                p.merged_lse.size());
}

}  // namespace detail
}  // namespace kvcache
