// The attention head configuration: query heads, KV heads, head dimension.
#pragma once

#include <string>

#include "kvcache/core/config.hpp"
#include "kvcache/core/error.hpp"

namespace kvcache {

/// Compile-time head configuration. Multi-head attention has
/// QueryHeads == KvHeads, grouped-query attention QueryHeads a multiple of
/// KvHeads, multi-query attention KvHeads == 1. Any group size works.
/// @tparam QueryHeads number of query heads
/// @tparam KvHeads number of key/value heads
/// @tparam HeadDim elements per head vector; a multiple of 8 so one row is whole 16-byte vectors of half
template <int QueryHeads, int KvHeads, int HeadDim>
struct head_config {
    static_assert(QueryHeads > 0, "kvcache::head_config: QueryHeads must be positive");
    static_assert(KvHeads > 0, "kvcache::head_config: KvHeads must be positive");
    static_assert(KvHeads <= QueryHeads, "kvcache::head_config: KvHeads cannot exceed QueryHeads");
    static_assert(QueryHeads % KvHeads == 0,
                  "kvcache::head_config: QueryHeads must be a multiple of KvHeads (each KV head serves a whole group)");
    static_assert(HeadDim > 0 && HeadDim % 8 == 0,
                  "kvcache::head_config: HeadDim must be a positive multiple of 8 (rows are read as 16-byte vectors)");
    static_assert(HeadDim <= 1024, "kvcache::head_config: HeadDim above 1024 is not supported");

    static constexpr int query_heads = QueryHeads;       ///< query heads
    static constexpr int kv_heads = KvHeads;             ///< key/value heads
    static constexpr int head_dim = HeadDim;             ///< elements per head vector
    static constexpr int group_size = QueryHeads / KvHeads;  ///< query heads served by one KV head
};

/// The same configuration as runtime values, for dispatch, files and messages.
struct head_shape {
    int query_heads = 0;  ///< query heads
    int kv_heads = 0;     ///< key/value heads
    int head_dim = 0;     ///< elements per head vector

    /// Query heads per KV head.
    constexpr int group_size() const noexcept { return kv_heads > 0 ? query_heads / kv_heads : 0; }

    /// Throws error_code::invalid_argument naming the broken rule.
    void validate() const {
        require(query_heads > 0, error_code::invalid_argument, "query_heads = ", query_heads, " must be positive");
        require(kv_heads > 0, error_code::invalid_argument, "kv_heads = ", kv_heads, " must be positive");
        require(query_heads % kv_heads == 0, error_code::invalid_argument, "query_heads = ", query_heads,
                " is not a multiple of kv_heads = ", kv_heads);
        require(head_dim > 0 && head_dim % 8 == 0 && head_dim <= 1024, error_code::invalid_argument,
                "head_dim = ", head_dim, " must be a positive multiple of 8 and at most 1024");
    }

    /// "32q/8kv/d128"
    std::string to_string() const {
        return detail::concat(query_heads, "q/", kv_heads, "kv/d", head_dim);
    }

    friend constexpr bool operator==(const head_shape& a, const head_shape& b) noexcept {
        return a.query_heads == b.query_heads && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim;
    }
    friend constexpr bool operator!=(const head_shape& a, const head_shape& b) noexcept { return !(a == b); }
};

/// The runtime shape of a compile-time head configuration.
/// @tparam Heads a head_config
template <class Heads>
constexpr head_shape shape_of() noexcept {
    return head_shape{Heads::query_heads, Heads::kv_heads, Heads::head_dim};
}

}  // namespace kvcache
