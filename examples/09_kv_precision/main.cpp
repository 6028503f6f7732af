// 09_kv_precision: what storing K/V in fewer bits costs a trained model. The
// same held-out text goes through kvcache's cache once per storage element
// type — each window prefilled up to its middle, then decoded token by token —
// and every next-token distribution is compared with the fp32 cache's:
// perplexity, how often the greedy token agrees, the largest logit difference,
// the KL divergence, and the bytes the cache held.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/report_output.hpp"
#include "common/run_main.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/checkpoint_loader.hpp"
#include "kvcache_engine/evaluation.hpp"
#include "kvcache_engine/evaluation_data.hpp"

#include <nlohmann/json.hpp>

namespace ex = kvcache::examples;

namespace {

const char* usage = R"(usage: 09_kv_precision --model DIR [options]

Runs a byte-level model (models/handbook-byte-llama, or any folder with its
config.json, model.safetensors and heldout_sample.txt) through kvcache's cache
once per K/V storage type and prints a table against the fp32 cache:
perplexity, greedy-token agreement, largest logit difference, KL divergence,
and the bytes per token and layer each type stores.

options:
  --model DIR            the model folder (required)
  --types LIST           comma-separated storage types besides fp32
                         (default fp16,bf16,e4m3,e5m2,int8,int4,fp16+int8,fp16+int4,int8+int4;
                         KEY+VALUE stores keys and values in two types, held to the coarser
                         side's limit)
  --windows N            held-out windows of 255 bytes (default 2; 0: all)
  --layout KIND          paged | contiguous (default paged)
  --page-size N          paged: tokens per page (default 16)
  --max-perplexity-change-16bit P
                         the most a 16-bit type's perplexity may rise, in percent (default 0.5)
  --max-perplexity-change-8bit P
                         the same for the 8-bit types (default 5)
  --max-perplexity-change-4bit P
                         the same for int4 (default 10)
  --threads N            CPU threads (default 1)
  --json FILE            also write the table as {"machine", "results"} (the bench's schema)
  --help                 this text
)";

// The shipped model's head shape, and any other of head dimension 32, in every storage type and K/V pair.
using precision_configurations = kvcache::configuration_product_t<
    kvcache::type_list<kvcache::paged_layout, kvcache::contiguous_layout>, kvcache::cache_element_choices,
    kvcache::type_list<kvcache::head_config<8, 2, 32>, kvcache::dynamic_heads<32>>>;

// A non-negative percentage option as a fraction.
double percent(const ex::arguments& args, const std::string& name, double fallback) {
    const std::string text = args.text(name, std::to_string(fallback));
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(value >= 0.0) || !std::isfinite(value))
        throw ex::usage_error(name + " '" + text + "' is not a non-negative percentage");
    return value / 100.0;
}

// One storage type's figures over every scored position of every window.
struct tally {
    kvcache::kv_kinds kind = kvcache::element_kind::fp32;
    double nats = 0.0;
    long scored = 0;
    long agreeing = 0;  // positions whose argmax equals the fp32 cache's
    double logit_difference_max = 0.0;
    double kl_max = 0.0, kl_sum = 0.0;
    double bytes_used = 0.0;  // the owner's bytes at the end of each window, summed

