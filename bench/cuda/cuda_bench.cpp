// The CUDA benchmarks of kvcache_bench (see cuda_bench.hpp). Plain C++ over
// kvcache/backend/cuda.hpp: nvcc compiles only the instantiations
// (kvcache_bench_cuda_kernels, bench/CMakeLists.txt), and runtime choices
// reach them through kvcache::dispatch, as the engine's runners do.
//
// Every time is CUDA events around many calls after warm-up; decode and
// append rotate over enough K/V sets that the total exceeds four times the
// L2 (rotation_sets), so no call is served from the cache the previous one filled.
#include "cuda/cuda_bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "harness/timing.hpp"
#include "kvcache/backend/cuda.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/configuration/dispatch.hpp"
#include "kvcache/core/device_memory.hpp"
#include "kvcache_bench_cuda_kernels_configurations.hpp"
#include "support/attention_counts.hpp"
#include "support/filled_cache.hpp"

namespace kvcache::bench {

namespace {

using compiled_list = kvcache::compiled::kvcache_bench_cuda_kernels;
constexpr std::size_t mib = std::size_t(1) << 20;

int device_attribute(cudaDeviceAttr attribute) {
    int device = 0, value = 0;
    KVCACHE_CUDA_CHECK(cudaGetDevice(&device));
    KVCACHE_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
    return value;
}

std::size_t free_device_bytes() {
    std::size_t free = 0, total = 0;
    KVCACHE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
}

/// Per-call seconds of `call(i)` (i counts calls, for rotation): `warmup`
/// calls, then `repeats` samples of `calls` calls each between two events.
template <class Call>
timing time_on_device(Call&& call, int warmup, int repeats, int calls) {
    cudaEvent_t start = nullptr, stop = nullptr;
    KVCACHE_CUDA_CHECK(cudaEventCreate(&start));
    KVCACHE_CUDA_CHECK(cudaEventCreate(&stop));
    int i = 0;
    for (int w = 0; w < warmup; ++w) call(i++);
    std::vector<double> seconds;
    for (int r = 0; r < repeats; ++r) {
        KVCACHE_CUDA_CHECK(cudaEventRecord(start, nullptr));
        for (int c = 0; c < calls; ++c) call(i++);
        KVCACHE_CUDA_CHECK(cudaEventRecord(stop, nullptr));
        KVCACHE_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        KVCACHE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        seconds.push_back(double(ms) / 1e3 / calls);
    }
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    return summarise(std::move(seconds));
}

/// A device buffer of `count` elements of T from seeded uniform [-1, 1)
/// floats (one 4 Mi-element block, repeated: the values only have to be finite).
template <class T>
device_buffer<T> random_device(std::size_t count, std::uint64_t seed) {
    device_buffer<T> out(count);
    const std::size_t block = std::min<std::size_t>(count, std::size_t(4) << 20);
    const std::vector<float> floats = random_floats(block, seed);
    std::vector<T> host(block);
    for (std::size_t i = 0; i < block; ++i) host[i] = from_float<T>(floats[i]);
    for (std::size_t at = 0; at < count; at += block)
        KVCACHE_CUDA_CHECK(cudaMemcpy(out.data() + at, host.data(), std::min(block, count - at) * sizeof(T),
                                      cudaMemcpyHostToDevice));
    return out;
}

/// The owner of a layout family in device memory.
template <class Layout, class Element, class Heads>
struct owner_of;
template <class Element, class Heads>
struct owner_of<contiguous_layout, Element, Heads> {
    using type = static_cache<Element, Heads, device_memory>;
    static type make(const Heads& h, int sequences, int context, int) { return type(h, 1, sequences, context); }
};
template <class Element, class Heads>
struct owner_of<paged_layout, Element, Heads> {
    using type = paged_cache<Element, Heads, device_memory>;
    static type make(const Heads& h, int sequences, int context, int) {
        return type(h, 1, sequences * ((context + bench_page_size - 1) / bench_page_size), bench_page_size, false);
    }
};
template <class Element, class Heads>
struct owner_of<sliding_window_layout, Element, Heads> {
    using type = sliding_window_cache<Element, Heads, device_memory>;
    // A window the context fills exactly (no wrap), chunks up to fill_chunk tokens.
    static type make(const Heads& h, int sequences, int context, int fill_chunk) {
        return type(h, 1, sequences, context - bench_sinks, bench_sinks, fill_chunk);
    }
};

/// One shape of the decode matrix.
struct decode_case {
    layout_kind layout;
    element_kind element;
    int query_heads, kv_heads, head_dim, batch, context;
};

/// The copy bandwidth the decode and append figures are a fraction of.
struct copy_rate {
    double gbytes_per_s = 0;  ///< median, read + written
};

/// A cache of sets x batch sequences of `context` tokens each, written by the
/// backend's append in chunks, with one attend-only plan per set of `batch`.
template <class Config>
struct rotating_cache {
    using element = typename Config::element;
    using heads = typename Config::heads;
    using query = default_activation_t<element>;
    using owner = owner_of<typename Config::layout, element, heads>;
    using cache_type = typename owner::type;

