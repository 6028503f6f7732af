// The key-token selection policies an overflowing cache can evict with, by
// name: which rows of a sequence's layer are worth keeping, and what each
// needs to decide it (scores from the kernels, key norms, nothing).
#pragma once

#include <string>
#include <string_view>

#include "kvcache/core/error.hpp"

namespace kvcache {

/// A key-token selection policy (docs/kernels.md, "Eviction policies").
enum class eviction_policy : int {
    none = 0,       ///< keep every row: no eviction
    streaming = 1,  ///< StreamingLLM: the sinks and the most recent rows
    h2o = 2,        ///< heavy hitters: attention accumulated over the steps (score_accumulator)
    snapkv = 3,     ///< attention of the prompt's last queries (prefill score_queries), max-pooled over neighbours
    tova = 4,       ///< attention of the latest query (the last decode's scores)
    knorm = 5,      ///< keys of low L2 norm are kept (key_norms)
    random = 6,     ///< seeded uniform choice: the baseline
};

/// The policy's name, as parse_eviction_policy reads it.
inline const char* to_string(eviction_policy policy) noexcept {
    switch (policy) {
    case eviction_policy::none: return "none";
    case eviction_policy::streaming: return "streaming";
    case eviction_policy::h2o: return "h2o";
    case eviction_policy::snapkv: return "snapkv";
    case eviction_policy::tova: return "tova";
    case eviction_policy::knorm: return "knorm";
    case eviction_policy::random: return "random";
    }
    return "unknown";
}

/// The policy named `name` (none, streaming, h2o, snapkv, tova, knorm, random).
inline eviction_policy parse_eviction_policy(std::string_view name) {
    for (const eviction_policy policy :
         {eviction_policy::none, eviction_policy::streaming, eviction_policy::h2o, eviction_policy::snapkv,
          eviction_policy::tova, eviction_policy::knorm, eviction_policy::random})
        if (name == to_string(policy)) return policy;
    throw_error(error_code::invalid_argument, "eviction policy '", std::string(name),
                "' is unknown (none, streaming, h2o, snapkv, tova, knorm, random)");
}

/// True when the policy ranks rows by per-row scores the caller must pass to
/// select_rows: attention (h2o, snapkv, tova) or key norms (knorm).
inline bool needs_scores(eviction_policy policy) noexcept {
    return policy == eviction_policy::h2o || policy == eviction_policy::snapkv || policy == eviction_policy::tova ||
           policy == eviction_policy::knorm;
}

/// What the policy's scores are, for messages and documentation.
inline const char* scores_needed(eviction_policy policy) noexcept {
    switch (policy) {
    case eviction_policy::h2o: return "accumulated attention (score_accumulator)";
    case eviction_policy::snapkv: return "the prompt's last queries' attention (prefill scores with score_queries)";
    case eviction_policy::tova: return "the latest query's attention (decode scores)";
    case eviction_policy::knorm: return "key norms (key_norms)";
    default: return "no scores";
    }
}

}  // namespace kvcache
