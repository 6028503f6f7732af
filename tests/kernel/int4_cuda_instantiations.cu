// The CUDA backend's entry points for int4 (qint4) caches, written out by hand
// as int8_cuda_instantiations.cu does, until the dispatcher and
// kvcache::test_configurations name int4. One paged view with compiled GQA
// counts, half rows and four groups a row; one sliding-window view with dynamic
// counts, float rows and a short last group (head_dim 40): the int4 append (a
// row per warp, group extremes over 4 lanes), the dequantising tile loads and
// the scores kernel compiled by nvcc; gpu_test.cpp runs them.
#include "kvcache/backend/cuda.cuh"
#include "kvcache/layout.hpp"

template struct kvcache::cuda::detail::instantiation<kvcache::paged_view<kvcache::qint4, kvcache::head_config<8, 2, 128>>,
                                                     kvcache::half>;
template struct kvcache::cuda::detail::instantiation<kvcache::sliding_window_view<kvcache::qint4, kvcache::dynamic_heads<40>>,
                                                     float>;
