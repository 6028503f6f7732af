// The kernel matrix on a real GPU through the CUDA backend (the instantiation
// library compiled from KVCACHE_CUDA_TEST_CONFIGURATIONS), against the same
// reference, through the same harness as every other backend: the factories'
// buffers are CUDA managed memory, so the kernels and the reference read the
// same bytes. Without a device the test prints why and passes.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>
#include <string>
#include <vector>

#include "kvcache/backend/cuda.hpp"
#include "kvcache/configuration/presets.hpp"
#include "kvcache_kernel_gpu_configurations.hpp"
#include "support/attention_harness.hpp"
#include "support/layout_factories.hpp"
#include "support/score_checks.hpp"

using namespace kvcache;
using namespace kvcache_test;

// The CMake list KVCACHE_CUDA_TEST_CONFIGURATIONS and the C++ list the
// dispatcher offers must be the same configurations in the same order.
static_assert(std::is_same_v<compiled::kvcache_kernel_gpu, test_configurations>,
              "KVCACHE_CUDA_TEST_CONFIGURATIONS (cmake) and kvcache::test_configurations (presets.hpp) differ");

namespace {

void check_cuda(cudaError_t status, const char* what) {
    if (status != cudaSuccess) throw_error(error_code::cuda_error, what, ": ", cudaGetErrorString(status));
}

/// Zeroed CUDA managed memory with the interface of host_buffer the factories use.
template <class T>
class managed_buffer {
public:
    managed_buffer() = default;
    explicit managed_buffer(std::size_t count) : count_(count) {
        check_cuda(cudaMallocManaged(reinterpret_cast<void**>(&data_), std::max<std::size_t>(count, 1) * sizeof(T)),
                   "cudaMallocManaged");
        std::memset(static_cast<void*>(data_), 0, std::max<std::size_t>(count, 1) * sizeof(T));
    }
    managed_buffer(managed_buffer&& other) noexcept : data_(other.data_), count_(other.count_) { other.data_ = nullptr; }
    managed_buffer& operator=(managed_buffer&& other) noexcept {
        std::swap(data_, other.data_);
        std::swap(count_, other.count_);
        return *this;
    }
    ~managed_buffer() {
        if (data_) cudaFree(data_);
    }
    T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return count_; }
    T& operator[](std::size_t i) const noexcept { return data_[i]; }

private:
    T* data_ = nullptr;
    std::size_t count_ = 0;
};

template <class T>
managed_buffer<T> managed_copy(const T* source, std::size_t count) {
    managed_buffer<T> copy(count);
    if (count) std::memcpy(static_cast<void*>(copy.data()), source, count * sizeof(T));
    return copy;
}

template <class Layout>
struct factory_for;
template <>
struct factory_for<contiguous_layout> {
    using type = contiguous_factory_in<managed_buffer>;
};
template <>
struct factory_for<paged_layout> {
    using type = paged_factory_in<managed_buffer>;
};
template <>
struct factory_for<sliding_window_layout> {
    using type = sliding_window_factory_in<managed_buffer>;
};

template <class... Configurations>
void check_compiled(type_list<Configurations...>) {
    const auto one = [](auto configuration) {
        using c = decltype(configuration);
        // fp8 caches get scales far from 1 and run with the activation type they are instantiated for.
        using element = typename c::element;
        using plain = typename factory_for<typename c::layout>::type;
        using factory = std::conditional_t<is_scaled_element_v<element>, scaled_factory<plain>, plain>;
        using query = default_activation_t<element>;
        using heads = typename c::heads;
        if constexpr (heads::static_counts) {
            check_attention<factory, element, heads, query>(cuda_backend{}, "cuda");
            check_append<factory, element, heads, query>(cuda_backend{}, "cuda");
            if constexpr (!is_scaled_element_v<element>) check_scores<factory, element, heads, query>(cuda_backend{}, "cuda");
        } else {  // the generic kernels: a GQA group, one over decode_dynamic_rows (several blocks), MHA
            for (const heads counts : {heads(6, 2), heads(9, 1), heads(3, 3)}) {
                check_attention<factory, element, heads, query>(cuda_backend{}, "cuda", counts);
                check_append<factory, element, heads, query>(cuda_backend{}, "cuda", counts);
                if constexpr (!is_scaled_element_v<element>)
                    check_scores<factory, element, heads, query>(cuda_backend{}, "cuda", counts);
            }
        }
    };
    (one(Configurations{}), ...);
}

/// Empty when a device is usable, else why not.
std::string missing_device() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(status);
    if (count == 0) return "no CUDA device is present";
    return "";
}

}  // namespace

