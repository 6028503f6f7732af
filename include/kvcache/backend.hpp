// The backend layer: reference (double-precision oracle), cpu (threaded host
// implementation), cuda
// (entry points of the compiled instantiations, where the CUDA runtime headers
// are; definitions in kvcache/backend/cuda.cuh). The configuration lists,
// presets and the runtime dispatcher are the layer below (kvcache/configuration.hpp).
// The emulated backend (kernel bodies under the SIMT emulator) is in
// kvcache/testing.hpp, outside what every user includes.
#pragma once

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/cuda.hpp"
#include "kvcache/backend/reference.hpp"
