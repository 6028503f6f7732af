// The cache layer: host-side owners of the three layouts (contiguous static
// and dynamic, paged with a prefix cache, sliding window).
#pragma once

#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/page_pool.hpp"
#include "kvcache/cache/page_transfer.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sequence_id.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
