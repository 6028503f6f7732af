// The CUDA backend's entry points for int8 (qint8) caches, written out by hand:
// kvcache_add_cuda_instantiations' lists must equal kvcache::test_configurations,
// which does not name int8 until the dispatcher does. One paged view with
// compiled GQA counts and half rows, one sliding-window view with dynamic counts
// and float rows: the int8 append (a row per warp), the tile loads with row
// scales and the scores kernel compiled by nvcc; gpu_test.cpp runs them.
#include "kvcache/backend/cuda.cuh"
#include "kvcache/layout.hpp"

template struct kvcache::cuda::detail::instantiation<kvcache::paged_view<kvcache::qint8, kvcache::head_config<8, 2, 64>>,
                                                     kvcache::half>;
template struct kvcache::cuda::detail::instantiation<kvcache::sliding_window_view<kvcache::qint8, kvcache::dynamic_heads<32>>,
                                                     float>;
