// 01_quickstart: the smallest complete use of kvcache. A paged cache holds
// one sequence's keys and values; the CPU backend appends a prompt's K/V and
// runs decode attention for the next token; the reference backend (double
// precision) checks the result.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <vector>

#include "common/run_main.hpp"
#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache_engine/arguments.hpp"

using heads = kvcache::head_config<8, 2, 64>;  // 8 query heads share 2 KV heads (GQA), head_dim 64

int quickstart(int tokens, int page_size, unsigned seed) {
    // A cache of 1 layer and enough pages of page_size tokens for the prompt plus one token.
    const int pages = (tokens + 1 + page_size - 1) / page_size;
    kvcache::paged_cache<float, heads> cache(/*layers=*/1, pages, page_size);
    const kvcache::sequence_id sequence = cache.add_sequence();

    // Made-up K/V for the prompt, [token][kv_head][head_dim], then one decode query and its K/V.
    std::mt19937 random(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    auto fill = [&](std::size_t n) { std::vector<float> v(n); for (auto& x : v) x = uniform(random); return v; };
    const std::size_t kv_row = heads::kv_heads() * heads::head_dim, q_row = heads::query_heads() * heads::head_dim;
    const std::vector<float> keys = fill(tokens * kv_row), values = fill(tokens * kv_row);
    const std::vector<float> query = fill(q_row), new_key = fill(kv_row), new_value = fill(kv_row);

    // Prefill: a plan reserves the prompt's positions (every layer) and owns the step's
    // tables; the CPU backend writes the rows through the plan's view of layer 0.
    const kvcache::cpu_backend cpu;
    const auto prompt = cache.plan({sequence}, {tokens});
    cpu.append(kvcache::append_params(prompt.view(0), keys, values, prompt.new_token_offsets()));

    // Decode: a plan of one new token; append its K/V, then its query attends to all tokens + 1 positions.
    const auto step = cache.plan({sequence}, {1});
    const auto view = step.view(0);
    cpu.append(kvcache::append_params(view, new_key, new_value, step.new_token_offsets()));
    std::vector<float> output(q_row);
    const kvcache::decode_params decode(view, query, output);
    cpu.decode(decode);

    // The same attention in double precision, straight from the layout interface.
    const auto exact = kvcache::reference_backend{}.decode_exact(decode);
    double max_difference = 0;
    for (std::size_t i = 0; i < output.size(); ++i)
        max_difference = std::max(max_difference, std::fabs(output[i] - exact.outputs[i]));

    std::printf("paged cache: %d tokens in %zu pages of %d, %d query heads / %d KV heads, head_dim %d\n",
                cache.length(sequence), cache.pages(sequence).size(), page_size, heads::query_heads(), heads::kv_heads(),
                heads::head_dim);
    std::printf("decode output, query head 0, first 8 of %d:", heads::head_dim);
    for (int d = 0; d < 8; ++d) std::printf(" %+.4f", output[d]);
    std::printf("\nmax |cpu - reference| = %.2e over %zu outputs\n", max_difference, output.size());
    const bool ok = max_difference < 1e-4;
    std::printf("quickstart: %s\n", ok ? "OK" : "FAILED (difference above 1e-4)");
    return ok ? 0 : 1;
}

const char* usage = R"(usage: 01_quickstart [--tokens N] [--page-size N] [--seed N] [--help]

Makes a paged KV cache, appends N prompt tokens' keys and values (random),
appends one more token and runs decode attention for it on the CPU backend,
prints part of the output and its largest difference from the reference
backend (double precision).

  --tokens N     prompt tokens (default 100)
  --page-size N  tokens per page (default 16)
  --seed N       random seed (default 1)
)";

int main(int argc, char** argv) {
    namespace ex = kvcache::examples;
    return ex::run_main("01_quickstart", [&]() -> int {
        ex::arguments args(argc, argv, {"--help"}, {"--tokens", "--page-size", "--seed"});
        if (args.has("--help")) return std::cout << usage, 0;
        return quickstart(args.integer("--tokens", 100, 1, 1 << 20), args.integer("--page-size", 16, 1, 1 << 16),
                          static_cast<unsigned>(args.integer("--seed", 1, 0, 1 << 30)));
    });
}
