// The cached attention path of a GPU backend, written once over a device
// policy: per layer the new tokens' Q/K/V are converted to the cache's
// element type and uploaded, the backend's append and prefill/decode
// attention run, and the outputs come back as float. cuda_attention.hpp
// gives the CUDA policy (device memory, a stream); emulated_device below runs
// the same steps on kvcache's SIMT emulator over host memory, so a machine
// without a GPU can check everything but the copies (02_generate --backend emulated).
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include "common/kvcache_attention.hpp"
#include "kvcache/backend/emulated.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/memory.hpp"

namespace kvcache::examples {

/// attention_backend over one sequence of a kvcache owner whose memory the Device reaches.
/// Device provides buffer<T> (zeroed, sized), upload/download(destination, source, count),
/// append/decode/prefill (the backend's entry points, over spans) and finish() (waits until downloads landed).
/// @tparam Cache a kvcache owner (static_cache, paged_cache, sliding_window_cache) in Device's memory
/// @tparam Device the device policy (cuda_stream_device, emulated_device)
template <class Cache, class Device>
class device_attention final : public attention_backend {
    using element = typename Cache::element_type;
    using heads = typename Cache::heads;
    static_assert(Cache::memory::space == Device::space, "the owner's memory must be the device's");

public:
    explicit device_attention(Cache& cache) : cache_(cache), batch_{cache.add_sequence()}, offsets_(2) {}
    // device_ is made before batch_: a device that cannot start leaves no sequence behind.
    ~device_attention() override {
        device_.wait_quietly();  // no kernel may still read the buffers freed after this
        try {
            cache_.remove_sequence(batch_[0]);
        } catch (...) {  // a destructor must not throw; the cache is going away with the example anyway
        }
    }
    device_attention(const device_attention&) = delete;
    device_attention& operator=(const device_attention&) = delete;

    void begin_tokens(int first_position, int tokens) override {
        int first = cache_.begin_append(batch_[0], tokens);
        require(first == first_position, error_code::invalid_argument, "device_attention: the cache is at position ",
                first, " but the model feeds position ", first_position);
    }

    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        constexpr std::size_t q_row = std::size_t(heads::query_heads) * heads::head_dim;
        constexpr std::size_t kv_row = std::size_t(heads::kv_heads) * heads::head_dim;
        const std::size_t q_count = std::size_t(tokens) * q_row, kv_count = std::size_t(tokens) * kv_row;
        // One upload per layer: [queries | keys | values] in the cache's element type.
        const std::size_t upload = q_count + 2 * kv_count;
        staging_.resize(upload);
        for (std::size_t i = 0; i < q_count; ++i) staging_[i] = from_float<element>(q[i]);
        for (std::size_t i = 0; i < kv_count; ++i) staging_[q_count + i] = from_float<element>(k[i]);
        for (std::size_t i = 0; i < kv_count; ++i) staging_[q_count + kv_count + i] = from_float<element>(v[i]);
        if (inputs_.size() < upload) inputs_ = buffer<element>(upload);
        if (outputs_.size() < q_count) outputs_ = buffer<element>(q_count);
        element* queries = inputs_.data();
        element* keys = queries + q_count;
        element* values = keys + kv_count;
        device_.upload(queries, staging_.data(), upload);
        const int offsets[2] = {0, tokens};  // one sequence: its new tokens are rows [0, tokens) of the arrays
        device_.upload(offsets_.data(), offsets, 2);

        auto view = cache_.view(layer, batch_);
        const span<const element> query_rows(queries, q_count);
        const span<element> output_rows(outputs_.data(), q_count);
        const span<const int> offsets_rows(offsets_.data(), 2);
        device_.append(view, span<const element>(keys, kv_count), span<const element>(values, kv_count), offsets_rows);
        if (tokens == 1)
            device_.decode(view, query_rows, output_rows);
        else
            device_.prefill(view, query_rows, offsets_rows, output_rows);

        results_.resize(q_count);
        device_.download(results_.data(), outputs_.data(), q_count);
        // The host needs the outputs now (the next layer's input), and the owner's next
        // table upload must not overwrite a table a kernel still reads.
        device_.finish();
        for (std::size_t i = 0; i < q_count; ++i) out[i] = to_float(results_[i]);
    }

private:
    template <class T>
    using buffer = typename Device::template buffer<T>;

    Cache& cache_;
    Device device_;
    std::vector<sequence_id> batch_;
    std::vector<element> staging_, results_;
    buffer<element> inputs_, outputs_;
    buffer<int> offsets_;
};

/// The device policy of the SIMT emulator: host memory, kvcache::emulated's kernels.
struct emulated_device {
    static constexpr memory_space space = memory_space::host;
    /// @tparam T element type
    template <class T>
    using buffer = host_buffer<T>;

    template <class T>
    void upload(T* destination, const T* source, std::size_t count) {
        std::memcpy(destination, source, count * sizeof(T));
    }
    template <class T>
    void download(T* destination, const T* source, std::size_t count) {
        std::memcpy(destination, source, count * sizeof(T));
    }
    template <class View, class Element>
    void append(const View& view, span<const Element> keys, span<const Element> values, span<const int> offsets) {
        kvcache::emulated::append(view, keys, values, offsets);
    }
    template <class View, class Element>
    void decode(const View& view, span<const Element> queries, span<Element> outputs) {
        kvcache::emulated::decode_attention(view, queries, outputs);
    }
    template <class View, class Element>
    void prefill(const View& view, span<const Element> queries, span<const int> offsets, span<Element> outputs) {
        kvcache::emulated::prefill_attention(view, queries, offsets, outputs);
    }
    void finish() {}
    void wait_quietly() noexcept {}
};

/// device_attention on the emulator.
/// @tparam Cache a host-memory owner
template <class Cache>
using emulated_kvcache_attention = device_attention<Cache, emulated_device>;

/// Greedy generation through the GPU path's steps on the SIMT emulator (host memory).
/// @tparam Heads the head_config matching model.config() (checked)
template <class Heads>
cached_generation generate_with_kvcache_emulated(llama_model& model, const std::vector<int>& prompt, int new_tokens,
                                                 const cache_options& cache, const generation_options& options = {}) {
    require(model.config().heads() == shape_of<Heads>(), error_code::invalid_argument, "model heads ",
            model.config().heads().to_string(), " do not match the compiled head_config ", shape_of<Heads>().to_string());
    if (cache.element == element_kind::fp16)
        return detail::generate_with_element<half, Heads, host_memory, emulated_kvcache_attention>(model, prompt,
                                                                                                 new_tokens, cache, options);
    return detail::generate_with_element<float, Heads, host_memory, emulated_kvcache_attention>(model, prompt, new_tokens,
                                                                                              cache, options);
}

}  // namespace kvcache::examples
