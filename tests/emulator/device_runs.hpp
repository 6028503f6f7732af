// Host-callable wrappers around real-GPU launches of the test bodies
// (device_runs.cu), so the doctest file stays plain C++.
#pragma once

#include <string>
#include <vector>

namespace kvcache_test {

/// True when a CUDA device can run kernels; otherwise `why` says what is missing.
bool gpu_available(std::string& why);

/// Each wrapper copies inputs to the GPU, launches the body through
/// kvcache::launch and copies the outputs back.
void gpu_block_reduce(const std::vector<float>& input, int blocks, std::vector<float>& sums, std::vector<float>& maxima);
void gpu_block_vote(int blocks, std::vector<int>& votes);
void gpu_warp_ops(std::vector<int>& out);
void gpu_neighbour(const std::vector<float>& input, std::vector<float>& out);
void gpu_copy16(const std::vector<unsigned char>& source, std::vector<unsigned char>& floats,
                std::vector<unsigned char>& halves);
void gpu_grid(int x, int y, int z, std::vector<int>& out);

}  // namespace kvcache_test
