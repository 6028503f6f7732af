// 06_llama: run a Hugging Face Llama-family checkpoint (Llama, Mistral,
// Qwen2 shapes) from a folder with kvcache: greedy generation from token ids,
// cached or recomputed (--no-cache), or both compared (--compare).
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/progress_line.hpp"
#include "common/run_main.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/checkpoint_loader.hpp"
#include "kvcache_engine/compression.hpp"
#include "kvcache_engine/compute_backend.hpp"
#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/timing.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace ex = kvcache::examples;

namespace {

const char* usage = R"(usage: 06_llama --model DIR [options]

Loads a Hugging Face Llama-family checkpoint (config.json + *.safetensors,
sharded through model.safetensors.index.json when present; model_type llama,
mistral or qwen2; F32, F16 or BF16 weights) and generates greedily from token
ids with kvcache's CPU backend, or its CUDA backend where a GPU is and the
head shape is compiled for it. Nothing is downloaded: bring the folder.

options:
  --model DIR            checkpoint folder (required)
  --prompt-ids 1,2,3     prompt token ids (default 1)
  --max-new-tokens N     tokens to generate (default 16)
  --no-cache             recompute every step over the whole sequence instead of using kvcache
  --compare              run both ways and report whether the ids are identical
  --backend KIND         auto | cpu | cuda: where the cached path runs (default auto: cuda when this
                         build has CUDA, a device is present and the heads are compiled for it)
  --layout KIND          contiguous | paged | sliding_window (default paged): the cache of the layers
                         with full attention; layers the config windows (Mistral's sliding_window,
                         Qwen2's layer_types / max_window_layers) always go into a sliding-window
                         cache of the config's window, without sinks
  --dtype TYPE           fp32 | fp16 | bf16 | fp8 | e4m3 | e5m2 | int8 | int4: the cache's element
                         type (default fp32; fp8 is e4m3, stored with per-layer scales; int8 stores
                         a float scale with each row of each head; int4 a half scale and minimum
                         with each group of 32 values); KEY+VALUE (e.g. int8+int4) stores keys and
                         values in two types
  --k-dtype TYPE         the keys' type alone (llama.cpp's -ctk; default --dtype's)
  --v-dtype TYPE         the values' type alone (llama.cpp's -ctv; default --dtype's)
  --page-size N          paged: tokens per page (default 16)
  --window N             sliding_window: keys a query of a full-attention layer sees (default 4096)
  --sinks N              sliding_window: first positions kept forever in those layers (default 4)
  --kv-policy NAME       none | streaming | h2o | snapkv | tova | knorm | random: evict K/V rows once a
                         layer holds more than its budget (every layout and backend; knorm reads
                         keys on the host, so not on cuda; default none)
  --kv-budget N          rows each layer keeps (tokens per sequence; default: --kv-ratio 0.5)
  --kv-ratio R           or a ratio in (0, 1] of the sequence's length (never below sinks + recent)
  --kv-layer-budgets K   uniform | pyramid: the same budget per layer, or PyramidKV's decreasing ones
                         of the same total (default uniform)
  --kv-compress-every N  decode steps between compactions; 0: only after the prefill (default 1)
  --kv-compress-when-free-below PAGES
                         also compact after any step that leaves fewer than PAGES pages free
                         in the pool (the pool running short; paged layout); 0: never (default 0)
  --kv-sinks N           first rows every policy keeps (default 4)
  --kv-recent N          last rows every policy keeps (default 8)
  --kv-window N          snapkv: the prompt's last queries whose attention ranks rows (default 16)
  --kv-seed N            random: the seed (default 0)
  --threads N            CPU threads (default: all cores)
  --dump-logits FILE     write every step's logits: a text header, then float32 little-endian
  --help                 this text
)";

std::string join(const std::vector<int>& ids) {
    std::string s;
    for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
    return s;
}

// A header an outside tool can read with readline() before the raw floats.
void dump_logits(const std::string& path, const ex::generation_trace& trace, int vocab) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw ex::usage_error("cannot write --dump-logits file '" + path + "'");
    out << "kvcache-logits 1\nsteps " << trace.logits.size() << "\nvocab_size " << vocab
        << "\nformat float32 little-endian, steps x vocab_size, row-major\nend_header\n";
    for (const auto& row : trace.logits)
        out.write(reinterpret_cast<const char*>(row.data()), static_cast<std::streamsize>(row.size() * sizeof(float)));
    if (!out) throw ex::usage_error("writing --dump-logits file '" + path + "' failed");
}

