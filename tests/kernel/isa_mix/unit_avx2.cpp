// Compiled with -mavx2 -mfma (see tests/kernel/CMakeLists.txt).
#include "unit_body.hpp"

namespace isa_mix {
unit_result decode_avx2(const view& cache, const std::vector<float>& queries, const kvcache::attention_options& options) {
    return run_decode(cache, queries, options);
}
}  // namespace isa_mix
