// Page transfer between processes over UCX: ucx_sender and ucx_receiver
// carry page exports (kvcache/cache/page_transfer.hpp) between paged caches
// of different processes or hosts. Not part of kvcache/kvcache.hpp: it needs
// UCX; link kvcache::ucx.
#pragma once

#include "kvcache/transport/ucx_handles.hpp"
#include "kvcache/transport/ucx_receiver.hpp"
#include "kvcache/transport/ucx_sender.hpp"
#include "kvcache/transport/ucx_wire.hpp"