double ms_per_token(const ex::generation_trace& t) {
    if (t.step_seconds.size() < 2) return t.step_seconds.at(0) * 1e3;
    double sum = 0;
    for (std::size_t i = 1; i < t.step_seconds.size(); ++i) sum += t.step_seconds[i];
    return sum / static_cast<double>(t.step_seconds.size() - 1) * 1e3;
}

bool want_cached_of(const ex::arguments& args) { return !args.has("--no-cache"); }

// The --kv-* flags; the library refuses a budget below sinks + recent and a ratio outside (0, 1].
ex::compression_options compression_of(const ex::arguments& args) {
    ex::compression_options c;
    c.policy = kvcache::parse_eviction_policy(args.text("--kv-policy", "none"));
    if (args.has("--kv-budget") && args.has("--kv-ratio"))
        throw ex::usage_error("--kv-budget and --kv-ratio exclude each other");
    const std::string layer_budgets = args.text("--kv-layer-budgets", "uniform");
    if (layer_budgets != "uniform" && layer_budgets != "pyramid")
        throw ex::usage_error("--kv-layer-budgets '" + layer_budgets + "' is not one of uniform, pyramid");
    c.pyramid = layer_budgets == "pyramid";
    c.compress_every = args.integer("--kv-compress-every", 1, 0, 1 << 20);
    c.compress_when_free_below = args.integer("--kv-compress-when-free-below", 0, 0, 1 << 20);
    c.sinks = args.integer("--kv-sinks", 4, 0, 1 << 20);
    c.recent = args.integer("--kv-recent", 8, 0, 1 << 20);
    c.observation_window = args.integer("--kv-window", 16, 1, 1 << 20);
    c.seed = static_cast<std::uint64_t>(args.integer("--kv-seed", 0, 0, 1 << 30));
    if (args.has("--kv-budget")) {
        const std::string text = args.text("--kv-budget", "");
        const int tokens = ex::arguments::parse_int("--kv-budget", text, INT_MIN, INT_MAX);
        c.budget = kvcache::eviction_budget::of_tokens(tokens);
    } else {
        const std::string text = args.text("--kv-ratio", "0.5");
        char* end = nullptr;
        const double ratio = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0') throw ex::usage_error("--kv-ratio '" + text + "' is not a number");
        c.budget = kvcache::eviction_budget::of_ratio(ratio);
    }
    c.validate();
    return c;
}

// Tokens and bytes each layer holds at the end, and the cache memory the sequence held
// (paged: its pages; contiguous and sliding window: the rows they store).
void print_held(const ex::cached_generation& run, const ex::cache_options& cache, const ex::model_config& config) {
    const std::size_t row_bytes = std::size_t(kvcache::stored_token_bytes(cache.element, config.num_kv_heads, config.head_dim));
    std::printf("kv policy: %s; %d compactions\n", cache.compression.describe().c_str(), run.compactions);
    if (run.rows_held.empty()) {  // an attention path without the eviction hook reports no rows
        std::printf("cache in use: %zu bytes\n", run.bytes_used);
        return;
    }
    std::size_t total = 0;
    for (std::size_t l = 0; l < run.rows_held.size(); ++l) {
        std::printf("layer %zu holds %d tokens, %zu bytes\n", l, run.rows_held[l], run.rows_held[l] * row_bytes);
        total += run.rows_held[l] * row_bytes;
    }
    std::printf("held in all layers: %zu bytes in rows; cache in use: %zu bytes\n", total, run.bytes_used);
}

