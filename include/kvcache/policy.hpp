// The eviction-policy layer: what turns attention scores (from the kernels'
// optional scores output) or key norms into the rows a sequence keeps when
// its cache overflows. The compaction itself belongs to the owners.
#pragma once

#include "kvcache/policy/eviction_budget.hpp"
#include "kvcache/policy/eviction_policy.hpp"
#include "kvcache/policy/key_norms.hpp"
#include "kvcache/policy/score_accumulator.hpp"
#include "kvcache/policy/select_rows.hpp"
