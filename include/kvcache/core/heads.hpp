// The attention head configuration: query heads, KV heads, head dimension.
// The two head counts are compile-time values or runtime ones (`dynamic`), as
// CuTe lets a shape mix static and dynamic extents: a compiled shape runs at
// full speed, and a dynamic one lets any model shape run through one generic
// instantiation per head dimension. The head dimension is always static: it
// sizes the kernels' register and shared-memory tiles.
#pragma once

#include <string>

#include "kvcache/core/config.hpp"
#include "kvcache/core/error.hpp"

namespace kvcache {

/// Marks a head count as a runtime value of the configuration object.
inline constexpr int dynamic = -1;

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

namespace detail {

/// Both counts compiled: an empty type whose accessors are static and constexpr,
/// so `Heads::kv_heads()` sizes arrays and unrolls loops.
template <int QueryHeads, int KvHeads>
struct head_count_storage {
    static_assert(QueryHeads > 0, "kvcache::head_config: QueryHeads must be positive or kvcache::dynamic");
    static_assert(KvHeads > 0, "kvcache::head_config: KvHeads must be positive or kvcache::dynamic");
    static_assert(KvHeads <= QueryHeads, "kvcache::head_config: KvHeads cannot exceed QueryHeads");
    static_assert(QueryHeads % KvHeads == 0,
                  "kvcache::head_config: QueryHeads must be a multiple of KvHeads (each KV head serves a whole group)");

    static constexpr bool static_counts = true;  ///< both counts are compile-time values

    constexpr head_count_storage() = default;
    KVCACHE_HOST_DEVICE static constexpr int query_heads() noexcept { return QueryHeads; }  ///< query heads
    KVCACHE_HOST_DEVICE static constexpr int kv_heads() noexcept { return KvHeads; }        ///< key/value heads
    /// Query heads served by one KV head.
    KVCACHE_HOST_DEVICE static constexpr int group_size() noexcept { return QueryHeads / KvHeads; }
};

/// A dynamic count: both counts are held as values (a static one must match).
template <int QueryHeads, int KvHeads>
struct dynamic_head_counts {
    static constexpr bool static_counts = false;  ///< at least one count is a runtime value

    int query_heads_value = QueryHeads == dynamic ? 0 : QueryHeads;  ///< query heads (read query_heads())
    int kv_heads_value = KvHeads == dynamic ? 0 : KvHeads;           ///< key/value heads (read kv_heads())

    KVCACHE_HOST_DEVICE constexpr int query_heads() const noexcept { return query_heads_value; }
    KVCACHE_HOST_DEVICE constexpr int kv_heads() const noexcept { return kv_heads_value; }
    KVCACHE_HOST_DEVICE constexpr int group_size() const noexcept {
        return kv_heads_value > 0 ? query_heads_value / kv_heads_value : 0;
    }
};

template <int KvHeads>
struct head_count_storage<dynamic, KvHeads> : dynamic_head_counts<dynamic, KvHeads> {};
template <int QueryHeads>
struct head_count_storage<QueryHeads, dynamic> : dynamic_head_counts<QueryHeads, dynamic> {};
template <>
struct head_count_storage<dynamic, dynamic> : dynamic_head_counts<dynamic, dynamic> {};

}  // namespace detail

/// A head configuration. Multi-head attention has query_heads == kv_heads,
/// grouped-query attention query_heads a multiple of kv_heads, multi-query
/// attention kv_heads == 1; any group size works. Counts given as
/// kvcache::dynamic are runtime values: construct the object with them,
/// `head_config<dynamic, dynamic, 128>{32, 8}`, and hand it to the cache or
/// view. Read the counts as `heads.kv_heads()` (static configurations also as
/// `Heads::kv_heads()`, a constant expression).
/// @tparam QueryHeads number of query heads, or kvcache::dynamic
/// @tparam KvHeads number of key/value heads, or kvcache::dynamic
/// @tparam HeadDim elements per head vector; a multiple of 8 so one row is whole 16-byte vectors of half
template <int QueryHeads, int KvHeads, int HeadDim>
struct head_config : detail::head_count_storage<QueryHeads, KvHeads> {
    static_assert(HeadDim > 0 && HeadDim % 8 == 0,
                  "kvcache::head_config: HeadDim must be a positive multiple of 8 (rows are read as 16-byte vectors)");
    static_assert(HeadDim <= 1024, "kvcache::head_config: HeadDim above 1024 is not supported");

    static constexpr int head_dim = HeadDim;  ///< elements per head vector (always a compile-time value)

    /// The compiled configuration (static counts only).
    constexpr head_config() = default;

    /// A configuration from runtime counts. For a static configuration they
    /// must equal the compiled ones; every rule of head_shape::validate holds.
    /// Throws error_code::invalid_argument naming the count and the rule.
    head_config(int query_heads, int kv_heads) {
        head_shape{query_heads, kv_heads, HeadDim}.validate();
        if constexpr (QueryHeads != dynamic)
            require(query_heads == QueryHeads, error_code::invalid_argument, "query_heads = ", query_heads,
                    " but this configuration is compiled for ", QueryHeads);
        if constexpr (KvHeads != dynamic)
            require(kv_heads == KvHeads, error_code::invalid_argument, "kv_heads = ", kv_heads,
                    " but this configuration is compiled for ", KvHeads);
        if constexpr (!head_config::static_counts) {
            this->query_heads_value = query_heads;
            this->kv_heads_value = kv_heads;
        }
    }

    /// A configuration from a runtime shape (its head_dim must be HeadDim).
    explicit head_config(const head_shape& shape) : head_config(checked_dim(shape).query_heads, shape.kv_heads) {}

    /// True when the counts are set (always, for a static configuration).
    KVCACHE_HOST_DEVICE constexpr bool valid() const noexcept { return this->kv_heads() > 0 && this->query_heads() > 0; }

private:
    static const head_shape& checked_dim(const head_shape& shape) {
        require(shape.head_dim == HeadDim, error_code::invalid_argument, "head_dim = ", shape.head_dim,
                " but this configuration is compiled for ", HeadDim);
        return shape;
    }
};

/// Head counts held at run time, the head dimension compiled.
/// @tparam HeadDim elements per head vector
template <int HeadDim>
using dynamic_heads = head_config<dynamic, dynamic, HeadDim>;

/// True when Heads' counts are compile-time values.
/// @tparam Heads a head_config
template <class Heads>
inline constexpr bool has_static_counts_v = Heads::static_counts;

namespace detail {

/// Heads::group_size() when the counts are compiled, else fallback: what a
/// kernel sizes its per-block rows by.
template <class Heads>
KVCACHE_HOST_DEVICE constexpr int static_group_size_or(int fallback) noexcept {
    if constexpr (Heads::static_counts) return Heads::group_size();
    else return fallback;
}

}  // namespace detail

/// The runtime shape of a static head configuration.
/// @tparam Heads a head_config with static counts
template <class Heads>
constexpr head_shape shape_of() noexcept {
    static_assert(Heads::static_counts, "kvcache::shape_of<Heads>(): a dynamic configuration needs its object, shape_of(heads)");
    return head_shape{Heads::query_heads(), Heads::kv_heads(), Heads::head_dim};
}

/// The runtime shape of a head configuration object.
/// @tparam Heads a head_config
template <class Heads>
constexpr head_shape shape_of(const Heads& heads) noexcept {
    return head_shape{heads.query_heads(), heads.kv_heads(), Heads::head_dim};
}

}  // namespace kvcache
