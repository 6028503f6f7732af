// Compiled twice, against the base headers and the branch's: prefill through cpu_backend.
#include <vector>
#include "kvcache/backend/cpu.hpp"
#include "units.hpp"
template <class View>
void run(const View& view, const std::vector<float>& q, const std::vector<int>& offsets, std::vector<float>& out) {
    kvcache::cpu_backend{}.prefill(kvcache::prefill_params(view, q, offsets, out));
}
