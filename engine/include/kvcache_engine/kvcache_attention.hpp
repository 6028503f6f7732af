// The cached attention path: the model's K/V go into a kvcache owner
// (contiguous, paged or sliding window) and attention reads them back, on a
// backend object (cpu_backend here; device_attention.hpp runs the emulated
// and CUDA backends through the same steps). Each forward pass is one step
// plan: begin_tokens plans the new tokens (reserving them in every layer),
// and every layer's append and prefill/decode go through the plan's view.
// Layers the model itself windows (Mistral; some Qwen2 layers) go into a
// separate sliding-window owner holding only the window.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/cache/step_plan.hpp"
#include "kvcache/configuration/dispatch.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/policy/key_norms.hpp"
#include "kvcache_engine/attention_backend.hpp"
#include "kvcache_engine/compression.hpp"
#include "kvcache_engine/eviction_driver.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace kvcache::examples {

/// One layer's attention step of a plan on any backend object: appends the
/// plan's new tokens' K/V rows through the layer's view, then decodes (one
/// new token per sequence) or prefills. Buffers are where the backend reads
/// them (host for cpu and emulated, device for cuda).
/// @tparam Backend cpu_backend, emulated_backend or cuda_backend (or reference_backend)
/// @tparam Plan a step_plan
/// @tparam Input the rows' element type (float, kvcache::half or kvcache::bfloat16)
template <class Backend, class Plan, class Input>
void append_and_attend(const Backend& backend, const Plan& plan, int layer, span<const Input> queries,
                       span<const Input> keys, span<const Input> values, span<Input> outputs) {
    const auto view = plan.view(layer);
    backend.append(append_params(view, keys, values, plan.new_token_offsets()));
    bool one_each = true;
    for (int b = 0; b < plan.size(); ++b) one_each = one_each && plan.new_tokens(b) == 1;
    if (one_each)
        backend.decode(decode_params(view, queries, outputs));
    else
        backend.prefill(prefill_params(view, queries, plan.new_token_offsets(), outputs));
}

/// append_and_attend of a plan of one sequence that also writes the step's
/// attention per visible row into scores ([kv_heads][stride], where the
/// backend writes; empty: none), a prefill's from its last score_queries queries.
/// @tparam Backend cpu_backend, emulated_backend or cuda_backend (or reference_backend)
/// @tparam Plan a step_plan
/// @tparam Input the rows' element type
template <class Backend, class Plan, class Input>
void append_and_attend_scored(const Backend& backend, const Plan& plan, int layer, span<const Input> queries,
                              span<const Input> keys, span<const Input> values, span<Input> outputs,
                              span<float> scores, int stride, int score_queries) {
    const auto view = plan.view(layer);
    backend.append(append_params(view, keys, values, plan.new_token_offsets()));
    if (plan.new_tokens(0) == 1) {
        decode_params call(view, queries, outputs);
        call.scores = scores;
        call.score_stride = stride;
        backend.decode(call);
    } else {
        prefill_params call(view, queries, plan.new_token_offsets(), outputs);
        call.scores = scores;
        call.score_stride = stride;
        call.score_queries = score_queries;
        backend.prefill(call);
    }
}

/// attention_backend over one sequence of a host-memory kvcache owner on a
/// host backend object: float rows go in as they are. With a compression
/// policy (compress_with; any owner with compact()) each step also asks the kernels for
/// the scores the policy needs, and at the end of a pass that the schedule
/// says is due (compression.hpp) every layer over its budget keeps the rows
/// select_rows chooses, through the owner's compact().
/// @tparam Cache a kvcache owner (static_cache, paged_cache, sliding_window_cache) in host memory
/// @tparam Backend cpu_backend (or reference_backend)
template <class Cache, class Backend>
class host_attention final : public attention_backend {
    using heads = typename Cache::heads;

public:
    explicit host_attention(Cache& cache, Backend backend = {})
        : cache_(cache), backend_(backend), batch_{cache.add_sequence()} {}
    ~host_attention() override {
        try {
            cache_.remove_sequence(batch_[0]);
        } catch (...) {  // a destructor must not throw; the cache is going away with the example anyway
        }
    }
    host_attention(const host_attention&) = delete;
    host_attention& operator=(const host_attention&) = delete;

    /// Evicts with `options` from the next pass on (eviction_driver::configure:
    /// any owner with compact(); the pool trigger on a paged one). Throws the
    /// library's errors for a bad budget, ratio or window before anything changes.
    void compress_with(const compression_options& options) { eviction_.configure(cache_, options); }

