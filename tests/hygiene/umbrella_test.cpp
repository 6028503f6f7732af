// The umbrella header carries no testing tools: the SIMT emulator's fibers
// (inline assembly, POSIX contexts, guard pages) stay in kvcache/testing.hpp.
#include <kvcache/kvcache.hpp>

#include <cstdio>

#if defined(KVCACHE_DETAIL_FIBERS_INCLUDED)
#error "kvcache/kvcache.hpp includes the SIMT emulator; it belongs in kvcache/testing.hpp"
#endif

int main() {
    std::puts("kvcache umbrella header: no emulator inside");
    return 0;
}