    double perplexity() const { return std::exp(nats / double(std::max(scored, 1L))); }
    double agreement() const { return scored ? double(agreeing) / double(scored) : 0.0; }
    double kl_mean() const { return scored ? kl_sum / double(scored) : 0.0; }
};

// What fp32 produced at one scored position, for the other types to be compared with.
struct reference_step {
    std::vector<double> log_probabilities;
    std::vector<float> logits;
    int greedy = 0;
};

int run(int argc, char** argv) {
    ex::arguments args(argc, argv, {"--help"},
                       {"--model", "--types", "--windows", "--layout", "--page-size", "--max-perplexity-change-16bit",
                        "--max-perplexity-change-8bit", "--max-perplexity-change-4bit", "--threads", "--json"});
    if (args.has("--help")) {
        std::cout << usage;
        return 0;
    }
    if (!args.has("--model")) throw ex::usage_error("--model DIR is required (see --help)");
    const std::string dir = args.text("--model", "");
    std::vector<kvcache::kv_kinds> kinds{kvcache::element_kind::fp32};
    for (const std::string& name :
         ex::split_commas(args.text("--types", "fp16,bf16,e4m3,e5m2,int8,int4,fp16+int8,fp16+int4,int8+int4"))) {
        kvcache::kv_kinds kind;
        if (!kvcache::parse_kv_kinds(name, kind))
            throw ex::usage_error("--types: '" + name + "' is not a storage type (fp16, bf16, e4m3, e5m2, int8, int4, fp32) "
                                  "or KEY+VALUE of two");
        if (kind != kvcache::element_kind::fp32) kinds.push_back(kind);
    }
    const int window_count = args.integer("--windows", 2, 0, 1 << 20);
    const int threads = args.integer("--threads", 1, 1, 1024);
    const double limit_16 = percent(args, "--max-perplexity-change-16bit", 0.5);
    const double limit_8 = percent(args, "--max-perplexity-change-8bit", 5.0);
    const double limit_4 = percent(args, "--max-perplexity-change-4bit", 10.0);
    ex::cache_options cache;
    cache.layout = args.layout("--layout", kvcache::layout_kind::paged);
    if (cache.layout == kvcache::layout_kind::sliding_window)
        throw ex::usage_error("--layout sliding_window drops keys by itself; compare precision on paged or contiguous");
    cache.page_size = args.integer("--page-size", 16, 1, 1 << 16);

    ex::thread_pool pool(threads);
    kvcache::cpu::set_thread_count(threads);
    ex::llama_model model(ex::load_checkpoint(dir, ex::read_model_config(dir)), pool);
    const ex::model_config& config = model.config();
    const int bos = 256, window_bytes = 255;
    const auto windows = ex::byte_windows(ex::read_file_bytes(dir + "/heldout_sample.txt"), window_bytes, bos, window_count);
    const int context = window_bytes + 1, prompt = context / 2;

    std::printf("model: %s (%s)\n", dir.c_str(), config.describe().c_str());
    std::printf("held-out: %zu windows of %d tokens, the first %d prefilled, the other %d decoded; every next-token "
                "distribution from the prefill's last on is compared with the fp32 cache's\n",
                windows.size(), context, prompt, context - prompt);
    std::printf("cache: %s, %d threads\n",
                cache.layout == kvcache::layout_kind::paged ? ("paged, page " + std::to_string(cache.page_size)).c_str()
                                                            : "contiguous",
                threads);

    std::vector<tally> tallies(kinds.size());
    for (std::size_t k = 0; k < kinds.size(); ++k) tallies[k].kind = kinds[k];
    for (const std::vector<int>& tokens : windows) {
        std::vector<reference_step> reference;  // fp32's steps of this window, in order
        for (std::size_t k = 0; k < kinds.size(); ++k) {
            tally& t = tallies[k];
            ex::cache_options options = cache;
            options.element = kinds[k];
            std::size_t step = 0;
            const ex::cache_footprint f = ex::teacher_force_with_kvcache<precision_configurations>(
                model, tokens, context, options,
                [&](int position, const float* logits, int vocab) {
                    std::vector<double> lp = ex::log_probabilities(logits, vocab);
                    t.nats -= lp[std::size_t(tokens[std::size_t(position) + 1])];
                    ++t.scored;
                    const int greedy = ex::argmax(logits, vocab);
                    if (k == 0) {
                        reference.push_back({std::move(lp), std::vector<float>(logits, logits + vocab), greedy});
                        ++t.agreeing;
                        return;
                    }
                    const reference_step& r = reference.at(step++);
                    t.agreeing += greedy == r.greedy;
                    for (int i = 0; i < vocab; ++i)
                        t.logit_difference_max =
                            std::max(t.logit_difference_max, std::fabs(double(logits[i]) - double(r.logits[std::size_t(i)])));
                    const double kl = ex::kl_divergence(r.log_probabilities, lp);
                    t.kl_max = std::max(t.kl_max, kl);
                    t.kl_sum += kl;
                },
                prompt);
            t.bytes_used += double(f.bytes_used);
        }
    }

    const tally& full = tallies[0];
    const int row_fp32 = kvcache::stored_row_bytes(kvcache::element_kind::fp32, config.head_dim);
    auto per_token_layer = [&](kvcache::kv_kinds kind) {
        return int(kvcache::stored_token_bytes(kind, config.num_kv_heads, config.head_dim));
    };
    auto perplexity_change = [&](const tally& t) { return t.perplexity() / full.perplexity() - 1.0; };
    auto bytes_vs_fp32 = [&](const tally& t) { return full.bytes_used > 0 ? t.bytes_used / full.bytes_used : 0.0; };

    std::printf("\n| K/V type | bytes/token/layer | held vs fp32 | perplexity | vs fp32 | greedy agrees | max logit diff | KL mean | KL max |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    bool within = true, bytes_match = true;
    std::string verdicts;
    for (const tally& t : tallies) {
        std::printf("| %s | %d | %.3f | %.4f | %+.3f%% | %.2f%% | %.4f | %.2e | %.2e |\n", t.kind.to_string().c_str(),
                    per_token_layer(t.kind), bytes_vs_fp32(t), t.perplexity(), perplexity_change(t) * 100.0,
                    t.agreement() * 100.0, t.logit_difference_max, t.kl_mean(), t.kl_max);
        // The owner's bytes against fp32's must be exactly the stored rows' ratio: the same pages
        // or slots hold the same rows, each of its type's size (scales included).
        const double expected = double(per_token_layer(t.kind)) / double(2 * config.num_kv_heads * row_fp32);
        if (!windows.empty() && std::fabs(bytes_vs_fp32(t) - expected) > 1e-9) {
            bytes_match = false;
            verdicts += std::string("  ") + t.kind.to_string() + ": the cache held " +
                        std::to_string(bytes_vs_fp32(t)) + " of fp32's bytes; its rows are " +
                        std::to_string(expected) + " of fp32's\n";
        }
        // A pair is held to the limit of its coarser side.
        const auto limit_of = [&](kvcache::element_kind kind) {
            return kind == kvcache::element_kind::int4 ? limit_4 : kvcache::element_size(kind) >= 2 ? limit_16 : limit_8;
        };
        const double limit = std::max(limit_of(t.kind.key), limit_of(t.kind.value));
        if (perplexity_change(t) > limit) {
            within = false;
            verdicts += std::string("  ") + t.kind.to_string() + ": perplexity rose " +
                        std::to_string(perplexity_change(t) * 100.0) + "%, above the limit of " +
                        std::to_string(limit * 100.0) + "%\n";
        }
    }
    std::printf("%s", verdicts.c_str());

    if (args.has("--json")) {
        nlohmann::json results = nlohmann::json::array();
        for (const tally& t : tallies)
            results.push_back({{"benchmark", "kv_precision"},
                               {"params", {{"element", t.kind.to_string()}}},
                               {"metrics",
                                {{"bytes_per_token_per_layer", per_token_layer(t.kind)},
                                 {"bytes_vs_fp32", bytes_vs_fp32(t)},
                                 {"perplexity", t.perplexity()},
                                 {"perplexity_vs_fp32", perplexity_change(t)},
                                 {"greedy_agreement", t.agreement()},
                                 {"logit_difference_max", t.logit_difference_max},
                                 {"kl_mean", t.kl_mean()},
                                 {"kl_max", t.kl_max}}}});
        const nlohmann::json machine{{"program", "09_kv_precision"}, {"model", dir},
                                     {"model_config", config.describe()}, {"windows", windows.size()},
                                     {"threads", threads}};
        ex::write_json_report(args.text("--json", ""), machine, results);
    }
    std::printf("\nevery type held exactly its rows' share of fp32's bytes: %s\n", bytes_match ? "yes" : "no");
    std::printf("every type's perplexity within its limit (16-bit %.2f%%, 8-bit %.2f%%, 4-bit %.2f%%): %s\n",
                limit_16 * 100.0, limit_8 * 100.0, limit_4 * 100.0, within ? "yes" : "no");
    return within && bytes_match ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("09_kv_precision", [&] { return run(argc, argv); });
}
