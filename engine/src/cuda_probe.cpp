// The engine's CUDA device probe (compiled only into kvcache_engine_cuda).
#include <cuda_runtime_api.h>

#include <string>

#include "kvcache_engine/compute_backend.hpp"

namespace kvcache::examples {

cuda_device_status probe_cuda_device() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();  // leave no error behind for later calls to trip over
        return {false, std::string("cudaGetDeviceCount failed with ") + cudaGetErrorName(status) + " (" +
                           cudaGetErrorString(status) + ")",
                ""};
    }
    if (count <= 0) return {false, "cudaGetDeviceCount reports " + std::to_string(count) + " devices", ""};
    int device = 0;
    cudaDeviceProp properties{};
    if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&properties, device) != cudaSuccess) {
        const cudaError_t failed = cudaGetLastError();
        return {false, std::string("the CUDA runtime cannot query the device: ") + cudaGetErrorString(failed), ""};
    }
    return {true, "",
            "device " + std::to_string(device) + ": " + properties.name + " (sm_" + std::to_string(properties.major) +
                std::to_string(properties.minor) + "), " + std::to_string(count) + " device" + (count > 1 ? "s" : "")};
}

}  // namespace kvcache::examples
