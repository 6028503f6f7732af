// Head sharding for tensor parallelism: rank r of a group of T ranks holds a
// share of the model's KV heads and the query heads of their groups, so its
// caches, views and kernels are the ordinary templates built for the shard's
// head_config. Attention never mixes heads, so each rank attends on its own
// and the model's output is the ranks' outputs placed side by side (an
// all-gather along the heads): no rank needs another's K/V.
//
// The split follows what serving engines do. With T <= kv_heads the KV heads
// are split evenly (T must divide them); with T > kv_heads each KV head is
// replicated on T / kv_heads ranks (T must be a multiple of kv_heads), so a
// rank holds one KV head and a slice of its group. The query heads are split
// evenly in every case (T must divide them), rank r holding the contiguous
// run [r * query_heads / T, (r + 1) * query_heads / T).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "kvcache/core/error.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/span.hpp"

namespace kvcache {

/// The heads rank `rank` of a tensor-parallel group of `ranks` holds.
struct head_shard {
    int rank = 0;              ///< this rank, 0 <= rank < ranks
    int ranks = 1;             ///< ranks in the tensor-parallel group
    head_shape model{};        ///< the unsharded model's heads
    head_shape shard{};        ///< what this rank's caches and kernels are built for
    int first_query_head = 0;  ///< the model's query head that is the shard's query head 0
    int first_kv_head = 0;     ///< the model's KV head that is the shard's KV head 0
    int kv_replicas = 1;       ///< ranks that hold each KV head (> 1 when ranks exceed kv_heads)

