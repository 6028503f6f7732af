// Parameters of the attention kernels: trivially copyable structs passed by
// value to every thread. Layout views are embedded by value.
#pragma once

#include <cstdint>

namespace kvcache {

/// append_kernel: write new tokens' rows. keys/values [total][kv_heads][head_dim].
/// @tparam Layout a layout view  @tparam Input float, kvcache::half or kvcache::bfloat16
template <class Layout, class Input>
struct append_kernel_params {
    Layout view;
    const Input* keys;
    const Input* values;
    const int* new_token_offsets;  ///< [batch + 1]
    const int* positions;          ///< [total] position of each new token in its sequence; null: the last n_b
};

/// decode_kernel: one query per sequence. With splits > 1 each block writes a
/// partial (output, lse) to partial_outputs [row][split][head_dim] and
/// partial_lse [row][split] (row = sequence * query_heads + head) instead of outputs.
/// @tparam Layout a layout view  @tparam Query float, kvcache::half or kvcache::bfloat16
template <class Layout, class Query>
struct decode_kernel_params {
    Layout view;
    const Query* queries;    ///< [batch][query_heads][head_dim]
    Query* outputs;          ///< [batch][query_heads][head_dim]
    float* lse;              ///< [batch][query_heads] or null
    float* partial_outputs;  ///< splits > 1 only
    float* partial_lse;      ///< splits > 1 only
    float scale;             ///< softmax scale, already resolved
    float soft_cap;          ///< 0: off
    int splits;              ///< blocks along the keys of each (sequence, KV head)
};

/// prefill_kernel: the last n_b positions of sequence b query the cache.
/// @tparam Layout a layout view  @tparam Query float, kvcache::half or kvcache::bfloat16
template <class Layout, class Query>
struct prefill_kernel_params {
    Layout view;
    const Query* queries;      ///< [total tokens][query_heads][head_dim]
    const int* query_offsets;  ///< [batch + 1]
    const int* query_positions;  ///< [total tokens] position of each query token; null: the last n_b of its sequence
    Query* outputs;            ///< [total tokens][query_heads][head_dim]
    float* lse;                ///< [total tokens][query_heads] or null
    float scale;
    float soft_cap;
};

/// merge_states_kernel: state s of row r is at outputs + s * output_state_stride
/// + r * output_row_stride (head_dim elements) with lse at lse[s * lse_state_stride
/// + r * lse_row_stride].
/// @tparam State float, kvcache::half or kvcache::bfloat16  @tparam Output float, kvcache::half or kvcache::bfloat16
template <class State, class Output>
struct merge_kernel_params {
    const State* outputs;
    const float* lse;
    Output* merged;       ///< [rows][head_dim]
    float* merged_lse;    ///< [rows] or null
    int rows;
    int states;
    int head_dim;
    std::int64_t output_state_stride;
    std::int64_t output_row_stride;
    std::int64_t lse_state_stride;
    std::int64_t lse_row_stride;
};

/// Attention scores a decode or prefill is asked for (decode_params::scores):
/// [batch][kv_heads][stride] floats, from each sequence's last `queries`
/// tokens (0: all; decode has one). scores null: none.
struct score_request {
    float* scores = nullptr;
    int stride = 0;
    int queries = 0;
};

/// The scores body's arguments: the attention call's queries, positions and
/// final log-sum-exps, and where the scores go.
/// @tparam Layout a layout view
/// @tparam Query float, kvcache::half or kvcache::bfloat16
template <class Layout, class Query>
struct scores_kernel_params {
    Layout view;
    const Query* queries;        ///< [query tokens][query_heads][head_dim]
    const int* query_offsets;    ///< [batch + 1]; null: one query per sequence (decode)
    const int* query_positions;  ///< [query tokens] or null: the last n_b positions of its sequence
    const float* lse;            ///< [query tokens][query_heads], the call's final log-sum-exps
    float scale;
    float soft_cap;
    score_request request;
};

}  // namespace kvcache
