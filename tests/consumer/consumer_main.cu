// The same package used from a CUDA translation unit: device code sees C++17
// and kvcache's host-device types.
#include <kvcache/kvcache.hpp>

__global__ void widen(const kvcache::half* in, float* out) { out[threadIdx.x] = static_cast<float>(in[threadIdx.x]); }

int consumer_cuda_compiled() { return kvcache::head_config<8, 1, 64>::group_size(); }
