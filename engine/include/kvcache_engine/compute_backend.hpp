// --backend auto|cpu|cuda for the examples: which backend runs the cached
// path, and why. Plain C++: the CUDA entry points are declared only where
// kvcache_engine_cuda is linked (KVCACHE_ENGINE_CUDA, set by CMake), and
// otherwise every question about CUDA answers "this build has none".
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kvcache/core/heads.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/kvcache_attention.hpp"

namespace kvcache::examples {

/// Whether a CUDA device can be used, and if not why.
struct cuda_device_status {
    bool available = false;
    std::string reason;  ///< why not, when !available
    std::string device;  ///< "NVIDIA H100 (sm_90), 1 device", when available
};

#if KVCACHE_ENGINE_CUDA
/// Asks the CUDA runtime (cudaGetDeviceCount) for a device; defined in cuda_probe.cpp.
cuda_device_status probe_cuda_device();
/// The CUDA cached path when a configuration compiled for it runs `wanted`
/// (its head counts compiled, or dynamic ones of its head dimension), else
/// nullptr; defined in cuda_runners.cpp.
cached_runner cuda_runner_for(const runtime_configuration& wanted);
/// The configurations the CUDA path is compiled for, as text.
std::string cuda_compiled_configurations();
#else
inline cuda_device_status probe_cuda_device() {
    return {false, "this build has no CUDA backend (configure with nvcc found and -DKVCACHE_ENABLE_CUDA=ON)", ""};
}
inline cached_runner cuda_runner_for(const runtime_configuration&) { return nullptr; }
inline std::string cuda_compiled_configurations() { return "none"; }
#endif

/// The backend that runs the cached path (emulated: the CUDA path's steps on the SIMT emulator).
enum class compute_backend { cpu, cuda, emulated };

/// What --backend resolved to, and the line that says why.
struct backend_choice {
    compute_backend backend = compute_backend::cpu;
    std::string why;
};

/// Reads --backend auto|cpu|cuda (default auto), and emulated where the program offers it.
inline std::string backend_request(const arguments& args, bool offers_emulated = false,
                                   const std::string& name = "--backend") {
    const std::string v = args.text(name, "auto");
    if (v == "auto" || v == "cpu" || v == "cuda" || (offers_emulated && v == "emulated")) return v;
    throw usage_error(name + " '" + v + "' is not one of auto, cpu, cuda" + (offers_emulated ? ", emulated" : ""));
}

/// Resolves a request: cpu is always there; cuda needs this build's CUDA path and a device
/// (else throws "no CUDA device: <reason>"); auto takes cuda when both are there, else cpu.
inline backend_choice choose_backend(const std::string& request) {
    if (request == "cpu") return {compute_backend::cpu, "--backend cpu"};
    if (request == "emulated")
        return {compute_backend::emulated, "--backend emulated: the CUDA path's steps on kvcache's SIMT emulator, host memory"};
    const cuda_device_status cuda = probe_cuda_device();
    if (request == "cuda") {
        if (!cuda.available) throw std::runtime_error("no CUDA device: " + cuda.reason);
        return {compute_backend::cuda, "--backend cuda; " + cuda.device};
    }
    if (cuda.available) return {compute_backend::cuda, "--backend auto found " + cuda.device};
    return {compute_backend::cpu, "--backend auto: no CUDA device: " + cuda.reason};
}

inline const char* to_string(compute_backend backend) noexcept {
    switch (backend) {
    case compute_backend::cuda: return "cuda";
    case compute_backend::emulated: return "emulated";
    case compute_backend::cpu: break;
    }
    return "cpu";
}

}  // namespace kvcache::examples
