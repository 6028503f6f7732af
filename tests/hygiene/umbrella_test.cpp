// The umbrella header carries no testing tools: the SIMT emulator's fibers
// (inline assembly, POSIX contexts, guard pages) stay in kvcache/testing.hpp,
// and UCX's headers in kvcache/transport.hpp.
#include <kvcache/kvcache.hpp>

#include <cstdio>

#if defined(UCP_H_)
#error "kvcache/kvcache.hpp includes UCX; the transport belongs in kvcache/transport.hpp (kvcache::ucx)"
#endif

#if defined(KVCACHE_DETAIL_FIBERS_INCLUDED)
#error "kvcache/kvcache.hpp includes the SIMT emulator; it belongs in kvcache/testing.hpp"
#endif

int main() {
    std::puts("kvcache umbrella header: no emulator inside");
    return 0;
}