    void begin_tokens(int first_position, int tokens) override {
        const int length = cache_.length(batch_[0]);
        require(length == first_position, error_code::invalid_argument, "kvcache_attention: the cache is at position ",
                length, " but the model feeds position ", first_position);
        cache_.replan(plan_, batch_, {tokens});  // reuses the plan's buffers step after step
        prefill_ = tokens > 1;
    }

    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        const std::size_t q_count = std::size_t(tokens) * cache_.query_heads() * heads::head_dim;
        const std::size_t kv_count = std::size_t(tokens) * cache_.kv_heads() * heads::head_dim;
        const span<const float> queries(q, q_count), keys(k, kv_count), values(v, kv_count);
        if (!eviction_.active()) {
            append_and_attend(backend_, plan_, layer, queries, keys, values, span<float>(out, q_count));
            return;
        }
        attend_scored(layer, queries, keys, values, span<float>(out, q_count));
        eviction_.after_layer(cache_, batch_[0], plan_, layer, prefill_);
    }

    sequence_id sequence() const noexcept { return batch_[0]; }

    /// Rows each layer of the sequence holds now (a compacted layer fewer than its length).
    std::vector<int> rows_held() const { return eviction_.rows_held(cache_, batch_[0]); }
    /// Compactions run so far.
    int compactions() const noexcept { return eviction_.compactions(); }

private:
    // append_and_attend, with the step's scores recorded when the policy needs them.
    void attend_scored(int layer, span<const float> queries, span<const float> keys, span<const float> values,
                       span<float> outputs) {
        const int rows = cache_.visible_count(batch_[0], layer);
        span<float> scores;
        if (eviction_.wanted()) {
            step_scores_.assign(std::size_t(cache_.kv_heads()) * std::size_t(rows), 0.0f);
            scores = span<float>(step_scores_.data(), step_scores_.size());
        }
        append_and_attend_scored(backend_, plan_, layer, queries, keys, values, outputs, scores, rows,
                                 eviction_.score_queries(plan_.new_tokens(0)));
        if (eviction_.wanted())
            eviction_.record(cache_, batch_[0], layer, span<const float>(step_scores_.data(), step_scores_.size()),
                             rows, prefill_);
    }

    Cache& cache_;
    Backend backend_;
    std::vector<sequence_id> batch_;
    typename Cache::plan_type plan_;
    bool prefill_ = false;
    eviction_driver<Cache> eviction_;
    std::vector<float> step_scores_;
};

/// The CPU cached path's attention_backend.
/// @tparam Cache a host-memory kvcache owner
template <class Cache>
using kvcache_attention = host_attention<Cache, cpu_backend>;

/// attention_backend that hands each layer to one of several backends under that backend's own
/// layer number, so the layers of one model can live in owners of different layouts.
class layer_router final : public attention_backend {
public:
    /// route[l]: the backend of model layer l and the layer's number in it.
    explicit layer_router(std::vector<std::pair<attention_backend*, int>> route) : route_(std::move(route)) {
        for (const auto& r : route_)
            if (std::find(backends_.begin(), backends_.end(), r.first) == backends_.end()) backends_.push_back(r.first);
    }

    void begin_tokens(int first_position, int tokens) override {
        for (attention_backend* b : backends_) b->begin_tokens(first_position, tokens);
    }

    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        const auto& r = route_.at(static_cast<std::size_t>(layer));
        r.first->attend(r.second, q, k, v, tokens, out);
    }

private:
    std::vector<std::pair<attention_backend*, int>> route_;
    std::vector<attention_backend*> backends_;
};

/// Which cache the cached path uses for the layers the model does not window.
struct cache_options {
    layout_kind layout = layout_kind::paged;
    kv_kinds element = element_kind::fp32;  ///< what keys and values are stored as (a kind each for a K/V pair)
    int page_size = 16;      ///< paged
    int window = 256;        ///< sliding window: recent keys a query sees
    int sinks = 4;           ///< sliding window: first positions kept forever
    int prefill_chunk = 64;  ///< sliding window, and models with windowed layers: the prompt goes in chunks of this many tokens
    compression_options compression;  ///< key-token selection (every layout; CPU and emulated paths); none by default

    /// The visibility rule the cache applies, for the recompute path to match.
    attention_visibility visibility() const noexcept {
        return layout == layout_kind::sliding_window ? attention_visibility{window, sinks} : attention_visibility{};
    }
};

/// Cached greedy generation and the cache's memory figures.
struct cached_generation {
    generation_trace trace;
    std::size_t bytes_reserved = 0;  ///< cache memory allocated
    std::size_t bytes_used = 0;      ///< cache memory the sequence held at the end (bytes_used_of: paged its pages, the others their rows)
    std::vector<int> rows_held;      ///< per layer, the rows the sequence held at the end (attention classes with compress_with)
    int compactions = 0;             ///< compactions the policy ran
};

