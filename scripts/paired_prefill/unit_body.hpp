// Compiled twice, against the base headers and the branch's: prefill and decode through cpu_backend.
#include <vector>
#include "kvcache/backend/cpu.hpp"
#include "units.hpp"
// Internal linkage: a template of the same name in both units would otherwise
// be one weak symbol, and the linker would keep one unit's copy for both
// callers (seen here: base timed against itself, max abs diff 0).
namespace {
template <class View>
void run(const View& view, const std::vector<float>& q, const std::vector<int>& offsets, std::vector<float>& out) {
    kvcache::cpu_backend{}.prefill(kvcache::prefill_params(view, q, offsets, out));
}
template <class View>
void run_decode(const View& view, const std::vector<float>& q, std::vector<float>& out) {
    kvcache::cpu_backend{}.decode(kvcache::decode_params(view, q, out));
}
}  // namespace
