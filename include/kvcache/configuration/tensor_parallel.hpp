// Tensor-parallel shards as configurations: what rank r of T runs is the
// model's layout and element type with the shard's heads, so the dispatcher,
// the configuration lists and the CUDA instantiations serve shards unchanged.
// Every rank of a group has the same shard shape, so one instantiation serves
// all ranks.
#pragma once

#include "kvcache/configuration/configuration.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/tensor_parallel.hpp"

namespace kvcache {

/// The configuration rank `rank` of `ranks` runs for a model configured as
/// `model`: the same layout and element type, the shard's heads (see
/// shard_heads for the rules and the errors).
inline runtime_configuration shard_of(const runtime_configuration& model, int rank, int ranks) {
    runtime_configuration shard = model;
    shard.heads = shard_heads(model.heads, rank, ranks).shard;
    return shard;
}

namespace detail {

template <class Heads, int Ranks>
struct shard_heads_of {
    static_assert(Heads::static_counts, "kvcache::shard_heads_t needs compiled head counts (use shard_heads() for runtime ones)");
    static_assert(Ranks >= 1, "kvcache::shard_heads_t: Ranks must be at least 1");
    static_assert(Heads::query_heads() % Ranks == 0, "kvcache::shard_heads_t: Ranks must divide the query heads");
    static_assert(Heads::kv_heads() >= Ranks ? Heads::kv_heads() % Ranks == 0 : Ranks % Heads::kv_heads() == 0,
                  "kvcache::shard_heads_t: Ranks must divide the KV heads, or be a multiple of them (replicated KV heads)");
    using type = head_config<Heads::query_heads() / Ranks,
                             (Heads::kv_heads() >= Ranks ? Heads::kv_heads() / Ranks : 1), Heads::head_dim>;
};

}  // namespace detail

/// The compiled head configuration of every rank's shard of Heads over Ranks
/// ranks: shard_heads_t<head_config<32, 8, 128>, 2> is head_config<16, 4, 128>,
/// and shard_heads_t<head_config<32, 8, 128>, 16> is head_config<2, 1, 128>
/// (each KV head replicated on two ranks). Name it in a configuration list
/// so shards run compiled rather than through dynamic head counts.
/// @tparam Heads a head_config with static counts
/// @tparam Ranks ranks of the tensor-parallel group
template <class Heads, int Ranks>
using shard_heads_t = typename detail::shard_heads_of<Heads, Ranks>::type;

}  // namespace kvcache
