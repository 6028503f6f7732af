// The umbrella header: everything kvcache offers host code.
#pragma once

#include "kvcache/core.hpp"
#include "kvcache/kernels.hpp"
#include "kvcache/backend.hpp"
