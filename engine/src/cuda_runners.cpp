// The head shapes the examples' CUDA path is compiled for: each needs its
// 3 layouts x 2 element types instantiated by nvcc (engine/CMakeLists.txt),
// so the list is short: the flagship's shape and the tests' tiny checkpoint's.
#include <vector>

#include "kvcache_engine/compute_backend.hpp"
#include "kvcache_engine/cuda_attention.hpp"
#include "kvcache_engine/generation_comparison.hpp"

namespace kvcache::examples {

namespace {

using tiny_checkpoint_heads = head_config<4, 2, 16>;  // engine/tests' tiny checkpoint

struct cuda_entry {
    head_shape heads;
    cached_runner run;
};

std::vector<cuda_entry> cuda_entries() {
    return {
        {shape_of<flagship_heads>(), &generate_with_kvcache_cuda<flagship_heads>},
        {shape_of<tiny_checkpoint_heads>(), &generate_with_kvcache_cuda<tiny_checkpoint_heads>},
    };
}

}  // namespace

cached_runner cuda_runner_for(const head_shape& heads) {
    for (const auto& e : cuda_entries())
        if (e.heads == heads) return e.run;
    return nullptr;
}

std::vector<head_shape> cuda_compiled_heads() {
    std::vector<head_shape> out;
    for (const auto& e : cuda_entries()) out.push_back(e.heads);
    return out;
}

}  // namespace kvcache::examples
