// The umbrella header: everything kvcache offers host code, layer by layer.
#pragma once

#include "kvcache/core.hpp"
#include "kvcache/execution.hpp"
#include "kvcache/layout.hpp"
#include "kvcache/cache.hpp"
#include "kvcache/kernels.hpp"
#include "kvcache/backend.hpp"
