// The backend layer: reference (double-precision oracle), cpu (threaded host
// implementation), emulated (kernel bodies under the SIMT emulator), cuda
// (entry points of the compiled instantiations, where the CUDA runtime headers
// are; definitions in kvcache/backend/cuda.cuh), and the configuration lists,
// presets and runtime dispatcher that choose among compiled configurations.
#pragma once

#include "kvcache/backend/configuration.hpp"
#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/cuda.hpp"
#include "kvcache/backend/dispatch.hpp"
#include "kvcache/backend/emulated.hpp"
#include "kvcache/backend/presets.hpp"
#include "kvcache/backend/reference.hpp"