    static constexpr int fill_chunk = 512;
    cache_type cache;
    std::vector<std::vector<sequence_id>> sets;
    std::vector<typename cache_type::plan_type> plans;

    rotating_cache(const heads& h, int set_count, int batch, int context, int extra_tokens)
        : cache(owner::make(h, set_count * batch, context + extra_tokens, std::max(fill_chunk, extra_tokens))) {
        const std::size_t kv_row = std::size_t(h.kv_heads()) * heads::head_dim;
        const int chunk = std::min(fill_chunk, std::max(context, 1));
        const device_buffer<query> keys = random_device<query>(std::size_t(batch) * chunk * kv_row, 11);
        const device_buffer<query> values = random_device<query>(std::size_t(batch) * chunk * kv_row, 12);
        const cuda_backend backend;
        for (int s = 0; s < set_count; ++s) {
            std::vector<sequence_id> ids;
            for (int b = 0; b < batch; ++b) ids.push_back(cache.add_sequence());
            for (int done = 0; done < context; done += chunk) {
                const int n = std::min(chunk, context - done);
                auto plan = cache.plan(ids, std::vector<int>(ids.size(), n));
                const std::size_t rows = std::size_t(batch) * n * kv_row;
                backend.append(append_params(plan.view(0), span<const query>(keys.data(), rows),
                                             span<const query>(values.data(), rows), plan.new_token_offsets()));
                KVCACHE_CUDA_CHECK(cudaDeviceSynchronize());
            }
            sets.push_back(ids);
        }
        if (context > 0)  // empty sequences (the append case) get their plans from the caller
            for (const auto& ids : sets) plans.push_back(cache.plan(ids));
        KVCACHE_CUDA_CHECK(cudaDeviceSynchronize());
    }
};

/// K/V sets so the rotation covers at least four L2s (at most 512 sets: the
/// smallest shape of the matrix, MQA batch 1 x 1K at d128, is 512 KiB a set).
int rotation_sets(std::size_t bytes_per_set) {
    const std::size_t l2 = std::size_t(std::max(device_attribute(cudaDevAttrL2CacheSize), 1));
    const std::size_t wanted = 4 * l2;
    return int(std::clamp<std::size_t>((wanted + bytes_per_set - 1) / std::max<std::size_t>(bytes_per_set, 1), 1, 512));
}

runtime_configuration wanted_of(layout_kind layout, element_kind element, int q, int kv, int d) {
    runtime_configuration wanted;
    wanted.layout = layout;
    wanted.element = element;
    wanted.heads = head_shape{q, kv, d};
    return wanted;
}

std::string heads_text(int q, int kv, int d) {
    return std::to_string(q) + "q/" + std::to_string(kv) + "kv/d" + std::to_string(d);
}

copy_rate run_copy(const options& opts, report& out) {
    const std::size_t bytes = (opts.quick ? 512 : 2048) * mib;
    device_buffer<unsigned char> source(bytes), destination(bytes);
    KVCACHE_CUDA_CHECK(cudaMemset(source.data(), 1, bytes));
    const timing t = time_on_device(
        [&](int) {
            KVCACHE_CUDA_CHECK(cudaMemcpyAsync(destination.data(), source.data(), bytes, cudaMemcpyDeviceToDevice, nullptr));
        },
        2, opts.quick ? 5 : 9, opts.quick ? 5 : 20);
    const double moved = copy_bytes_moved(bytes);
    nlohmann::json metrics;
    add_timing(metrics, "ms_per_copy", t, 1e3);
    add_rate(metrics, "gbytes_per_s", moved / 1e9, t);
    metrics["bytes_moved"] = moved;
    out.add({"cuda_copy", {{"buffer_mib", double(bytes) / double(mib)}, {"counted", "read + written"}}, metrics});
    return {moved / t.median / 1e9};
}

void run_decode_case(const options& opts, report& out, const decode_case& c, const copy_rate& copy) {
    const runtime_configuration wanted = wanted_of(c.layout, c.element, c.query_heads, c.kv_heads, c.head_dim);
    const nlohmann::json params = {{"layout", to_string(c.layout)}, {"element", to_string(c.element)},
                                   {"batch", c.batch},           {"context", c.context},
                                   {"heads", heads_text(c.query_heads, c.kv_heads, c.head_dim)},
                                   {"query_heads", c.query_heads}, {"kv_heads", c.kv_heads},
                                   {"head_dim", c.head_dim}};
    if (!supports(compiled_list{}, wanted)) {
        std::printf("%-16s | skipped %s: not compiled (KVCACHE_CUDA_BENCH_CONFIGURATIONS)\n", "cuda_decode",
                    wanted.to_string().c_str());
        return;
    }
    const attention_shape shape{c.layout, c.element, c.batch, c.query_heads, c.kv_heads, c.head_dim, c.context,
                                bench_page_size};
    const std::size_t set_bytes = decode_kv_bytes(shape);
    const int sets = rotation_sets(set_bytes);
    if (2 * set_bytes * std::size_t(sets) > free_device_bytes()) {
        std::printf("%-16s | skipped %s batch %d context %d: %d sets of %.0f MiB exceed half the free device memory\n",
                    "cuda_decode", wanted.to_string().c_str(), c.batch, c.context, sets,
                    double(set_bytes) / double(mib));
        return;
    }
    dispatch(compiled_list{}, wanted, [&](auto config) {
        using config_t = decltype(config);
        using heads = typename config_t::heads;
        using query = default_activation_t<typename config_t::element>;
        const heads h(wanted.heads);
        rotating_cache<config_t> rotating(h, sets, c.batch, c.context, 0);
        const std::size_t q_elements = std::size_t(c.batch) * c.query_heads * c.head_dim;
        const device_buffer<query> queries = random_device<query>(q_elements, 7);
        device_buffer<query> outputs(q_elements);
        auto params_of = [&](int s) {
            return decode_params(rotating.plans[std::size_t(s)].view(0), span<const query>(queries.data(), q_elements),
                                 span<query>(outputs.data(), q_elements));
        };
        std::size_t workspace_floats = 0;
        for (int s = 0; s < sets; ++s) workspace_floats = std::max(workspace_floats, cuda_backend{}.workspace_floats(params_of(s)));
        device_buffer<float> workspace(std::max<std::size_t>(workspace_floats, 1));
        const cuda_backend backend(nullptr, span<float>(workspace.data(), workspace_floats));
        const int calls = std::max(sets, opts.quick ? 10 : 50);
        const timing t = time_on_device([&](int i) { backend.decode(params_of(i % sets)); }, std::max(sets, 3),
                                        opts.quick ? 5 : 9, calls);
        const double bytes = double(decode_bytes(shape));
        nlohmann::json metrics;
        add_timing(metrics, "ms_per_call", t, 1e3);
        add_rate(metrics, "gbytes_per_s", bytes / 1e9, t);
        metrics["fraction_of_copy_bandwidth"] = bytes / t.median / 1e9 / copy.gbytes_per_s;
        // The CPU bench's name for the same fraction, so plot.py and the JSON check read both.
        metrics["fraction_of_measured_bandwidth"] = metrics["fraction_of_copy_bandwidth"];
        metrics["copy_gbytes_per_s"] = copy.gbytes_per_s;
        metrics["bytes_per_call"] = bytes;
        metrics["rotation_sets"] = sets;
        metrics["compiled_heads"] = bool(heads::static_counts);
        metrics["runs"] = t.runs;
        out.add({"cuda_decode", params, metrics});
    });
}

void run_append_case(const options& opts, report& out, element_kind element, int batch, int tokens,
                     const copy_rate& copy) {
    const runtime_configuration wanted = wanted_of(layout_kind::paged, element, 32, 8, 128);
    if (!supports(compiled_list{}, wanted)) return;
    const attention_shape shape{layout_kind::paged, element, batch, 32, 8, 128, 0, bench_page_size};
    const std::size_t set_bytes = append_bytes(shape, tokens);
    const int sets = rotation_sets(set_bytes);
    dispatch(compiled_list{}, wanted, [&](auto config) {
        using config_t = decltype(config);
        using heads = typename config_t::heads;
        using query = default_activation_t<typename config_t::element>;
        const heads h(wanted.heads);
        rotating_cache<config_t> rotating(h, sets, batch, 0, tokens);
        std::vector<typename rotating_cache<config_t>::cache_type::plan_type> plans;
        for (const auto& ids : rotating.sets) plans.push_back(rotating.cache.plan(ids, std::vector<int>(ids.size(), tokens)));
        const std::size_t rows = std::size_t(batch) * tokens * h.kv_heads() * heads::head_dim;
        const device_buffer<query> keys = random_device<query>(rows * std::size_t(sets), 21);
        const device_buffer<query> values = random_device<query>(rows * std::size_t(sets), 22);
        const cuda_backend backend;
        // Each call rewrites the rows its set's plan reserved: the same positions every time.
        const timing t = time_on_device(
            [&](int i) {
                const std::size_t s = std::size_t(i % sets);
                backend.append(append_params(plans[s].view(0), span<const query>(keys.data() + s * rows, rows),
                                             span<const query>(values.data() + s * rows, rows),
                                             plans[s].new_token_offsets()));
            },
            std::max(sets, 3), opts.quick ? 5 : 9, std::max(sets, opts.quick ? 10 : 50));
        const double bytes = double(set_bytes);
        nlohmann::json metrics;
        add_timing(metrics, "ms_per_call", t, 1e3);
        add_rate(metrics, "gbytes_per_s", bytes / 1e9, t);
        metrics["fraction_of_copy_bandwidth"] = bytes / t.median / 1e9 / copy.gbytes_per_s;
        metrics["bytes_per_call"] = bytes;
        metrics["rotation_sets"] = sets;
        metrics["runs"] = t.runs;
        out.add({"cuda_append",
                 {{"layout", "paged"}, {"element", to_string(element)}, {"batch", batch}, {"tokens", tokens},
                  {"heads", heads_text(32, 8, 128)}},
                 metrics});
    });
}

/// A tensor-core estimate of the chip's dense fp16 rate (no cuBLAS): FLOPs
/// per clock per multiprocessor by architecture, times SMs and peak clock;
/// 0 where the architecture is not in the table.
double estimated_peak_flops() {
    const int major = device_attribute(cudaDevAttrComputeCapabilityMajor);
    const int minor = device_attribute(cudaDevAttrComputeCapabilityMinor);
    double per_sm_clock = 0;
    if (major == 9 && minor == 0) per_sm_clock = 4096;       // Hopper: 1024 dense fp16 FMA per SM per clock
    else if (major == 8 && minor == 0) per_sm_clock = 2048;  // A100
    else if (major == 8) per_sm_clock = 1024;                // sm_86/sm_89
    return per_sm_clock * device_attribute(cudaDevAttrMultiProcessorCount) *
           double(device_attribute(cudaDevAttrClockRate)) * 1e3;
}

void run_prefill_case(const options& opts, report& out, element_kind element, int prefix, int chunk) {
    const runtime_configuration wanted = wanted_of(layout_kind::paged, element, 32, 8, 128);
    if (!supports(compiled_list{}, wanted)) return;
    dispatch(compiled_list{}, wanted, [&](auto config) {
        using config_t = decltype(config);
        using heads = typename config_t::heads;
        using query = default_activation_t<typename config_t::element>;
        const heads h(wanted.heads);
        rotating_cache<config_t> rotating(h, 1, 1, prefix, chunk);
        auto plan = rotating.cache.plan(rotating.sets[0], {chunk});
        const std::size_t kv_rows = std::size_t(chunk) * h.kv_heads() * heads::head_dim;
        const std::size_t q_rows = std::size_t(chunk) * h.query_heads() * heads::head_dim;
        const device_buffer<query> keys = random_device<query>(kv_rows, 31), values = random_device<query>(kv_rows, 32);
        const device_buffer<query> queries = random_device<query>(q_rows, 33);
        device_buffer<query> outputs(q_rows);
        const cuda_backend backend;
        backend.append(append_params(plan.view(0), span<const query>(keys.data(), kv_rows),
                                     span<const query>(values.data(), kv_rows), plan.new_token_offsets()));
        // Prefill is bound by arithmetic, not memory: one K/V set, no rotation.
        const timing t = time_on_device(
            [&](int) {
                backend.prefill(prefill_params(plan.view(0), span<const query>(queries.data(), q_rows),
                                               plan.new_token_offsets(), span<query>(outputs.data(), q_rows)));
            },
            3, opts.quick ? 5 : 9, opts.quick ? 3 : 10);
        const double flops = prefill_flops(1, 32, 128, prefix, chunk);
        const double peak = estimated_peak_flops();
        nlohmann::json metrics;
        add_timing(metrics, "ms_per_chunk", t, 1e3);
        add_rate(metrics, "tokens_per_s", chunk, t);
        add_rate(metrics, "gflop_per_s", flops / 1e9, t);
        metrics["estimated_peak_tflop_per_s"] = peak / 1e12;
        if (peak > 0) metrics["fraction_of_estimated_peak"] = flops / t.median / peak;
        metrics["runs"] = t.runs;
        out.add({"cuda_prefill",
                 {{"layout", "paged"}, {"element", to_string(element)}, {"chunk", chunk}, {"prefix", prefix},
                  {"batch", 1}, {"heads", heads_text(32, 8, 128)}},
                 metrics});
    });
}

}  // namespace

nlohmann::json describe_device() {
    int device = 0, driver = 0, runtime = 0;
    KVCACHE_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    KVCACHE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    KVCACHE_CUDA_CHECK(cudaDriverGetVersion(&driver));
    KVCACHE_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    nlohmann::json d;
    d["name"] = prop.name;
    d["compute_capability"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    d["multiprocessors"] = prop.multiProcessorCount;
    d["memory_gib"] = double(prop.totalGlobalMem) / double(1024 * mib);
    d["l2_mib"] = double(prop.l2CacheSize) / double(mib);
    d["driver_version"] = driver;
    d["runtime_version"] = runtime;
    // Peak clocks as the runtime reports them (current clocks need NVML:
    // scripts/gpu-check logs nvidia-smi's before and after the bench).
    d["clocks"] = {{"sm_peak_mhz", device_attribute(cudaDevAttrClockRate) / 1000},
                   {"memory_peak_mhz", device_attribute(cudaDevAttrMemoryClockRate) / 1000}};
    return d;
}

void run_cuda_benchmarks(const options& opts, report& out) {
    out.machine()["device"] = describe_device();
    out.machine()["gpu"] = out.machine()["device"]["name"];
    out.machine()["device"]["clocks_before"] = out.machine()["device"]["clocks"];
    out.machine()["device"]["compiled_configurations"] = describe(compiled_list{});
    std::printf("device: %s\n", out.machine()["device"].dump().c_str());
    const copy_rate copy = run_copy(opts, out);

    if (opts.wants("cuda_decode")) {
        struct heads_shape {
            int q, kv, d;
        };
        const std::vector<heads_shape> shapes = {{32, 8, 128}, {32, 32, 128}, {32, 1, 128}, {32, 8, 64}};
        const std::vector<int> batches = opts.quick ? std::vector<int>{1, 64} : std::vector<int>{1, 8, 64};
        const std::vector<int> contexts =
            opts.quick ? std::vector<int>{1024, 8192} : std::vector<int>{1024, 4096, 8192, 16384, 32768};
        // The full matrix of shapes for paged fp16 (the targets' layout and type);
        // every other compiled layout and type on the flagship shape.
        for (const auto& s : shapes)
            for (int batch : batches)
                for (int context : contexts)
                    run_decode_case(opts, out, {layout_kind::paged, element_kind::fp16, s.q, s.kv, s.d, batch, context},
                                    copy);
        for (layout_kind layout : {layout_kind::contiguous, layout_kind::paged, layout_kind::sliding_window})
            for (element_kind element : {element_kind::fp32, element_kind::fp16, element_kind::bf16,
                                         element_kind::fp8_e4m3, element_kind::fp8_e5m2}) {
                if (layout == layout_kind::paged && element == element_kind::fp16) continue;  // above
                for (int batch : opts.quick ? std::vector<int>{64} : std::vector<int>{1, 64})
                    run_decode_case(opts, out, {layout, element, 32, 8, 128, batch, 8192}, copy);
            }
    }
    if (opts.wants("cuda_append"))
        for (element_kind element : {element_kind::fp16, element_kind::fp8_e4m3})
            for (int tokens : {1, 512}) run_append_case(opts, out, element, 64, tokens, copy);
    if (opts.wants("cuda_prefill")) {
        const int prefix = opts.quick ? 1024 : 4096;
        const std::vector<int> chunks = opts.quick ? std::vector<int>{512, 2048} : std::vector<int>{512, 1024, 2048, 4096};
        for (int chunk : chunks) run_prefill_case(opts, out, element_kind::fp16, prefix, chunk);
    }
    out.machine()["device"]["clocks_after"] = describe_device()["clocks"];
}

}  // namespace kvcache::bench
