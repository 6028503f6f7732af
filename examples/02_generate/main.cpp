// 02_generate: a small Llama-architecture decoder generating greedily two
// ways — recomputing every past token's K/V at each step, and with kvcache —
// proving both give the same tokens and showing what the cache saves.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/progress_line.hpp"
#include "common/run_main.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/compute_backend.hpp"
#include "kvcache_engine/device_attention.hpp"
#include "kvcache_engine/generation_comparison.hpp"

namespace ex = kvcache::examples;

namespace {

const char* usage = R"(usage: 02_generate [options]

A Llama-architecture decoder (RMSNorm, rotary embedding, grouped-query
attention, SwiGLU) with deterministic random weights generates greedily,
once recomputing all K/V at every step (no cache) and once with kvcache
(prefill, then one token at a time). Prints whether the tokens are identical,
the largest logit difference, and per-token latency and throughput of both
at each context length (prompt length). The recompute path always runs on
the CPU; the cached path on kvcache's CPU backend or, with a GPU, its CUDA
backend.

options:
  --contexts L1,L2,..  prompt lengths to measure (default 128,256,512,1024)
  --new-tokens N       tokens generated at each context length (default 8)
  --backend KIND       auto | cpu | cuda | emulated: where the cached path runs
                       (default auto: cuda when this build has CUDA and a device
                       is present; emulated: the CUDA path's steps on kvcache's
                       SIMT emulator, slow, to check it without a GPU)
  --layout KIND        contiguous | paged | sliding_window (default paged)
  --dtype TYPE         fp32 | fp16 | bf16 | fp8 | e4m3 | e5m2 | int8 | int4: the cache's element type
                       (default fp32; fp8 is e4m3, stored with per-layer scales; int8 with a scale per row;
                       int4 with a half scale and minimum per group of 32); KEY+VALUE (e.g. int8+int4)
                       stores keys and values in two types
  --k-dtype TYPE       the keys' type alone (default --dtype's)
  --v-dtype TYPE       the values' type alone (default --dtype's)
  --page-size N        paged: tokens per page (default 16)
  --window N           sliding_window: keys a query sees (default 512)
  --sinks N            sliding_window: first positions kept forever (default 4)
  --layers N           decoder layers (default 4)
  --threads N          CPU threads (default: all cores)
  --seed N             weights and prompt seed (default 1)
  --json FILE          also write the figures as JSON
  --help               this text
)";



