// The testing tools, outside the umbrella header kvcache/kvcache.hpp: the host
// SIMT emulator (emulate<Body>, schedules, fault checks) and the emulated
// backend, which runs the CUDA kernel bodies on the host. They use fibers
// (inline x86-64 assembly or POSIX ucontext) and threads, which a program
// that only uses the cache and the CPU or CUDA backends does not need.
#pragma once

#include "kvcache/backend/emulated.hpp"
#include "kvcache/execution/emulated_context.hpp"
#include "kvcache/execution/emulator.hpp"
#include "kvcache/execution/schedule.hpp"
