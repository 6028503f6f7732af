// The kernel layer: attention kernel bodies written once against the
// execution context (run by the CUDA and emulated backends), their parameters
// and the FP32 softmax arithmetic they share with the CPU backend.
#pragma once

#include "kvcache/kernels/append_kernel.hpp"
#include "kvcache/kernels/attention_options.hpp"
#include "kvcache/kernels/decode_kernel.hpp"
#include "kvcache/kernels/kernel_params.hpp"
#include "kvcache/kernels/merge_states_kernel.hpp"
#include "kvcache/kernels/new_tokens.hpp"
#include "kvcache/kernels/prefill_kernel.hpp"
#include "kvcache/kernels/scores_kernel.hpp"
#include "kvcache/kernels/softmax_math.hpp"
