// The execution layer: the context concept kernels are written against and the
// host SIMT emulator. The device side (nvcc only) is in
// kvcache/execution/device_context.cuh and kvcache/execution/device_launch.cuh.
#pragma once

#include "kvcache/execution/context.hpp"
#include "kvcache/execution/emulated_context.hpp"
#include "kvcache/execution/emulator.hpp"
#include "kvcache/execution/index3.hpp"
#include "kvcache/execution/schedule.hpp"
#include "kvcache/execution/vector16.hpp"