    /// "rank 1 of 4: 8q/2kv/d128 of 32q/8kv/d128"
    std::string to_string() const {
        return detail::concat("rank ", rank, " of ", ranks, ": ", shard.to_string(), " of ", model.to_string());
    }
};

/// The shard of `model` that rank `rank` of `ranks` holds. invalid_argument,
/// naming the count and the rule, when the model is not a valid shape, rank
/// is outside [0, ranks), ranks does not divide query_heads, or ranks neither
/// divides kv_heads nor is a multiple of it.
inline head_shard shard_heads(const head_shape& model, int rank, int ranks) {
    model.validate();
    require(ranks >= 1, error_code::invalid_argument, "tensor-parallel ranks = ", ranks, " must be at least 1");
    require(rank >= 0 && rank < ranks, error_code::invalid_argument, "rank = ", rank, " is outside [0, ", ranks,
            ") for ", ranks, " tensor-parallel ranks");
    require(model.query_heads % ranks == 0, error_code::invalid_argument, "query_heads = ", model.query_heads,
            " of ", model.to_string(), " is not divisible by ", ranks, " tensor-parallel ranks");
    head_shard s;
    s.rank = rank;
    s.ranks = ranks;
    s.model = model;
    s.shard.query_heads = model.query_heads / ranks;
    s.shard.head_dim = model.head_dim;
    s.first_query_head = rank * s.shard.query_heads;
    if (model.kv_heads >= ranks) {
        require(model.kv_heads % ranks == 0, error_code::invalid_argument, "kv_heads = ", model.kv_heads, " of ",
                model.to_string(), " is not divisible by ", ranks, " tensor-parallel ranks");
        s.shard.kv_heads = model.kv_heads / ranks;
        s.first_kv_head = rank * s.shard.kv_heads;
    } else {
        require(ranks % model.kv_heads == 0, error_code::invalid_argument, "tensor-parallel ranks = ", ranks,
                " exceed kv_heads = ", model.kv_heads, " of ", model.to_string(),
                " but are not a multiple of it (each KV head must be replicated on the same number of ranks)");
        s.kv_replicas = ranks / model.kv_heads;
        s.shard.kv_heads = 1;
        s.first_kv_head = rank / s.kv_replicas;
    }
    return s;
}

/// The shard of a static head configuration.
/// @tparam Heads a head_config with static counts
template <class Heads>
head_shard shard_heads(int rank, int ranks) {
    return shard_heads(shape_of<Heads>(), rank, ranks);
}

namespace detail {

/// Copies heads [first, first + count) of each token's row of `from_heads`
/// heads into rows of `to_heads` heads starting at head `to_first`; `tokens`
/// is derived from the source and checked against the destination.
template <class Source, class Target>
void copy_head_slices(span<const Source> from, int from_heads, int from_first, span<Target> to, int to_heads,
                      int to_first, int count, int head_dim, const char* from_name, const char* to_name) {
    const std::int64_t from_row = std::int64_t(from_heads) * head_dim;
    const std::int64_t to_row = std::int64_t(to_heads) * head_dim;
    require(from.size() % std::size_t(from_row) == 0, error_code::invalid_argument, from_name, " holds ",
            from.size(), " elements, not a whole number of tokens of ", from_heads, " heads x head_dim ", head_dim);
    const std::int64_t tokens = std::int64_t(from.size()) / from_row;
    require_elements(to.size(), tokens, to_row, to_name, "tokens x (heads x head_dim)");
    for (std::int64_t t = 0; t < tokens; ++t) {
        const Source* source = from.data() + t * from_row + std::int64_t(from_first) * head_dim;
        Target* target = to.data() + t * to_row + std::int64_t(to_first) * head_dim;
        for (std::int64_t i = 0; i < std::int64_t(count) * head_dim; ++i) target[i] = Target(source[i]);
    }
}

}  // namespace detail

namespace detail {

template <class From, class To>
void copy_shard_heads(const From& from, int from_heads, int from_first, To&& to, int to_heads, int to_first,
                      int count, int head_dim, const char* from_name, const char* to_name) {
    static_assert(is_sized_range_v<const From&> && is_sized_range_v<To>,
                  "kvcache: shard rows are buffers with a size (span, std::vector, host_buffer)");
    static_assert(std::is_same_v<range_element_t<const From>, range_element_t<To>>,
                  "kvcache: the shard's rows and the model's rows have one element type");
    using element = range_element_t<To>;
    copy_head_slices<element, element>(make_span(from), from_heads, from_first, make_span(to), to_heads, to_first,
                                       count, head_dim, from_name, to_name);
}

}  // namespace detail

/// Copies the shard's KV rows [tokens][shard kv_heads][head_dim] out of the
/// model's [tokens][kv_heads][head_dim] (what a rank appends when its
/// projection produced every head, as in a test). invalid_argument when
/// model_rows is not whole tokens or out is short.
/// @tparam ModelRows a buffer (span, std::vector, host_buffer) of the rows' element type
/// @tparam Out a writable buffer of the same element type
template <class ModelRows, class Out>
void shard_kv_rows(const head_shard& s, const ModelRows& model_rows, Out&& out) {
    detail::copy_shard_heads(model_rows, s.model.kv_heads, s.first_kv_head, out, s.shard.kv_heads, 0,
                             s.shard.kv_heads, s.model.head_dim, "model_rows", "out");
}

/// Copies the shard's query rows [tokens][shard query_heads][head_dim] out of
/// the model's [tokens][query_heads][head_dim].
/// @tparam ModelRows a buffer of the rows' element type
/// @tparam Out a writable buffer of the same element type
template <class ModelRows, class Out>
void shard_query_rows(const head_shard& s, const ModelRows& model_rows, Out&& out) {
    detail::copy_shard_heads(model_rows, s.model.query_heads, s.first_query_head, out, s.shard.query_heads, 0,
                             s.shard.query_heads, s.model.head_dim, "model_rows", "out");
}

/// Places the shard's attention outputs [tokens][shard query_heads][head_dim]
/// at its heads of the model's [tokens][query_heads][head_dim]: once every
/// rank has placed its own, model_outputs is the unsharded attention output
/// (what an all-gather along the heads assembles).
/// @tparam ShardOutputs a buffer of the outputs' element type
/// @tparam ModelOutputs a writable buffer of the same element type
template <class ShardOutputs, class ModelOutputs>
void place_shard_outputs(const head_shard& s, const ShardOutputs& shard_outputs, ModelOutputs&& model_outputs) {
    detail::copy_shard_heads(shard_outputs, s.shard.query_heads, 0, model_outputs, s.model.query_heads,
                             s.first_query_head, s.shard.query_heads, s.model.head_dim, "shard_outputs",
                             "model_outputs");
}

}  // namespace kvcache