/// A cached generation path compiled for one head shape (CPU or CUDA).
using cached_runner = cached_generation (*)(llama_model&, const std::vector<int>&, int, const cache_options&,
                                            const generation_options&);

namespace detail {

template <class Attention, class = void>
struct has_compress_with : std::false_type {};
template <class Attention>
struct has_compress_with<Attention, std::void_t<decltype(std::declval<Attention&>().compress_with(compression_options{}))>>
    : std::true_type {};

// Applies the cache options' policy where the attention backend can (host and device attention); elsewhere a
// policy is refused by name.
template <class Attention>
void apply_compression(Attention& attention, const compression_options& compression) {
    if constexpr (has_compress_with<Attention>::value)
        attention.compress_with(compression);
    else
        require(!compression.active(), error_code::unsupported_configuration, "eviction policy ",
                to_string(compression.policy), " runs on the CPU backend only");
}

template <template <class> class Attention, class Cache>
cached_generation generate_in(Cache& cache, llama_model& model, const std::vector<int>& prompt, int new_tokens,
                              generation_options options, const compression_options& compression = {}) {
    cached_generation result;
    {
        Attention<Cache> attention(cache);
        apply_compression(attention, compression);
        result.trace = generate(model, prompt, new_tokens, attention, generation_mode::cached, options);
        if constexpr (has_compress_with<Attention<Cache>>::value) {
            result.rows_held = attention.rows_held();
            result.compactions = attention.compactions();
        }
        result.bytes_used = examples::bytes_used_of(cache);  // before the sequence goes with the attention
    }
    result.bytes_reserved = cache.bytes_reserved();
    return result;
}

// The owner of `layers` layers in the dispatched layout, handed to f(owner); returns what f returns.
template <class Element, class Heads, class Memory, class F>
auto with_owner(contiguous_layout, const Heads& heads, const cache_options&, int layers, int total, F&& f) {
    static_cache<Element, Heads, Memory> owner(heads, layers, 1, total);
    return f(owner);
}
template <class Element, class Heads, class Memory, class F>
auto with_owner(paged_layout, const Heads& heads, const cache_options& cache, int layers, int total, F&& f) {
    require(cache.page_size > 0, error_code::invalid_argument, "page size ", cache.page_size, " must be positive");
    paged_cache<Element, Heads, Memory> owner(heads, layers, (total + cache.page_size - 1) / cache.page_size,
                                              cache.page_size, false);
    return f(owner);
}
template <class Element, class Heads, class Memory, class F>
auto with_owner(sliding_window_layout, const Heads& heads, const cache_options& cache, int layers, int,
                             F&& f) {
    sliding_window_cache<Element, Heads, Memory> owner(heads, layers, 1, cache.window, cache.sinks, cache.prefill_chunk);
    return f(owner);
}

// An fp8 owner takes the model's per-layer scales: owner layer i holds model layer layers[i]. A K/V
// pair with one fp8 side takes that side's scale (the other side stores values as they are).
template <class Owner>
void set_cache_scales(Owner& owner, const model_config& config, const std::vector<int>& layers) {
    using element = typename Owner::element_type;
    if constexpr (has_scaled_side_v<element>)
        for (std::size_t i = 0; i < layers.size(); ++i) {
            kv_scales s = config.scales_of(layers[i]);
            if constexpr (!is_scaled_element_v<key_element_t<element>>) s.key = 1.0f;
            if constexpr (!is_scaled_element_v<value_element_t<element>>) s.value = 1.0f;
            owner.set_scales(static_cast<int>(i), s);
        }
}

// Memory and Attention let the CUDA path (cuda_attention.hpp) reuse the owner set-up with
// device-memory owners and its own attention_backend.
// Layers the model windows always go into a sliding-window owner with the model's window and no
// sinks: that is their attention, and it needs memory for the window alone. The other layers go
// into the layout the options choose.
template <class Configuration, class Memory = host_memory, template <class> class Attention = kvcache_attention>
cached_generation generate_configured(const Configuration& config, llama_model& model, const std::vector<int>& prompt,
                                      int new_tokens, const cache_options& cache, generation_options options) {
    using Element = typename Configuration::element;
    using Heads = typename Configuration::heads;
    using Layout = typename Configuration::layout;
    const Heads& heads = config.head_counts();
    const model_config& c = model.config();
    const int total = static_cast<int>(prompt.size()) + new_tokens;
    std::vector<int> full, windowed;
    int window = 0;
    for (int l = 0; l < c.num_layers; ++l) {
        const int w = c.window_of(l);
        if (w == 0) {
            full.push_back(l);
            continue;
        }
        require(window == 0 || window == w, error_code::unsupported_configuration, "layer ", l, " has window ", w,
                " but an earlier layer has ", window, "; the cached path holds one model window");
        window = w;
        windowed.push_back(l);
    }
    if (cache.layout == layout_kind::sliding_window || !windowed.empty()) options.prefill_chunk = cache.prefill_chunk;
    require(!cache.compression.active() || windowed.empty(), error_code::unsupported_configuration, "eviction policy ",
            to_string(cache.compression.policy), " needs a model without windowed layers (this one windows ",
            windowed.size(), " of ", c.num_layers, ")");
    if (windowed.empty())
        return with_owner<Element, Heads, Memory>(Layout{}, heads, cache, c.num_layers, total, [&](auto& owner) {
            set_cache_scales(owner, c, full);
            return generate_in<Attention>(owner, model, prompt, new_tokens, options, cache.compression);
        });
    using window_owner = sliding_window_cache<Element, Heads, Memory>;
    window_owner windows(heads, static_cast<int>(windowed.size()), 1, window, 0, cache.prefill_chunk);
    set_cache_scales(windows, c, windowed);
    if (full.empty()) return generate_in<Attention>(windows, model, prompt, new_tokens, options);
    return with_owner<Element, Heads, Memory>(Layout{}, heads, cache, static_cast<int>(full.size()), total, [&](auto& owner) {
        using full_owner = std::decay_t<decltype(owner)>;
        set_cache_scales(owner, c, full);
        cached_generation result;
        {
            Attention<full_owner> full_attention(owner);
            Attention<window_owner> window_attention(windows);
            std::vector<std::pair<attention_backend*, int>> route(static_cast<std::size_t>(c.num_layers));
            for (std::size_t i = 0; i < full.size(); ++i) route[full[i]] = {&full_attention, static_cast<int>(i)};
            for (std::size_t i = 0; i < windowed.size(); ++i) route[windowed[i]] = {&window_attention, static_cast<int>(i)};
            layer_router router(std::move(route));
            result.trace = generate(model, prompt, new_tokens, router, generation_mode::cached, options);
        }
        result.bytes_reserved = owner.bytes_reserved() + windows.bytes_reserved();
        return result;
    });
}

}  // namespace detail

