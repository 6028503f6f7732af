// The execution layer: the context concept kernels are written against. The
// host SIMT emulator (fibers, inline assembly, POSIX contexts) is a testing
// tool and is not included here: see kvcache/testing.hpp. The device side
// (nvcc only) is in kvcache/execution/device_context.cuh and device_launch.cuh.
#pragma once

#include "kvcache/execution/context.hpp"
#include "kvcache/execution/index3.hpp"
#include "kvcache/execution/schedule.hpp"
#include "kvcache/execution/vector16.hpp"
