// The emulator's header set, as installed: kvcache/testing.hpp and every
// header it reaches must be in the package (kvcache::emulator installs them
// apart from the rest of the tree, so a missing one shows here).
#include <kvcache/testing.hpp>

#if !defined(KVCACHE_DETAIL_FIBERS_INCLUDED)
#error "kvcache/testing.hpp did not bring the emulator's fibers"
#endif

int consumer_emulator_workers() { return kvcache::emulator_options{}.worker_threads; }
