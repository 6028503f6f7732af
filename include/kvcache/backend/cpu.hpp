// The CPU backend: append, decode and prefill attention and merge_states for
// every layout view in host memory, threaded across sequences and KV heads.
#pragma once

#include "kvcache/backend/cpu/append.hpp"
#include "kvcache/backend/cpu/attention.hpp"
#include "kvcache/backend/cpu/merge_states.hpp"
#include "kvcache/backend/cpu/thread_pool.hpp"
