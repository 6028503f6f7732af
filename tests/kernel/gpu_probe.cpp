// A small append + split decode + prefill on the GPU, checked against the
// reference: the program scripts/gpu-check runs under compute-sanitizer
// (memcheck, racecheck), where the full matrix would take too long. Exits 0
// with a message when no device is present.
#include <cuda_runtime_api.h>

#include <cmath>
#include <stdexcept>
#include <cstdio>
#include <vector>

#include "kvcache/backend/cuda.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/layout/paged_view.hpp"

namespace {

using heads = kvcache::head_config<8, 2, 64>;  // the test model: GQA group 4
using element = kvcache::half;
using view_type = kvcache::paged_view<element, heads>;

template <class T>
T* managed(std::size_t count) {
    void* p = nullptr;
    if (cudaMallocManaged(&p, count * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMallocManaged failed");
    return static_cast<T*>(p);
}

float next_random(unsigned& state) {
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) / float(1u << 24) * 2.0f - 1.0f;
}

int run() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("kvcache gpu probe skipped: no CUDA device\n");
        return 0;
    }
    const int batch = 2, page_size = 16;
    const int lengths_host[batch] = {150, 37};
    const int chunk_host[batch] = {20, 37};
    int* lengths = managed<int>(batch);
    int* page_offsets = managed<int>(batch + 1);
    page_offsets[0] = 0;
    for (int b = 0; b < batch; ++b) {
        lengths[b] = lengths_host[b];
        page_offsets[b + 1] = page_offsets[b] + (lengths_host[b] + page_size - 1) / page_size;
    }
    const int pages = page_offsets[batch];
    int* page_indices = managed<int>(pages);
    for (int i = 0; i < pages; ++i) page_indices[i] = pages - 1 - i;  // reversed pool order
    const std::size_t pool = std::size_t(pages) * heads::kv_heads() * page_size * heads::head_dim;
    element* keys = managed<element>(pool);
    element* values = managed<element>(pool);
    const view_type view = view_type::packed(keys, values, page_offsets, page_indices, lengths, batch, page_size);

    // Append every token with the kernel, then prefill the last chunk and decode.
    int* offsets = managed<int>(batch + 1);
    offsets[0] = 0;
    for (int b = 0; b < batch; ++b) offsets[b + 1] = offsets[b] + lengths_host[b];
    const std::size_t rows = std::size_t(offsets[batch]) * heads::kv_heads() * heads::head_dim;
    element* new_keys = managed<element>(rows);
    element* new_values = managed<element>(rows);
    unsigned state = 7;
    for (std::size_t i = 0; i < rows; ++i) new_keys[i] = element(next_random(state)), new_values[i] = element(next_random(state));
    using kvcache::span;
    const kvcache::cuda_backend backend;
    backend.append(kvcache::append_params(view, span<const element>(new_keys, rows), span<const element>(new_values, rows),
                                          span<const int>(offsets, batch + 1)));

    int* query_offsets = managed<int>(batch + 1);
    query_offsets[0] = 0;
    for (int b = 0; b < batch; ++b) query_offsets[b + 1] = query_offsets[b] + chunk_host[b];
    const std::size_t prefill_rows = std::size_t(query_offsets[batch]) * heads::query_heads();
    element* queries = managed<element>(prefill_rows * heads::head_dim);
    for (std::size_t i = 0; i < prefill_rows * heads::head_dim; ++i) queries[i] = element(3.0f * next_random(state));
    element* prefill_out = managed<element>(prefill_rows * heads::head_dim);
    element* decode_out = managed<element>(std::size_t(batch) * heads::query_heads() * heads::head_dim);
    const std::size_t decode_elements = std::size_t(batch) * heads::query_heads() * heads::head_dim;
    const span<const element> query_rows(queries, prefill_rows * heads::head_dim);
    const span<const int> query_offset_rows(query_offsets, batch + 1);
    kvcache::prefill_params prefill(view, query_rows, query_offset_rows,
                                    span<element>(prefill_out, prefill_rows * heads::head_dim));
    backend.prefill(prefill);
    const span<const element> decode_queries(queries, decode_elements);
    kvcache::decode_params decode(view, decode_queries, span<element>(decode_out, decode_elements));
    decode.options.kv_splits = 3;
    backend.decode(decode);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("kvcache gpu probe: kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    const auto prefill_expected = kvcache::reference_backend{}.prefill_exact(prefill);
    const auto decode_expected = kvcache::reference_backend{}.decode_exact(decode);
    double worst = 0.0;
    for (std::size_t i = 0; i < prefill_expected.outputs.size(); ++i)
        worst = std::fmax(worst, std::fabs(float(prefill_out[i]) - prefill_expected.outputs[i]));
    for (std::size_t i = 0; i < decode_expected.outputs.size(); ++i)
        worst = std::fmax(worst, std::fabs(float(decode_out[i]) - decode_expected.outputs[i]));
    std::printf("kvcache gpu probe: worst error %.3g against the reference (limit 1e-3, fp16 outputs)\n", worst);
    return worst <= 1e-3 ? 0 : 1;
}

}  // namespace

int main() {
    try {
        return run();
    } catch (const std::exception& e) {
        std::printf("kvcache gpu probe failed: %s\n", e.what());
        return 1;
    }
}
