// The CUDA cached path over the configurations engine/CMakeLists.txt
// instantiates with nvcc: the list comes from the generated header, so the
// dispatcher and the compiled kernels cannot disagree.
#include <string>

#include "kvcache/configuration/dispatch.hpp"
#include "kvcache_engine/compute_backend.hpp"
#include "kvcache_engine/cuda_attention.hpp"
#include "kvcache_engine_cuda_kernels_configurations.hpp"

namespace kvcache::examples {

namespace {

using cuda_configurations = kvcache::compiled::kvcache_engine_cuda_kernels;

cached_generation generate_on_cuda(llama_model& model, const std::vector<int>& prompt, int new_tokens,
                                   const cache_options& cache, const generation_options& options) {
    return generate_with_kvcache_cuda<cuda_configurations>(model, prompt, new_tokens, cache, options);
}

}  // namespace

cached_runner cuda_runner_for(const runtime_configuration& wanted) {
    return supports(cuda_configurations{}, wanted) ? &generate_on_cuda : nullptr;
}

std::string cuda_compiled_configurations() { return describe(cuda_configurations{}); }

}  // namespace kvcache::examples