int run(int argc, char** argv) {
    ex::arguments args(argc, argv, {"--help", "--no-cache", "--compare"},
                       {"--model", "--prompt-ids", "--max-new-tokens", "--backend", "--layout", "--dtype", "--k-dtype", "--v-dtype", "--page-size", "--window",
                        "--sinks", "--threads", "--dump-logits", "--kv-policy", "--kv-budget", "--kv-ratio",
                        "--kv-layer-budgets", "--kv-compress-every", "--kv-compress-when-free-below", "--kv-sinks", "--kv-recent", "--kv-window",
                        "--kv-seed"});
    if (args.has("--help")) {
        std::cout << usage;
        return 0;
    }
    if (!args.has("--model")) throw ex::usage_error("--model DIR is required (see --help)");
    if (args.has("--no-cache") && args.has("--compare"))
        throw ex::usage_error("--no-cache and --compare exclude each other");
    const std::string dir = args.text("--model", "");
    const std::vector<int> prompt = args.integers("--prompt-ids", {1}, 0, 1 << 30);
    const int new_tokens = args.integer("--max-new-tokens", 16, 1, 1 << 20);
    const int threads = args.integer("--threads", 0, 0, 1024);
    const std::string logits_path = args.text("--dump-logits", "");
    const std::string backend_request = ex::backend_request(args);
    if (args.has("--no-cache") && backend_request == "cuda")
        throw ex::usage_error("--backend cuda runs the cached path; --no-cache recomputes on the CPU");

    auto load_start = std::chrono::steady_clock::now();
    ex::checkpoint_config checkpoint = ex::read_model_config(dir);
    const ex::model_config& config = checkpoint.model;
    for (int id : prompt)
        if (id >= config.vocab_size)
            throw ex::usage_error("--prompt-ids: id " + std::to_string(id) + " is outside the vocabulary of " +
                                  std::to_string(config.vocab_size));

    ex::cache_options cache;
    cache.layout = args.layout("--layout", kvcache::layout_kind::paged);
    cache.element = args.kinds("--dtype", "--k-dtype", "--v-dtype", kvcache::element_kind::fp32);
    cache.page_size = args.integer("--page-size", 16, 1, 1 << 16);
    // StreamingLLM-style windowing of full-attention layers; the model's own windowed layers keep
    // the config's window (kvcache_attention.hpp), so these change nothing for them.
    cache.window = args.integer("--window", 4096, 1, 1 << 24);
    cache.sinks = args.integer("--sinks", 4, 0, 1 << 20);
    cache.prefill_chunk = 64;
    cache.compression = compression_of(args);
    if (cache.compression.active() && !want_cached_of(args))
        throw ex::usage_error("--kv-policy evicts from the cache; --no-cache has none");
    // --compare checks the cache against recomputation, which keeps every row: evicting makes them differ.
    if (cache.compression.active() && args.has("--compare"))
        throw ex::usage_error(std::string("--kv-policy ") + kvcache::to_string(cache.compression.policy) +
                              " evicts rows that recomputation keeps; --compare checks a cache that keeps them all");
    int windowed_layers = 0;
    for (int l = 0; l < config.num_layers; ++l) windowed_layers += config.window_of(l) > 0;

    const bool want_cached = !args.has("--no-cache");
    const bool want_recompute = args.has("--no-cache") || args.has("--compare");
    ex::cached_runner runner = nullptr;
    // The checkpoint's shape reaches compiled code through kvcache::dispatch: its head counts
    // compiled when engine_configurations has them, else the dynamic ones of its head dimension.
    const kvcache::runtime_configuration wanted = ex::wanted_configuration_of(config, cache);
    if (want_cached) {
        if (!kvcache::supports(ex::engine_configurations{}, wanted))
            throw ex::usage_error("the checkpoint's heads " + config.heads().to_string() +
                                  " (num_attention_heads/num_key_value_heads/head_dim) have a head dimension no compiled"
                                  " configuration covers; --no-cache runs any shape. Compiled: " +
                                  kvcache::describe(ex::engine_configurations{}));
        runner = &ex::generate_with_kvcache<>;
    }
    ex::backend_choice backend{ex::compute_backend::cpu, "--no-cache: recomputation runs on the CPU"};
    if (want_cached) {
        backend = ex::choose_backend(backend_request);
        if (backend.backend == ex::compute_backend::cuda) {
            if (ex::cached_runner cuda = ex::cuda_runner_for(wanted)) {
                runner = cuda;
            } else {
                // Each CUDA configuration costs an nvcc translation unit, so only a few are compiled.
                const std::string why = "no configuration compiled for the CUDA backend runs " + wanted.to_string() +
                                        " (compiled: " + ex::cuda_compiled_configurations() +
                                        "; add one in engine/CMakeLists.txt)";
                if (backend_request == "cuda") throw ex::usage_error("--backend cuda: " + why);
                backend = {ex::compute_backend::cpu, "--backend auto found a CUDA device, but " + why};
            }
        }
    }
    if (want_cached)
        std::printf("heads: %s, %s\n", config.heads().to_string().c_str(),
                    kvcache::compiled_for(ex::engine_configurations{}, wanted) ? "compiled head counts"
                                                                            : "dynamic head counts (generic instantiation)");
    const bool on_cuda = backend.backend == ex::compute_backend::cuda;

    ex::thread_pool pool(threads);
    kvcache::cpu::set_thread_count(threads);
    std::fprintf(stderr, "loading %s ...\n", dir.c_str());
    ex::llama_model model(ex::load_checkpoint(dir, checkpoint), pool);
    double load_s = ex::seconds_since(load_start);

    std::string layout_text = kvcache::to_string(cache.layout);
    if (cache.layout == kvcache::layout_kind::paged) layout_text += " (page " + std::to_string(cache.page_size) + ")";
    if (cache.layout == kvcache::layout_kind::sliding_window)
        layout_text += " (window " + std::to_string(cache.window) + ", sinks " + std::to_string(cache.sinks) + ")";
    std::printf("model: %s (%s, %s%s), loaded in %.2f s\n", dir.c_str(), config.model_type.c_str(),
                config.describe().c_str(), config.tie_word_embeddings ? ", tied embeddings" : "", load_s);
    std::printf("backend: %s (%s)\n", ex::to_string(backend.backend), backend.why.c_str());
    if (windowed_layers > 0)
        std::printf("windowed layers: %d of %d attend to the last %d tokens (config), in a sliding-window cache of "
                    "that window without sinks\n",
                    windowed_layers, config.num_layers, checkpoint.sliding_window);
    if (windowed_layers == config.num_layers)
        layout_text = "sliding_window (window " + std::to_string(checkpoint.sliding_window) + " from the config, no sinks)";
    else if (windowed_layers > 0)
        layout_text += " for the full-attention layers";
    if (want_cached)
        std::printf("cache: %s, %s, kvcache %s backend, %d threads%s\n", layout_text.c_str(),
                    cache.element.to_string().c_str(), on_cuda ? "CUDA" : "CPU", pool.size(),
                    on_cuda ? " for the rest of the model" : "");
    if (want_cached && (kvcache::is_scaled_kind(cache.element.key) || kvcache::is_scaled_kind(cache.element.value))) {
        // vLLM's convention: one k_scale and one v_scale per layer; without them every scale is 1.
        const ex::model_config& loaded = model.config();
        if (loaded.cache_scales.empty())
            std::printf("fp8 scales: 1.0 for keys and values in every layer (the checkpoint has no "
                        "self_attn.k_scale / v_scale tensors)\n");
        else
            std::printf("fp8 scales: per layer from the checkpoint's self_attn.k_scale / v_scale (layer 0: key %g, "
                        "value %g)\n",
                        loaded.scales_of(0).key, loaded.scales_of(0).value);
    }
    if (want_recompute)
        std::printf("recompute: the whole sequence at every step, no cache, on the CPU%s%s%s\n",
                    !want_cached || cache.element == kvcache::element_kind::fp32 ? ""
                    : on_cuda ? " (K/V, queries and outputs rounded through "
                              : " (K/V rounded through ",
                    !want_cached || cache.element == kvcache::element_kind::fp32 ? "" : cache.element.to_string().c_str(),
                    !want_cached || cache.element == kvcache::element_kind::fp32 ? ""
                    : on_cuda ? " like the CUDA backend)"
                              : " like the cache)");
    std::printf("prompt ids: %s\n", join(prompt).c_str());

    ex::generation_options options;
    options.keep_logits = !logits_path.empty() || args.has("--compare");
    ex::progress_line progress;
    const char* path = "cached";
    options.progress = [&](int step) {
        progress.update(std::string(path) + ": token " + std::to_string(step + 1) + "/" + std::to_string(new_tokens));
    };
    ex::generation_trace cached, recomputed;
    if (want_cached) {
        const ex::cached_generation run = runner(model, prompt, new_tokens, cache, options);
        cached = run.trace;
        progress.clear();
        std::printf("generated ids: %s\n", join(cached.tokens).c_str());
        // What the cache held for this run: every layer's K and V for the prompt and the new tokens.
        const double tokens = double(prompt.size()) + new_tokens;
        const bool mib = run.bytes_reserved >= (std::size_t(1) << 20);
        std::printf("cache memory: %.2f %s reserved for %d tokens x %d layers (%s, %.0f bytes per token per layer)\n",
                    double(run.bytes_reserved) / (mib ? 1024.0 * 1024.0 : 1024.0), mib ? "MiB" : "KiB", int(tokens),
                    config.num_layers,
                    cache.element.to_string().c_str(), double(run.bytes_reserved) / (tokens * config.num_layers));
        std::printf("cached: %.2f ms/token (prefill %.1f ms)\n", ms_per_token(cached), cached.step_seconds[0] * 1e3);
        if (args.has("--kv-policy")) print_held(run, cache, config);
    }
    if (want_recompute) {
        ex::recompute_attention attention(config, pool, want_cached ? cache.element : kvcache::element_kind::fp32,
                                          want_cached || cache.layout == kvcache::layout_kind::sliding_window
                                              ? cache.visibility()
                                              : kvcache::attention_visibility{},
                                          on_cuda);
        path = "recompute";
        recomputed = ex::generate(model, prompt, new_tokens, attention, ex::generation_mode::recompute, options);
        progress.clear();
        std::printf("%s ids: %s\n", want_cached ? "recompute" : "generated", join(recomputed.tokens).c_str());
        std::printf("recompute: %.2f ms/token\n", ms_per_token(recomputed));
    }
    int status = 0;
    if (want_cached && want_recompute) {
        bool same = cached.tokens == recomputed.tokens;
        double worst = 0;
        for (std::size_t s = 0; s < cached.logits.size(); ++s)
            for (std::size_t i = 0; i < cached.logits[s].size(); ++i)
                worst = std::max(worst, double(std::fabs(cached.logits[s][i] - recomputed.logits[s][i])));
        std::printf("tokens identical: %s\nlargest logit difference: %.3g\n", same ? "yes" : "no", worst);
        status = same ? 0 : 1;
    }
    if (!logits_path.empty()) {
        dump_logits(logits_path, want_cached ? cached : recomputed, config.vocab_size);
        std::printf("logits of %d steps written to %s\n", new_tokens, logits_path.c_str());
    }
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("06_llama", [&] { return run(argc, argv); });
}
