// 07_compress: the key-token selection policies side by side on a trained
// model. Each held-out text window is prefilled up to its middle, compacted to
// the budget, then decoded token by token with a compaction every N steps;
// each recall text is prefilled up to its first answer and decoded the same
// way. Against the full cache: perplexity, recall accuracy, the KL divergence
// of every next-token distribution, the bytes the cache held, the time per
// decoded token.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/report_output.hpp"
#include "common/run_main.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/checkpoint_loader.hpp"
#include "kvcache_engine/compression.hpp"
#include "kvcache_engine/evaluation.hpp"
#include "kvcache_engine/evaluation_data.hpp"

#include <nlohmann/json.hpp>

namespace ex = kvcache::examples;

namespace {

const char* usage = R"(usage: 07_compress --model DIR [options]

Runs a byte-level model (models/handbook-byte-llama, or any folder with the
same files: config.json, model.safetensors, heldout_sample.txt,
recall_set.json) through kvcache's paged cache under every eviction policy
and prints, per budget, a table against the full cache.

options:
  --model DIR            the model folder (required)
  --full                 every held-out window and recall text (default: a slice of 1 and 4)
  --windows N            held-out windows of 255 bytes (overrides the slice)
  --recall N             recall texts (overrides the slice)
  --budgets 10,25,50     budgets in percent of each sequence's context (default 10,25,50)
  --policies LIST        comma-separated (default streaming,h2o,snapkv,tova,knorm,random)
  --layer-budgets K      uniform | pyramid (default uniform)
  --compress-every N     decode steps between compactions (default 1)
  --sinks N              first rows always kept (default 4)
  --recent N             last rows always kept (default 4)
  --page-size N          tokens per page (default 16)
  --threads N            CPU threads (default 1)
  --json FILE            also write the tables as {"machine", "results"} (the bench's
                         schema; scripts/plot-bench draws quality against memory from it)
  --help                 this text
)";

// The shipped model's head shape in a paged fp32 cache, and any other of head dimension 32:
// each configuration instantiates the whole cached path, so the list is short.
using compress_configurations =
    kvcache::type_list<kvcache::configuration<kvcache::paged_layout, float, kvcache::head_config<8, 2, 32>>,
                       kvcache::configuration<kvcache::paged_layout, float, kvcache::dynamic_heads<32>>>;

// One policy at one budget (the full cache is the policy none).
struct tally {
    double nats = 0.0;
    long scored = 0;
    int recall_right = 0, recall_total = 0;
    double kl_max = 0.0, kl_sum = 0.0;
    long kl_count = 0;
    double bytes = 0.0;  // pages in use at the end of each held-out window, summed
    long windows = 0;
    double decode_seconds = 0.0;
    long decode_steps = 0;
    bool budget_held = true;  // every layer at the end of every sequence held what the schedule allows
    std::string budget_violation;

    double perplexity() const { return std::exp(nats / double(std::max(scored, 1L))); }
};

// The rows a layer may hold after its last step: its budget, plus the steps a compaction waits.
bool within_budget(const ex::cache_footprint& f, const ex::compression_options& c, int length, int layers,
                   std::string& why) {
    if (!c.active()) return true;
    const std::vector<int> budgets = c.layer_budgets(layers, length);
    for (int l = 0; l < layers; ++l) {
        const int budget = std::min(budgets[std::size_t(l)], length);
        const int rows = f.rows_held[std::size_t(l)];
        // compress_every 1 compacts after every step: exactly the budget; else up to N - 1 more.
        const bool ok = c.compress_every == 1 ? rows == budget : rows <= budget + c.compress_every - 1;
        if (!ok) {
            why = "layer " + std::to_string(l) + " held " + std::to_string(rows) + " rows for a budget of " +
                  std::to_string(budget) + " (length " + std::to_string(length) + ")";
            return false;
        }
    }
    return true;
}

