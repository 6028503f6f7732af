// Compiled without AVX, FMA or F16C (see tests/kernel/CMakeLists.txt).
#include "unit_body.hpp"

namespace isa_mix {
unit_result decode_generic(const view& cache, const std::vector<float>& queries,
                           const kvcache::attention_options& options) {
    return run_decode(cache, queries, options);
}
}  // namespace isa_mix
