// The vocabulary layer: configuration macros, errors, element types, head
// configurations, spans and memory.
#pragma once

#include "kvcache/core/bfloat16.hpp"
#include "kvcache/core/config.hpp"
#include "kvcache/core/device_memory.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/float8.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/core/tensor_parallel.hpp"