/// The configurations the cached CPU path is compiled for: the flagship's and
/// the test checkpoints' head shapes at full speed, and through dynamic head
/// counts every shape of the usual head dimensions (kvcache::dynamic_head_dims,
/// and 16 and 32 for small test models), fp8, int8 and int4 caches included;
/// the K/V pairs of kvcache::kv_element_pairs for head dimensions 16, 32, 64
/// and 128 (each configuration instantiates the whole cached path: the pairs
/// are kept to the dimensions the examples and the usual checkpoints have).
/// Any checkpoint of those dimensions runs.
using engine_configurations =
    concat_t<configuration_product_t<all_layouts, all_elements, type_list<head_config<8, 2, 32>, head_config<4, 2, 16>>>,
             configuration_product_t<all_layouts, cache_elements,
                                     concat_t<type_list<dynamic_heads<16>, dynamic_heads<32>>, dynamic_head_dims>>,
             configuration_product_t<all_layouts, kv_element_pairs,
                                     type_list<dynamic_heads<16>, dynamic_heads<32>, dynamic_heads<64>, dynamic_heads<128>>>>;

/// Every layout and element type (fp8, int8, int4 and the K/V pairs of
/// kvcache::kv_element_pairs included) for one head configuration: the list a
/// program that runs one known model shape dispatches over (each configuration
/// instantiates the whole cached path, so short lists compile fast).
/// @tparam Heads a head_config
template <class Heads>
using configurations_for = configuration_product_t<all_layouts, cache_element_choices, type_list<Heads>>;

/// The runtime configuration the cached path asks the dispatcher for.
inline runtime_configuration wanted_configuration_of(const model_config& config, const cache_options& cache) {
    return {cache.layout, cache.element, config.heads()};
}
/// The same for a loaded model.
inline runtime_configuration wanted_configuration(const llama_model& model, const cache_options& cache) {
    return wanted_configuration_of(model.config(), cache);
}

/// Greedy generation with the K/V in a kvcache owner of the layout and element
/// type chosen at run time and the model's head shape, through kvcache::dispatch
/// over Configurations (compiled head counts first, then dynamic ones).
/// Throws unsupported_configuration listing what is compiled when none runs it.
/// @tparam Configurations a type_list of kvcache::configuration
template <class Configurations = engine_configurations>
cached_generation generate_with_kvcache(llama_model& model, const std::vector<int>& prompt, int new_tokens,
                                        const cache_options& cache, const generation_options& options = {}) {
    return dispatch(Configurations{}, wanted_configuration(model, cache), [&](auto config) {
        return detail::generate_configured(config, model, prompt, new_tokens, cache, options);
    });
}

}  // namespace kvcache::examples