struct settings {
    std::vector<int> budgets_percent;
    std::vector<kvcache::eviction_policy> policies;
    ex::compression_options base;  // sinks, recent, schedule, layer budgets
    ex::cache_options cache;
};

// The cache options of one policy whose budget is `percent` of a `context`-token sequence.
ex::cache_options options_for(const settings& s, kvcache::eviction_policy policy, int percent, int context) {
    ex::cache_options cache = s.cache;
    cache.compression = s.base;
    cache.compression.policy = policy;
    if (policy != kvcache::eviction_policy::none) {
        const int tokens = std::max(s.base.sinks + s.base.recent, (context * percent + 50) / 100);
        cache.compression.budget = kvcache::eviction_budget::of_tokens(tokens);
    }
    return cache;
}

int run(int argc, char** argv) {
    ex::arguments args(argc, argv, {"--help", "--full"},
                       {"--model", "--windows", "--recall", "--budgets", "--policies", "--layer-budgets",
                        "--compress-every", "--sinks", "--recent", "--page-size", "--threads", "--json"});
    if (args.has("--help")) {
        std::cout << usage;
        return 0;
    }
    if (!args.has("--model")) throw ex::usage_error("--model DIR is required (see --help)");
    const std::string dir = args.text("--model", "");
    const bool full = args.has("--full");
    const int window_count = args.integer("--windows", full ? 0 : 1, 0, 1 << 20);
    const int recall_count = args.integer("--recall", full ? 0 : 4, 0, 1 << 20);
    const int threads = args.integer("--threads", 1, 1, 1024);

    settings s;
    s.budgets_percent = args.integers("--budgets", {10, 25, 50}, 1, 100);
    for (const std::string& name : ex::split_commas(args.text("--policies", "streaming,h2o,snapkv,tova,knorm,random")))
        s.policies.push_back(kvcache::parse_eviction_policy(name));
    const std::string layer_budgets = args.text("--layer-budgets", "uniform");
    if (layer_budgets != "uniform" && layer_budgets != "pyramid")
        throw ex::usage_error("--layer-budgets '" + layer_budgets + "' is not one of uniform, pyramid");
    s.base.pyramid = layer_budgets == "pyramid";
    s.base.compress_every = args.integer("--compress-every", 1, 0, 1 << 20);
    s.base.sinks = args.integer("--sinks", 4, 0, 1 << 20);
    s.base.recent = args.integer("--recent", 4, 0, 1 << 20);
    s.cache.layout = kvcache::layout_kind::paged;
    s.cache.page_size = args.integer("--page-size", 16, 1, 1 << 16);

    ex::thread_pool pool(threads);
    kvcache::cpu::set_thread_count(threads);
    ex::llama_model model(ex::load_checkpoint(dir, ex::read_model_config(dir)), pool);
    const ex::model_config& config = model.config();
    const int bos = 256;
    const int window_bytes = 255;
    const auto windows = ex::byte_windows(ex::read_file_bytes(dir + "/heldout_sample.txt"), window_bytes, bos, window_count);
    std::vector<ex::recall_item> recall = ex::read_recall_set(dir + "/recall_set.json");
    if (recall_count > 0 && recall.size() > std::size_t(recall_count)) recall.resize(std::size_t(recall_count));
    const int context = window_bytes + 1, prompt = context / 2;

    std::printf("model: %s (%s)\n", dir.c_str(), config.describe().c_str());
    std::printf("held-out: %zu windows of %d tokens, the first %d prefilled, the other %d decoded and scored; "
                "recall: %zu texts, prefilled up to their first answer\n",
                windows.size(), context, prompt, context - prompt, recall.size());
    std::printf("cache: paged fp32, page %d; sinks %d, recent %d, %s budgets, compaction after the prefill and every "
                "%d decode steps; snapkv observes the prompt's last %d queries\n",
                s.cache.page_size, s.base.sinks, s.base.recent, layer_budgets.c_str(), s.base.compress_every,
                s.base.observation_window);

    // rows[budget][policy]; policy index 0 is the full cache, shared by every budget.
    std::vector<kvcache::eviction_policy> columns{kvcache::eviction_policy::none};
    columns.insert(columns.end(), s.policies.begin(), s.policies.end());
    std::vector<std::vector<tally>> tallies(s.budgets_percent.size(), std::vector<tally>(columns.size()));
    tally full_cache;

    for (std::size_t w = 0; w < windows.size(); ++w) {
        const std::vector<int>& tokens = windows[w];
        std::vector<std::vector<double>> reference;  // the full cache's log-probabilities, per decoded position
        auto run_one = [&](tally& t, const ex::cache_options& cache, bool is_reference) {
            std::size_t step = 0;
            const ex::cache_footprint f = ex::teacher_force_with_kvcache<compress_configurations>(
                model, tokens, context, cache,
                [&](int position, const float* logits, int vocab) {
                    std::vector<double> lp = ex::log_probabilities(logits, vocab);
                    t.nats -= lp[std::size_t(tokens[std::size_t(position) + 1])];
                    ++t.scored;
                    if (is_reference) {
                        reference.push_back(std::move(lp));
                    } else {
                        const double kl = ex::kl_divergence(reference.at(step++), lp);
                        t.kl_max = std::max(t.kl_max, kl);
                        t.kl_sum += kl;
                        ++t.kl_count;
                    }
                },
                prompt);
            t.bytes += double(f.bytes_used);
            ++t.windows;
            t.decode_seconds += f.decode_seconds;
            t.decode_steps += f.decode_steps;
            std::string why;
            if (t.budget_held && !within_budget(f, cache.compression, context - 1, config.num_layers, why)) {
                t.budget_held = false;
                t.budget_violation = why;
            }
        };
        run_one(full_cache, options_for(s, kvcache::eviction_policy::none, 100, context), true);
        for (std::size_t b = 0; b < s.budgets_percent.size(); ++b)
            for (std::size_t p = 1; p < columns.size(); ++p)
                run_one(tallies[b][p], options_for(s, columns[p], s.budgets_percent[b], context), false);
    }

    for (const ex::recall_item& item : recall) {
        int end = 0;
        for (const ex::recall_query& q : item.answers) end = std::max(end, q.first + q.length);
        const int first_answer = item.answers.empty() ? 1 : std::max(1, item.answers.front().first);
        auto run_one = [&](tally& t, const ex::cache_options& cache) {
            std::vector<int> predicted(item.tokens.size(), -1);
            ex::teacher_force_with_kvcache<compress_configurations>(
                model, item.tokens, end, cache,
                [&](int position, const float* logits, int vocab) {
                    predicted[std::size_t(position) + 1] = ex::argmax(logits, vocab);
                },
                first_answer);
            for (const ex::recall_query& q : item.answers) {
                t.recall_right += std::equal(predicted.begin() + q.first, predicted.begin() + q.first + q.length,
                                             item.tokens.begin() + q.first);
                ++t.recall_total;
            }
        };
        if (end < 2) continue;
        run_one(full_cache, options_for(s, kvcache::eviction_policy::none, 100, end));
        for (std::size_t b = 0; b < s.budgets_percent.size(); ++b)
            for (std::size_t p = 1; p < columns.size(); ++p)
                run_one(tallies[b][p], options_for(s, columns[p], s.budgets_percent[b], end));
    }

    auto ms_per_token = [](const tally& t) { return t.decode_steps ? t.decode_seconds / double(t.decode_steps) * 1e3 : 0.0; };
    auto mean_bytes = [](const tally& t) { return t.windows ? t.bytes / double(t.windows) : 0.0; };
    auto kl_mean = [](const tally& t) { return t.kl_count ? t.kl_sum / double(t.kl_count) : 0.0; };
    // Relative to the full cache: perplexity - 1 and the fraction of its bytes.
    auto perplexity_vs_full = [&](const tally& t) { return t.perplexity() / full_cache.perplexity() - 1.0; };
    auto bytes_vs_full = [&](const tally& t) {
        return mean_bytes(full_cache) > 0 ? mean_bytes(t) / mean_bytes(full_cache) : 0.0;
    };
    std::printf("\nfull cache: perplexity %.4f, recall %d/%d, %.0f bytes held at the end of a window, %.3f ms/token\n",
                full_cache.perplexity(), full_cache.recall_right, full_cache.recall_total, mean_bytes(full_cache),
                ms_per_token(full_cache));
    bool all_held = true, all_fewer = true;
    for (std::size_t b = 0; b < s.budgets_percent.size(); ++b) {
        const int percent = s.budgets_percent[b];
        std::printf("\nbudget %d%% of the context (%d of %d held-out tokens per layer; recall: %d%% of each text)\n",
                    percent, options_for(s, s.policies.empty() ? kvcache::eviction_policy::streaming : s.policies[0],
                                         percent, context).compression.budget.tokens,
                    context, percent);
        std::printf("| policy | perplexity | vs full | recall | KL max | KL mean | bytes held | vs full | ms/token |\n");
        std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for (std::size_t p = 1; p < columns.size(); ++p) {
            const tally& t = tallies[b][p];
            std::printf("| %s | %.4f | %+.2f%% | %d/%d | %.4f | %.5f | %.0f | %.0f%% | %.3f |\n",
                        kvcache::to_string(columns[p]), t.perplexity(), perplexity_vs_full(t) * 100.0,
                        t.recall_right, t.recall_total, t.kl_max, kl_mean(t), mean_bytes(t), bytes_vs_full(t) * 100.0,
                        ms_per_token(t));
            if (!t.budget_held) {
                all_held = false;
                std::printf("  %s: %s\n", kvcache::to_string(columns[p]), t.budget_violation.c_str());
            }
            all_fewer = all_fewer && (windows.empty() || mean_bytes(t) < mean_bytes(full_cache) || percent == 100);
        }
    }
    if (args.has("--json")) {
        // One result per policy and budget, plus the full cache, in kvcache_bench's schema.
        auto metrics_of = [&](const tally& t) {
            return nlohmann::json{{"perplexity", t.perplexity()},
                                  {"perplexity_vs_full", perplexity_vs_full(t)},
                                  {"recall_right", t.recall_right},
                                  {"recall_total", t.recall_total},
                                  {"kl_max", t.kl_max},
                                  {"kl_mean", kl_mean(t)},
                                  {"bytes_held", mean_bytes(t)},
                                  {"bytes_vs_full", bytes_vs_full(t)},
                                  {"ms_per_token", ms_per_token(t)}};
        };
        nlohmann::json results = nlohmann::json::array();
        results.push_back({{"benchmark", "compress_quality"},
                           {"params", {{"policy", "none"}, {"budget_percent", 100}}},
                           {"metrics", metrics_of(full_cache)}});
        for (std::size_t b = 0; b < s.budgets_percent.size(); ++b)
            for (std::size_t p = 1; p < columns.size(); ++p)
                results.push_back({{"benchmark", "compress_quality"},
                                   {"params", {{"policy", kvcache::to_string(columns[p])},
                                               {"budget_percent", s.budgets_percent[b]},
                                               {"layer_budgets", layer_budgets}}},
                                   {"metrics", metrics_of(tallies[b][p])}});
        const nlohmann::json machine{{"program", "07_compress"},
                                     {"model", dir},
                                     {"model_config", config.describe()},
                                     {"windows", windows.size()},
                                     {"recall_texts", recall.size()},
                                     {"threads", threads}};
        ex::write_json_report(args.text("--json", ""), machine, results);
    }
    std::printf("\nevery policy held its budget in every layer: %s\n", all_held ? "yes" : "no");
    std::printf("every policy held fewer bytes than the full cache: %s\n", all_fewer ? "yes" : "no");
    return all_held && all_fewer ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("07_compress", [&] { return run(argc, argv); });
}
