// The CPU backend: kvcache::cpu_backend runs append, decode and prefill
// attention and merge for every layout view in host memory.
#pragma once

#include "kvcache/backend/cpu/cpu_backend.hpp"
