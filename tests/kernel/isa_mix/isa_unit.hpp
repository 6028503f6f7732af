// What each of the two translation units of the ISA-mix test exports: a CPU
// decode compiled with that unit's flags, with the name of the instruction
// set its kernels were built for and the addresses of the entry points it
// instantiated. Everything the units define themselves has internal linkage,
// so the only shared symbols are the library's.
#pragma once

#include <string>
#include <vector>

#include "kvcache/backend/cpu/thread_pool.hpp"
#include "kvcache/kernels/attention_options.hpp"
#include "kvcache/layout/contiguous_view.hpp"

namespace isa_mix {

using heads = kvcache::head_config<8, 2, 64>;
using view = kvcache::contiguous_view<kvcache::half, heads>;
using decode_entry = void (*)(kvcache::cpu::thread_pool&, const view&, const float*, float*, float*,
                              const kvcache::attention_options&, float*, int);

struct unit_result {
    std::string isa;                    ///< cpu::detail::isa_name as that unit sees it
    decode_entry entry = nullptr;       ///< &cpu::detail::decode<view, float> taken in that unit
    std::vector<float> outputs, lse;    ///< its decode of the queries
};

/// Built with -mavx2 -mfma.
unit_result decode_avx2(const view& cache, const std::vector<float>& queries, const kvcache::attention_options& options);
/// Built for the generic ISA (-mno-avx and friends).
unit_result decode_generic(const view& cache, const std::vector<float>& queries, const kvcache::attention_options& options);

}  // namespace isa_mix