int run(int argc, char** argv) {
    ex::arguments args(argc, argv, {"--help"},
                       {"--contexts", "--new-tokens", "--backend", "--layout", "--dtype", "--k-dtype", "--v-dtype", "--page-size", "--window", "--sinks",
                        "--layers", "--threads", "--seed", "--json"});
    if (args.has("--help")) {
        std::cout << usage;
        return 0;
    }
    const std::vector<int> contexts = args.integers("--contexts", {128, 256, 512, 1024}, 1, 1 << 16);
    const int new_tokens = args.integer("--new-tokens", 8, 1, 4096);
    ex::cache_options cache;
    cache.layout = args.layout("--layout", kvcache::layout_kind::paged);
    cache.element = args.kinds("--dtype", "--k-dtype", "--v-dtype", kvcache::element_kind::fp32);
    cache.page_size = args.integer("--page-size", 16, 1, 1 << 16);
    cache.window = args.integer("--window", 512, 1, 1 << 20);
    cache.sinks = args.integer("--sinks", 4, 0, 1 << 20);
    cache.prefill_chunk = 64;
    const int layers = args.integer("--layers", 4, 1, 64);
    const int threads = args.integer("--threads", 0, 0, 1024);
    const int seed = args.integer("--seed", 1, 0, 1 << 30);
    const std::string json_path = args.text("--json", "");
    const ex::backend_choice backend = ex::choose_backend(ex::backend_request(args, true));
    ex::cached_path cached_path{&ex::generate_with_kvcache<ex::configurations_for<ex::flagship_heads>>, false};
    if (backend.backend == ex::compute_backend::cuda) {
        cached_path.run = ex::cuda_runner_for({cache.layout, cache.element, kvcache::shape_of<ex::flagship_heads>()});
        if (!cached_path.run) throw std::runtime_error("the CUDA path is not compiled for the flagship heads");
    }
    if (backend.backend == ex::compute_backend::emulated)
        cached_path.run = &ex::generate_with_kvcache_emulated<ex::flagship_heads>;
    // The CUDA path (and its emulation) takes queries and gives outputs in the cache's element type.
    cached_path.element_queries_outputs = backend.backend != ex::compute_backend::cpu;

    const ex::model_config config = ex::flagship_config(layers);

    ex::thread_pool pool(threads);
    kvcache::cpu::set_thread_count(threads);
    ex::llama_model model(ex::make_random_weights(config, static_cast<std::uint64_t>(seed)), pool);

    std::string layout_text = kvcache::to_string(cache.layout);
    if (cache.layout == kvcache::layout_kind::paged) layout_text += " (page " + std::to_string(cache.page_size) + ")";
    if (cache.layout == kvcache::layout_kind::sliding_window)
        layout_text += " (window " + std::to_string(cache.window) + ", sinks " + std::to_string(cache.sinks) + ")";
    std::printf("model: Llama-architecture decoder, %s, random weights (seed %d)\n", config.describe().c_str(), seed);
    std::printf("backend: %s (%s)\n", ex::to_string(backend.backend), backend.why.c_str());
    if (backend.backend == ex::compute_backend::cuda)
        std::printf("cache: %s, %s, kvcache CUDA backend (K/V in device memory); the rest of the model on %d CPU threads\n",
                    layout_text.c_str(), cache.element.to_string().c_str(), pool.size());
    else if (backend.backend == ex::compute_backend::emulated)
        std::printf("cache: %s, %s, kvcache's CUDA kernels on the SIMT emulator; the rest of the model on %d CPU threads\n",
                    layout_text.c_str(), cache.element.to_string().c_str(), pool.size());
    else
        std::printf("cache: %s, %s, kvcache CPU backend, %d threads\n", layout_text.c_str(),
                    cache.element.to_string().c_str(), pool.size());
    std::printf("greedy decoding of %d tokens per context; \"recompute\" runs the whole sequence at every step, no cache\n",
                new_tokens);
    const bool fp8 = kvcache::is_scaled_kind(cache.element.key) || kvcache::is_scaled_kind(cache.element.value);
    if (fp8 && cached_path.element_queries_outputs)  // the CUDA path takes and gives fp16 around an fp8 cache
        std::printf("note: the recompute path rounds its K/V through fp16 and then %s, and its queries and outputs "
                    "through fp16, as the CUDA backend takes and gives them, so both attend over the same values\n",
                    cache.element.to_string().c_str());
    else if (cache.element != kvcache::element_kind::fp32)
        std::printf("note: the recompute path rounds its K/V%s through %s too, so both attend over the same values\n",
                    cached_path.element_queries_outputs ? " (and queries and outputs, as the CUDA backend does)" : "",
                    cache.element.to_string().c_str());
    if (fp8)
        std::printf("note: fp8 scales are 1.0 for keys and values in every layer (random weights, no checkpoint scales)\n");
    if (cache.layout == kvcache::layout_kind::sliding_window)
        std::printf("note: the recompute path applies the same window and sinks, so both compute the same model\n");
    std::printf("\n");

    std::vector<ex::generation_comparison> results;
    ex::progress_line progress;
    for (int context : contexts) {
        std::vector<int> prompt = ex::seeded_prompt(context, config.vocab_size, static_cast<std::uint64_t>(seed));
        auto m = ex::compare_generation(model, prompt, new_tokens, cache, cached_path, [&](const char* path, int step) {
            progress.update("context " + std::to_string(context) + ": " + path + " step " + std::to_string(step + 1) + "/" +
                            std::to_string(new_tokens));
        });
        progress.clear();
        results.push_back(m);
        if (results.size() == 1) {
            std::printf("%7s | %16s | %13s | %8s | %15s | %12s | %9s | %14s\n", "context", "recompute ms/tok",
                        "cached ms/tok", "speedup", "recompute tok/s", "cached tok/s", "identical", "max logit diff");
        }
        std::printf("%7d | %16.3f | %13.3f | %7.1fx | %15.1f | %12.1f | %9s | %14.2e\n", m.context, m.recompute_ms,
                    m.cached_ms, m.recompute_ms / m.cached_ms, m.recompute_tps, m.cached_tps, m.identical ? "yes" : "NO",
                    m.max_logit_diff);
        std::fflush(stdout);
    }

    bool all_identical = true;
    double worst = 0;
    for (const auto& m : results) {
        all_identical = all_identical && m.identical;
        worst = std::max(worst, m.max_logit_diff);
    }
    std::printf("\nms/tok: median over the generated tokens after the first (the first step carries the prompt);"
                " tok/s: those tokens over their total time\n");
    std::printf("cached prefill of the prompt:");
    for (const auto& m : results) std::printf(" %.1f ms (%d tokens)%s", m.cached_prefill_ms, m.context, &m == &results.back() ? "" : ",");
    std::printf("\n");
    std::printf("tokens identical: %s\n", all_identical ? "yes" : "no");
    std::printf("largest logit difference: %.3g\n", worst);

    if (!json_path.empty()) {
        nlohmann::json j;
        j["example"] = "02_generate";
        j["model"] = {{"layers", config.num_layers},       {"hidden_size", config.hidden_size},
                      {"query_heads", config.num_query_heads}, {"kv_heads", config.num_kv_heads},
                      {"head_dim", config.head_dim},       {"intermediate_size", config.intermediate_size},
                      {"vocab_size", config.vocab_size},   {"seed", seed}};
        j["layout"] = kvcache::to_string(cache.layout);
        j["dtype"] = cache.element.to_string();
        j["backend"] = ex::to_string(backend.backend);
        j["backend_reason"] = backend.why;
        j["threads"] = pool.size();
        j["new_tokens"] = new_tokens;
        j["latency"] = "median ms per generated token after the first";
        j["tokens_identical"] = all_identical;
        j["max_logit_diff"] = worst;
        for (const auto& m : results)
            j["results"].push_back({{"context", m.context},
                                    {"recompute_ms_per_token", m.recompute_ms},
                                    {"cached_ms_per_token", m.cached_ms},
                                    {"recompute_tokens_per_second", m.recompute_tps},
                                    {"cached_tokens_per_second", m.cached_tps},
                                    {"speedup", m.recompute_ms / m.cached_ms},
                                    {"recompute_first_step_ms", m.recompute_first_ms},
                                    {"cached_prefill_ms", m.cached_prefill_ms},
                                    {"tokens_identical", m.identical},
                                    {"cache_bytes_reserved", m.cache_bytes},
                                    {"max_logit_diff", m.max_logit_diff}});
        std::ofstream out(json_path);
        out << j.dump(2) << "\n";
        if (!out) throw ex::usage_error("cannot write --json file '" + json_path + "'");
        std::printf("figures written to %s\n", json_path.c_str());
    }
    return all_identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("02_generate", [&] { return run(argc, argv); });
}
