// The cached attention path of a GPU backend, written once over a device
// policy: each forward pass is a step plan (its tables uploaded on the
// device's stream); per layer the new tokens' Q/K/V are converted to the
// cache's element type (half for an fp8 cache: default_activation_t) and uploaded, the backend object's append and
// prefill/decode run (append_and_attend, the same steps as the CPU path), and
// the outputs come back as float; with an eviction policy the step's scores
// come back too and the owner compacts (eviction_driver.hpp, as on the CPU path). cuda_attention.hpp gives the CUDA policy
// (device memory, a stream, cuda_backend); emulated_device below runs the same
// steps on emulated_backend over host memory, so a machine without a GPU can
// check everything but the copies (02_generate --backend emulated).
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include "kvcache/backend/emulated.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache_engine/eviction_driver.hpp"
#include "kvcache_engine/kvcache_attention.hpp"

namespace kvcache::examples {

/// attention_backend over one sequence of a kvcache owner whose memory the Device reaches.
/// Device provides buffer<T> (zeroed, sized), upload/download(destination, source, count),
/// stream() (what the plans upload on), backend() (the backend object: every backend has the
/// same members) and finish() (waits until downloads landed).
/// @tparam Cache a kvcache owner (static_cache, paged_cache, sliding_window_cache) in Device's memory
/// @tparam Device the device policy (cuda_stream_device, emulated_device)
template <class Cache, class Device>
class device_attention final : public attention_backend {
    using element = default_activation_t<typename Cache::element_type>;  // what queries, rows and outputs travel in
    using heads = typename Cache::heads;
    static_assert(Cache::memory::space == Device::space, "the owner's memory must be the device's");

public:
    explicit device_attention(Cache& cache) : cache_(cache), batch_{cache.add_sequence()} {}
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
        const int length = cache_.length(batch_[0]);
        require(length == first_position, error_code::invalid_argument, "device_attention: the cache is at position ",
                length, " but the model feeds position ", first_position);
        // Reuses the plan's device tables: the upload is ordered on the stream after the
        // previous step's kernels, which finish() waited for anyway.
        cache_.replan(plan_, batch_, {tokens}, device_.stream());
    }

    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        const std::size_t q_row = std::size_t(cache_.query_heads()) * heads::head_dim;
        const std::size_t kv_row = std::size_t(cache_.kv_heads()) * heads::head_dim;
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
        const span<const element> q_span(queries, q_count), k_span(keys, kv_count), v_span(values, kv_count);
        const span<element> o_span(outputs_.data(), q_count);
        const int rows = eviction_.wanted() ? cache_.visible_count(batch_[0], layer) : 0;
        const std::size_t score_count = std::size_t(cache_.kv_heads()) * std::size_t(rows);
        if (!eviction_.active()) {
            append_and_attend(device_.backend(), plan_, layer, q_span, k_span, v_span, o_span);
        } else {
            span<float> scores;
            if (eviction_.wanted()) {
                if (scores_.size() < score_count) scores_ = buffer<float>(score_count);
                host_scores_.assign(score_count, 0.0f);
                device_.upload(scores_.data(), host_scores_.data(), score_count);  // rows nothing saw stay 0
                scores = span<float>(scores_.data(), score_count);
            }
            append_and_attend_scored(device_.backend(), plan_, layer, q_span, k_span, v_span, o_span, scores, rows,
                                     eviction_.score_queries(tokens));
            if (eviction_.wanted()) device_.download(host_scores_.data(), scores_.data(), score_count);
        }

        results_.resize(q_count);
        device_.download(results_.data(), outputs_.data(), q_count);
        // The host needs the outputs now (the next layer's input), and the policy the scores.
        device_.finish();
        for (std::size_t i = 0; i < q_count; ++i) out[i] = to_float(results_[i]);
        if (!eviction_.active()) return;
        if (eviction_.wanted())
            eviction_.record(cache_, batch_[0], layer, span<const float>(host_scores_.data(), score_count), rows,
                             tokens > 1);
        eviction_.after_layer(cache_, batch_[0], plan_, layer, tokens > 1);
    }

    sequence_id sequence() const noexcept { return batch_[0]; }

    /// Evicts with `options` from the next pass on, as host_attention does
    /// (eviction_driver::configure; knorm only on a host-memory owner).
    void compress_with(const compression_options& options) { eviction_.configure(cache_, options); }
    /// Rows each layer of the sequence holds now.
    std::vector<int> rows_held() const { return eviction_.rows_held(cache_, batch_[0]); }
    /// Compactions run so far.
    int compactions() const noexcept { return eviction_.compactions(); }

private:
    template <class T>
    using buffer = typename Device::template buffer<T>;

    Cache& cache_;
    Device device_;
    std::vector<sequence_id> batch_;
    typename Cache::plan_type plan_;
    std::vector<element> staging_, results_;
    buffer<element> inputs_, outputs_;
    eviction_driver<Cache> eviction_;
    std::vector<float> host_scores_;
    buffer<float> scores_;
};

/// The device policy of the SIMT emulator: host memory, emulated_backend.
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
    host_memory::stream_type stream() const noexcept { return {}; }
    emulated_backend backend() const { return emulated_backend{}; }
    void finish() {}
    void wait_quietly() noexcept {}
};

/// device_attention on the emulator.
/// @tparam Cache a host-memory owner
template <class Cache>
using emulated_kvcache_attention = device_attention<Cache, emulated_device>;

/// Greedy generation through the GPU path's steps on the SIMT emulator (host
/// memory), dispatched over every layout and element type for one head
/// configuration (the emulator compiles the kernel bodies per configuration).
/// @tparam Heads the head_config the model's heads must run on (compiled equal, or dynamic)
template <class Heads>
cached_generation generate_with_kvcache_emulated(llama_model& model, const std::vector<int>& prompt, int new_tokens,
                                                 const cache_options& cache, const generation_options& options = {}) {
    using configurations = configuration_product_t<all_layouts, cache_element_choices, type_list<Heads>>;
    return dispatch(configurations{}, wanted_configuration(model, cache), [&](auto config) {
        return detail::generate_configured<decltype(config), host_memory, emulated_kvcache_attention>(
            config, model, prompt, new_tokens, cache, options);
    });
}

}  // namespace kvcache::examples