TEST_CASE("cuda backend matches the reference on every compiled configuration") {
    const std::string reason = missing_device();
    if (!reason.empty()) {
        std::printf("kvcache gpu kernel test skipped: %s\n", reason.c_str());
        CHECK(!reason.empty());
        return;
    }
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
    std::printf("kvcache gpu kernel test on %s (compute capability %d.%d, %d multiprocessors)\n", properties.name,
                properties.major, properties.minor, properties.multiProcessorCount);
    check_compiled(compiled::kvcache_kernel_gpu{});
}

TEST_CASE("cuda backend on int8 caches (int8_cuda_instantiations.cu) matches the reference") {
    const std::string reason = missing_device();
    if (!reason.empty()) {
        std::printf("kvcache gpu int8 test skipped: %s\n", reason.c_str());
        CHECK(!reason.empty());
        return;
    }
    using paged = paged_factory_in<managed_buffer>;
    using window = sliding_window_factory_in<managed_buffer>;
    using gqa = head_config<8, 2, 64>;
    check_attention<paged, qint8, gqa, half>(cuda_backend{}, "cuda");
    check_append<paged, qint8, gqa, half>(cuda_backend{}, "cuda");
    check_scores<paged, qint8, gqa, half>(cuda_backend{}, "cuda");
    for (const dynamic_heads<32> counts : {dynamic_heads<32>(6, 2), dynamic_heads<32>(9, 1), dynamic_heads<32>(3, 3)}) {
        check_attention<window, qint8, dynamic_heads<32>, float>(cuda_backend{}, "cuda", counts);
        check_append<window, qint8, dynamic_heads<32>, float>(cuda_backend{}, "cuda", counts);
        check_scores<window, qint8, dynamic_heads<32>, float>(cuda_backend{}, "cuda", counts);
    }
}

TEST_CASE("cuda backend on int4 caches (int4_cuda_instantiations.cu) matches the reference") {
    const std::string reason = missing_device();
    if (!reason.empty()) {
        std::printf("kvcache gpu int4 test skipped: %s\n", reason.c_str());
        CHECK(!reason.empty());
        return;
    }
    using paged = paged_factory_in<managed_buffer>;
    using window = sliding_window_factory_in<managed_buffer>;
    using gqa = head_config<8, 2, 128>;
    check_attention<paged, qint4, gqa, half>(cuda_backend{}, "cuda");
    check_append<paged, qint4, gqa, half>(cuda_backend{}, "cuda");
    check_scores<paged, qint4, gqa, half>(cuda_backend{}, "cuda");
    for (const dynamic_heads<40> counts : {dynamic_heads<40>(6, 2), dynamic_heads<40>(9, 1), dynamic_heads<40>(3, 3)}) {
        check_attention<window, qint4, dynamic_heads<40>, float>(cuda_backend{}, "cuda", counts);
        check_append<window, qint4, dynamic_heads<40>, float>(cuda_backend{}, "cuda", counts);
        check_scores<window, qint4, dynamic_heads<40>, float>(cuda_backend{}, "cuda", counts);
    }
}

TEST_CASE("cuda merge_states: empty states weigh nothing") {
    if (!missing_device().empty()) {
        CHECK(!missing_device().empty());
        return;
    }
    const float inf = std::numeric_limits<float>::infinity();
    const int states = 3, rows = 4, dim = 16;
    const auto host_outputs = random_rows<float>(states * rows * dim, 1.0f, 9);
    const std::vector<float> host_lse = {1.0f, -inf, -inf, 30.0f, 2.0f, 0.5f, -inf, -20.0f, 0.0f, 3.0f, -inf, 0.0f};
    auto outputs = managed_copy(host_outputs.data(), host_outputs.size());
    auto lse = managed_copy(host_lse.data(), host_lse.size());
    managed_buffer<float> merged(rows * dim), merged_lse(rows);
    merge_params call(states, rows, dim, outputs, lse, merged);
    call.merged_lse = merged_lse;
    const cuda_backend backend;
    backend.merge(call);
    backend.synchronize();
    std::vector<float> expected(rows * dim), expected_lse(rows);
    merge_params reference_call(states, rows, dim, host_outputs, host_lse, expected);
    reference_call.merged_lse = expected_lse;
    reference_backend{}.merge(reference_call);
    for (int i = 0; i < rows * dim; ++i) CHECK(merged[i] == doctest::Approx(expected[i]).epsilon(1e-5));
    CHECK(merged_lse[2] == -inf);
}
