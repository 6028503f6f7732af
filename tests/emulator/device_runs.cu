// The emulator's test bodies compiled by nvcc into real kernels through the
// generic trampoline, so the device path of every context member is built
// (and, on a machine with a GPU, run).
#include "device_runs.hpp"

#include <cuda_runtime.h>

#include "kvcache/core/cuda_error.hpp"
#include "kvcache/execution/device_launch.cuh"
#include "test_bodies.hpp"

namespace kvcache_test {
namespace {

template <class T>
struct device_array {
    T* pointer = nullptr;
    explicit device_array(std::size_t count) { KVCACHE_CUDA_CHECK(cudaMalloc(&pointer, count * sizeof(T) + 16)); }
    device_array(const std::vector<T>& host) : device_array(host.size()) {
        KVCACHE_CUDA_CHECK(cudaMemcpy(pointer, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~device_array() { cudaFree(pointer); }
    device_array(const device_array&) = delete;
    device_array& operator=(const device_array&) = delete;
    void copy_to(std::vector<T>& host) const {
        KVCACHE_CUDA_CHECK(cudaMemcpy(host.data(), pointer, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    }
};

void finish() {
    KVCACHE_CUDA_CHECK(cudaGetLastError());
    KVCACHE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

bool gpu_available(std::string& why) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(status);
        return false;
    }
    if (count == 0) {
        why = "no CUDA device present";
        return false;
    }
    return true;
}

void gpu_block_reduce(const std::vector<float>& input, int blocks, std::vector<float>& sums, std::vector<float>& maxima) {
    device_array<float> in(input), s(sums.size()), m(maxima.size());
    kvcache::launch<block_reduce_body>(index3{blocks, 1, 1}, 0, nullptr, reduce_params{in.pointer, s.pointer, m.pointer});
    finish();
    s.copy_to(sums);
    m.copy_to(maxima);
}

void gpu_block_vote(int blocks, std::vector<int>& votes) {
    device_array<int> v(votes.size());
    kvcache::launch<block_vote_body>(index3{blocks, 1, 1}, 0, nullptr, vote_params{v.pointer});
    finish();
    v.copy_to(votes);
}

void gpu_warp_ops(std::vector<int>& out) {
    device_array<int> o(out.size());
    kvcache::launch<warp_ops_body>(index3{}, 0, nullptr, warp_ops_params{o.pointer});
    finish();
    o.copy_to(out);
}

void gpu_neighbour(const std::vector<float>& input, std::vector<float>& out) {
    device_array<float> in(input), o(out.size());
    kvcache::launch<neighbour_body<true>>(index3{}, 128 * sizeof(float), nullptr, neighbour_params{in.pointer, o.pointer});
    finish();
    o.copy_to(out);
    // The barrier-less variant is compiled too (never compared: its result is a race).
    kvcache::launch<neighbour_body<false>>(index3{}, 128 * sizeof(float), nullptr, neighbour_params{in.pointer, o.pointer});
    finish();
}

void gpu_copy16(const std::vector<unsigned char>& source, std::vector<unsigned char>& floats,
                std::vector<unsigned char>& halves) {
    device_array<unsigned char> in(source), f(floats.size()), h(halves.size());
    kvcache::launch<copy16_body>(index3{}, 0, nullptr, copy16_params{in.pointer, f.pointer, h.pointer, 0});
    finish();
    f.copy_to(floats);
    h.copy_to(halves);
}

void gpu_grid(int x, int y, int z, std::vector<int>& out) {
    device_array<int> o(out.size());
    kvcache::launch<grid_body>(index3{x, y, z}, 0, nullptr, grid_params{o.pointer});
    finish();
    o.copy_to(out);
}

}  // namespace kvcache_test
