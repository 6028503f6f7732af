// The installed UCX transport headers compile with kvcache::ucx's requirements (UCX's include path).
#include <kvcache/transport.hpp>

int consumer_ucx_window() { return kvcache::ucx_options{}.window; }
