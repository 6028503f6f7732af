// The body both units compile, each with its own flags; internal linkage, so
// that this file itself adds no symbol the two units could share.
#pragma once

#include "isa_unit.hpp"
#include "kvcache/backend/cpu.hpp"

namespace {

isa_mix::unit_result run_decode(const isa_mix::view& cache, const std::vector<float>& queries,
                                const kvcache::attention_options& options) {
    isa_mix::unit_result result;
    result.isa = kvcache::cpu::detail::isa_name;
    result.entry = &kvcache::cpu::detail::decode<isa_mix::view, float>;
    result.outputs.resize(queries.size());
    result.lse.resize(std::size_t(cache.sequence_count()) * isa_mix::heads::query_heads());
    kvcache::decode_params call(cache, queries, result.outputs);
    call.lse = result.lse;
    call.options = options;
    kvcache::cpu_backend{}.decode(call);
    return result;
}

}  // namespace
