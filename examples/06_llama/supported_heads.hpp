// kvcache's layout views fix the head shape at compile time; a checkpoint's
// shape is known only at run time. These tables instantiate the cached path
// for the shapes of common Llama-family checkpoints and look one up.
// Adding a shape is one line in heads_*.cpp.
#pragma once

#include <string>
#include <vector>

#include "kvcache_engine/kvcache_attention.hpp"

namespace llama_example {

using cached_runner = kvcache::examples::cached_generation (*)(kvcache::examples::llama_model&, const std::vector<int>&,
                                                               int, const kvcache::examples::cache_options&,
                                                               const kvcache::examples::generation_options&);

/// One compiled head shape and the checkpoints that use it.
struct head_entry {
    kvcache::head_shape shape;
    const char* models;
    cached_runner run;
};

/// The entry for a compile-time head_config.
/// @tparam Heads the head_config
template <class Heads>
head_entry entry_for(const char* models) {
    return head_entry{kvcache::shape_of<Heads>(), models, &kvcache::examples::generate_with_kvcache<Heads>};
}

std::vector<head_entry> heads_d64();
std::vector<head_entry> heads_d128();
std::vector<head_entry> heads_small();

/// Every compiled shape.
inline std::vector<head_entry> supported_heads() {
    std::vector<head_entry> all = heads_small();
    for (auto& e : heads_d64()) all.push_back(e);
    for (auto& e : heads_d128()) all.push_back(e);
    return all;
}

}  // namespace llama_example
