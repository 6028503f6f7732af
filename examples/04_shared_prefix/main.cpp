// 04_shared_prefix: many requests sharing one long system prompt on the
// paged layout. The prompt's K/V are written once; each request is a fork
// that shares its pages by reference count; the first write of a request
// into the shared, partly filled last page copies that one page (copy on
// write). The same requests in an unshared cache give the memory to compare
// with and the attention outputs the shared ones must equal. Then cascade
// attention: the batch's decode queries attend to the shared prompt once
// (one prefill call over the prompt sequence, the queries placed past its
// end) and to each request's own suffix separately, merged per query row;
// it must equal per-request attention over prompt + suffix, and its K/V
// bytes and wall time are compared with it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common/run_main.hpp"
#include "kvcache/backend/cpu.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/step_plan.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/model_weights.hpp"
#include "kvcache_engine/timing.hpp"

namespace ex = kvcache::examples;

namespace {

using heads = kvcache::head_config<8, 2, 64>;
constexpr int kv_row = heads::kv_heads() * heads::head_dim;
constexpr int q_row = heads::query_heads() * heads::head_dim;

const char* usage = R"(usage: 04_shared_prefix [options]

Many requests share one long system prompt in a paged KV cache. The prompt's
keys and values (seeded random, every layer) are written once into a root
sequence; each request forks it, so the prompt's pages are shared by
reference count. Each request then appends its own question (a batched
prefill) and decodes a few tokens (batched decode); its first write into the
shared, partly filled last page copies exactly that page. The same requests
are run in a cache without sharing. Prints reference counts, the copies, the
memory used with and without sharing, and checks that every attention output
equals the unshared one.

Then cascade attention over the forked requests: one decode query each (every
layer), attended to the system prompt once for the whole batch (one prefill
call over the root sequence, the queries at positions past its end, lse on)
and to each request's own rows (its question and decode tokens, in a suffix
sequence of their own; a batched decode, lse on), merged two states per
query row. Checks it equals per-request decode attention over the forks
(prompt + suffix each) within 1e-5 and prints the K/V bytes each reads and
the wall time of both (median, min and max of interleaved repetitions).

options:
  --requests N    requests sharing the prompt (default 8)
  --system N      system prompt tokens (default 1000)
  --question N    tokens of each request's own question; request i has N - i % 4 (default 24)
  --decode N      decode steps per request (default 8)
  --page-size N   tokens per page (default 16)
  --layers N      layers (default 4)
  --dtype TYPE    fp32 | fp16 | bf16: the cache's element type (default fp32)
  --threads N     CPU threads (default: all cores)
  --seed N        seed of the keys, values and queries (default 1)
  --repeats N     timed repetitions of each cascade measurement (default 21)
  --help          this text
)";

struct settings {
    int requests = 8, system = 1000, question = 24, decode = 8, page_size = 16, layers = 4, seed = 1, repeats = 21;
};

/// All K/V and queries of the run, made once so both caches get the same numbers.
struct workload {
    std::vector<std::vector<float>> system_keys, system_values;  // [layer][system][kv_row]
    std::vector<int> question_offsets;                           // CSR over requests
    std::vector<std::vector<float>> question_keys, question_values, question_queries;  // [layer][...]
    std::vector<std::vector<float>> step_keys, step_values, step_queries;  // [step * layers + layer][requests][...]

    workload(const settings& s) {
        ex::seeded_random random(static_cast<std::uint64_t>(s.seed) * 104729u + 5u);
        auto fill = [&](std::size_t n) {
            std::vector<float> v(n);
            for (auto& x : v) x = random.uniform();
            return v;
        };
        question_offsets.push_back(0);
        for (int r = 0; r < s.requests; ++r)
            question_offsets.push_back(question_offsets.back() + std::max(1, s.question - r % 4));
        const std::size_t q_tokens = question_offsets.back();
        for (int l = 0; l < s.layers; ++l) {
            system_keys.push_back(fill(std::size_t(s.system) * kv_row));
            system_values.push_back(fill(std::size_t(s.system) * kv_row));
            question_keys.push_back(fill(q_tokens * kv_row));
            question_values.push_back(fill(q_tokens * kv_row));
            question_queries.push_back(fill(q_tokens * q_row));
        }
        for (int i = 0; i < s.decode * s.layers; ++i) {
            step_keys.push_back(fill(std::size_t(s.requests) * kv_row));
            step_values.push_back(fill(std::size_t(s.requests) * kv_row));
            step_queries.push_back(fill(std::size_t(s.requests) * q_row));
        }
    }
};

/// The attention outputs of the questions (prefill) and of every decode step, per layer.
struct outputs {
    std::vector<std::vector<float>> values;
};

/// Runs the requests' questions (batched prefill) and decode steps (batched decode), each
/// step one plan: it reserves every request's new positions (all layers) and its tables serve
/// every layer. `planned()` runs once the questions' plan is made (where copy on write happens).
template <class Cache, class Hook>
outputs run_requests(Cache& cache, const std::vector<kvcache::sequence_id>& requests, const workload& w,
                     const settings& s, Hook&& planned) {
    const kvcache::cpu_backend cpu;
    outputs out;
    std::vector<int> question_tokens;
    for (std::size_t r = 0; r < requests.size(); ++r)
        question_tokens.push_back(w.question_offsets[r + 1] - w.question_offsets[r]);
    auto plan = cache.plan(requests, question_tokens);  // its new-token offsets are w.question_offsets
    planned();
    for (int l = 0; l < s.layers; ++l) {
        const auto view = plan.view(l);
        cpu.append(kvcache::append_params(view, w.question_keys[l], w.question_values[l], plan.new_token_offsets()));
        out.values.emplace_back(w.question_queries[l].size());
        cpu.prefill(kvcache::prefill_params(view, w.question_queries[l], plan.new_token_offsets(), out.values.back()));
    }
    const std::vector<int> one_each(requests.size(), 1);
    for (int step = 0; step < s.decode; ++step) {
        cache.replan(plan, requests, one_each);  // the same plan's buffers, step after step
        for (int l = 0; l < s.layers; ++l) {
            const std::size_t i = std::size_t(step) * s.layers + l;
            const auto view = plan.view(l);
            cpu.append(kvcache::append_params(view, w.step_keys[i], w.step_values[i], plan.new_token_offsets()));
            out.values.emplace_back(w.step_queries[i].size());
            cpu.decode(kvcache::decode_params(view, w.step_queries[i], out.values.back()));
        }
    }
    return out;
}

/// Writes the system prompt's K/V of every layer into sequence id.
template <class Cache>
void write_system_prompt(Cache& cache, kvcache::sequence_id id, const workload& w, const settings& s) {
    const kvcache::cpu_backend cpu;
    const auto plan = cache.plan({id}, {s.system});
    for (int l = 0; l < s.layers; ++l)
        cpu.append(kvcache::append_params(plan.view(l), w.system_keys[l], w.system_values[l], plan.new_token_offsets()));
}

/// Median, min and max of timed repetitions, in seconds.
struct timing {
    double median = 0, min = 0, max = 0;
};
timing summarise(std::vector<double> times) {
    std::sort(times.begin(), times.end());
    const std::size_t n = times.size();
    return {n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]), times.front(), times.back()};
}

/// Largest difference cascade attention may have from per-request attention: the outputs
/// are convex combinations of values in [-1, 1], and the two differ only in float rounding.
constexpr double cascade_tolerance = 1e-5;

/// Cascade attention for one decode query per request over the forked requests, checked
/// against per-request attention over the forks and measured against it. Returns true when
/// within cascade_tolerance.
template <class Cache>
bool cascade(Cache& cache, kvcache::sequence_id root, const std::vector<kvcache::sequence_id>& forks,
             const settings& s) {
    using element = typename Cache::element_type;
    const kvcache::cpu_backend cpu;
    const int R = static_cast<int>(forks.size()), rows = R * heads::query_heads();
    const int prefix = cache.length(root);

    // Each request's suffix (its own rows past the prompt) in a sequence of its own, so a view
    // presents it alone: read back from the fork, written through a plan of a second cache.
    std::vector<int> suffix_lengths;
    int suffix_pages = 0;
    for (auto id : forks) {
        suffix_lengths.push_back(cache.length(id) - prefix);
        suffix_pages += (suffix_lengths.back() + s.page_size - 1) / s.page_size;
    }
    Cache suffix_cache(s.layers, suffix_pages, s.page_size, /*prefix_caching=*/false);
    std::vector<kvcache::sequence_id> suffixes;
    for (int r = 0; r < R; ++r) suffixes.push_back(suffix_cache.add_sequence());
    {
        const auto fill = suffix_cache.plan(suffixes, suffix_lengths);
        const int total = fill.total_new_tokens();
        std::vector<element> keys(std::size_t(total) * kv_row), values(keys.size());
        for (int l = 0; l < s.layers; ++l) {
            for (int r = 0; r < R; ++r) {
                const std::size_t at = std::size_t(fill.host_offsets()[r]) * kv_row, n = std::size_t(suffix_lengths[r]) * kv_row;
                cache.read(forks[r], l, prefix, suffix_lengths[r], kvcache::span<element>(keys.data() + at, n),
                           kvcache::span<element>(values.data() + at, n));
            }
            cpu.append(kvcache::append_params(fill.view(l), keys, values, fill.new_token_offsets()));
        }
    }

    // One decode query per request and layer, and three plans side by side: the forks
    // (per-request attention), the prompt alone and the suffixes (cascade).
    ex::seeded_random random(static_cast<std::uint64_t>(s.seed) * 7919u + 3u);
    std::vector<std::vector<float>> queries(s.layers, std::vector<float>(std::size_t(rows) * heads::head_dim));
    for (auto& q : queries)
        for (auto& x : q) x = random.uniform();
    const auto per_request = cache.plan(forks);         // attend only: nothing reserved
    const auto prompt = cache.plan({root});
    const auto own = suffix_cache.plan(suffixes);
    const std::vector<int> prompt_offsets{0, R};          // the one prompt sequence has R query tokens
    const std::vector<int> past_prompt(R, prefix);        // each query sees the whole prompt
    std::vector<std::vector<float>> plain(s.layers, std::vector<float>(queries[0].size()));
    std::vector<std::vector<float>> merged = plain;
    std::vector<float> states(2 * queries[0].size()), lse(2 * std::size_t(rows));  // [prompt | suffix]
    const std::size_t half_states = queries[0].size();

    auto run_per_request = [&] {
        for (int l = 0; l < s.layers; ++l) cpu.decode(kvcache::decode_params(per_request.view(l), queries[l], plain[l]));
    };
    auto run_cascade = [&] {
        for (int l = 0; l < s.layers; ++l) {
            kvcache::prefill_params shared_part(prompt.view(l), queries[l], prompt_offsets,
                                                kvcache::span<float>(states.data(), half_states));
            shared_part.lse = kvcache::span<float>(lse.data(), rows);
            shared_part.query_positions = past_prompt;
            cpu.prefill(shared_part);
            kvcache::decode_params own_part(own.view(l), queries[l], kvcache::span<float>(states.data() + half_states, half_states));
            own_part.lse = kvcache::span<float>(lse.data() + rows, rows);
            cpu.decode(own_part);
            cpu.merge(kvcache::merge_params(2, rows, heads::head_dim, states, lse, merged[l]));
        }
    };
    auto seconds_of = [](auto&& f) {
        const auto start = std::chrono::steady_clock::now();
        f();
        return ex::seconds_since(start);
    };
    run_per_request();
    run_cascade();
    double max_difference = 0;
    for (int l = 0; l < s.layers; ++l)
        for (std::size_t i = 0; i < plain[l].size(); ++i)
            max_difference = std::max(max_difference, double(std::fabs(plain[l][i] - merged[l][i])));
    std::vector<double> plain_times, cascade_times;
    for (int i = 0; i < s.repeats; ++i) {  // interleaved, so drifts of the machine hit both alike
        plain_times.push_back(seconds_of(run_per_request));
        cascade_times.push_back(seconds_of(run_cascade));
    }
    const timing tp = summarise(plain_times), tc = summarise(cascade_times);

    // K/V bytes read, counted from the lengths: per-request attention streams prompt + suffix
    // of every request; the CPU prefill streams a KV head's rows once per block of
    // prefill_block_tokens(group) query tokens, so the prompt is read once per block of the batch's queries.
    const double row_bytes = 2.0 * heads::kv_heads() * heads::head_dim * sizeof(element);  // K and V
    long suffix_total = 0;
    for (int n : suffix_lengths) suffix_total += n;
    const int block = kvcache::cpu::detail::prefill_block_tokens(heads::group_size());
    const int blocks = (R + block - 1) / block;
    const double plain_bytes = s.layers * row_bytes * (double(R) * prefix + suffix_total);
    const double cascade_bytes = s.layers * row_bytes * (double(blocks) * prefix + suffix_total);
    const auto [shortest, longest] = std::minmax_element(suffix_lengths.begin(), suffix_lengths.end());

    std::printf("\ncascade attention: a decode query per request, %d requests, prompt %d tokens, suffixes %d..%d, "
                "%d layers, cpu backend, %d threads\n",
                R, prefix, *shortest, *longest, s.layers, cpu.threads());
    std::printf("  %-12s | %14s | %14s | %s\n", "", "per-request", "cascade", "cascade / per-request");
    std::printf("  %-12s | %14.0f | %14.0f | %.3f (the prompt read once per %d-query block: %d block%s)\n",
                "K/V bytes", plain_bytes, cascade_bytes, cascade_bytes / plain_bytes, block, blocks,
                blocks == 1 ? "" : "s");
    std::printf("  %-12s | %14.4f | %14.4f | %.3f (median of %d interleaved runs)\n", "ms median", tp.median * 1e3,
                tc.median * 1e3, tc.median / tp.median, s.repeats);
    auto range = [](const timing& t) {
        char text[64];
        std::snprintf(text, sizeof text, "%.3f..%.3f", t.min * 1e3, t.max * 1e3);
        return std::string(text);
    };
    std::printf("  %-12s | %14s | %14s |\n", "ms min..max", range(tp).c_str(), range(tc).c_str());
    const bool equal = max_difference <= cascade_tolerance;
    std::printf("cascade equals per-request attention (max |difference| %.2e, tolerance %.0e): %s\n", max_difference,
                cascade_tolerance, equal ? "yes" : "no");
    return equal;
}

std::string describe_pages(const std::vector<int>& pages) {
    std::string text;
    const std::size_t shown = std::min<std::size_t>(pages.size(), 6);
    for (std::size_t i = 0; i < shown; ++i) text += (i ? " " : "") + std::to_string(pages[i]);
    if (pages.size() > shown + 1) text += " ...";
    if (pages.size() > shown) text += " " + std::to_string(pages.back());
    return text;
}

template <class Element>
int run(const settings& s) {
    using cache_type = kvcache::paged_cache<Element, heads>;
    const workload w(s);
    const int P = s.page_size;
    auto pages_for = [&](long tokens) { return static_cast<int>((tokens + P - 1) / P); };
    const int system_pages = pages_for(s.system), full_system_pages = s.system / P;
    const bool partial = s.system % P != 0;
    int longest = 0;
    for (int r = 0; r < s.requests; ++r)
        longest = std::max(longest, w.question_offsets[r + 1] - w.question_offsets[r]);
    const int pages_per_request = pages_for(long(s.system) + longest + s.decode);

    // Shared: a root holding the prompt, and one fork per request.
    cache_type shared(s.layers, system_pages + s.requests * (pages_per_request - full_system_pages),
                      P, /*prefix_caching=*/false);
    const kvcache::sequence_id root = shared.add_sequence();
    write_system_prompt(shared, root, w, s);
    std::vector<kvcache::sequence_id> forks;
    for (int r = 0; r < s.requests; ++r) forks.push_back(shared.fork(root));
    const std::size_t page_bytes = shared.bytes_reserved() / std::size_t(shared.page_count());

    std::printf("paged cache: %d layers, %d query / %d KV heads, head_dim %d, %s, page %d tokens (%zu bytes a page, all layers)\n",
                s.layers, heads::query_heads(), heads::kv_heads(), heads::head_dim,
                kvcache::to_string(kvcache::element_traits<Element>::kind), P, page_bytes);
    std::printf("system prompt: %d tokens in %d pages (%d full%s), written once into the root sequence\n", s.system,
                system_pages, full_system_pages,
                partial ? (" + 1 holding " + std::to_string(s.system % P) + " rows").c_str() : "");
    bool shared_by_count = true;
    for (int page : shared.pages(root)) shared_by_count = shared_by_count && shared.page_references(page) == s.requests + 1;
    for (auto id : forks) shared_by_count = shared_by_count && shared.pages(id) == shared.pages(root);
    std::printf("%d requests forked from the root: each has pages [%s], every one referenced %d times\n", s.requests,
                describe_pages(shared.pages(root)).c_str(), shared.page_references(shared.pages(root)[0]));
    std::printf("pages shared by reference count: %s\n", shared_by_count ? "yes" : "no");
    const std::size_t used_after_fork = shared.bytes_used();

    // Copy on write, watched on request 0: the questions' plan reserves their positions, and
    // a request's first write into the shared, partly filled last page copies that page.
    const std::vector<int> before = shared.pages(forks[0]);
    std::vector<int> after;
    const outputs with_sharing = run_requests(shared, forks, w, s, [&] {
        after = shared.pages(forks[0]);
        const std::uint64_t copies = shared.statistics().copies;
        if (partial)
            std::printf("the questions' plan diverges every request: %llu pages copied on write; request 0's page %d "
                        "-> %d (its %d prompt rows carried over); pages %d..%d stay shared (%d references), the "
                        "root's page %d now has %d\n",
                        static_cast<unsigned long long>(copies), before.back(), after[system_pages - 1], s.system % P,
                        before.front(), before[std::max(0, full_system_pages - 1)],
                        shared.page_references(before.front()), before.back(), shared.page_references(before.back()));
        else
            std::printf("the questions' plan diverges every request: the prompt ends on a page boundary, so they "
                        "take fresh pages and copy %llu\n", static_cast<unsigned long long>(copies));
    });
    int request_0_copied = 0;  // of its prompt pages, those replaced by a private copy
    for (int i = 0; i < system_pages; ++i) request_0_copied += before[i] != after[i] ? 1 : 0;
    const bool kept_full_pages = std::equal(before.begin(), before.begin() + full_system_pages, after.begin());
    const bool one_copy = request_0_copied == (partial ? 1 : 0) && kept_full_pages;
    std::printf("copy on write copied exactly %s page%s: %s\n", partial ? "one" : "no", partial ? "" : "s",
                one_copy ? "yes" : "no");
    const std::uint64_t total_copies = shared.statistics().copies;

    // Unshared: every request writes the prompt itself.
    cache_type unshared(s.layers, s.requests * pages_per_request, P, /*prefix_caching=*/false);
    std::vector<kvcache::sequence_id> alone;
    for (int r = 0; r < s.requests; ++r) {
        alone.push_back(unshared.add_sequence());
        write_system_prompt(unshared, alone.back(), w, s);
    }
    const std::size_t unshared_after_prompt = unshared.bytes_used();
    const outputs without_sharing = run_requests(unshared, alone, w, s, [] {});

    double max_difference = 0;
    for (std::size_t i = 0; i < with_sharing.values.size(); ++i)
        for (std::size_t j = 0; j < with_sharing.values[i].size(); ++j)
            max_difference = std::max(max_difference,
                                      double(std::fabs(with_sharing.values[i][j] - without_sharing.values[i][j])));
    // Pages: the shared prompt pages once, plus what each request holds privately.
    long expected_pages = system_pages;
    for (int r = 0; r < s.requests; ++r)
        expected_pages += pages_for(long(s.system) + w.question_offsets[r + 1] - w.question_offsets[r] + s.decode) -
                          full_system_pages;
    const auto stats = shared.statistics();

    std::printf("\n%-28s | %14s | %14s\n", "bytes used", "shared", "unshared");
    std::printf("%-28s | %14zu | %14zu\n", "after the system prompt", used_after_fork, unshared_after_prompt);
    std::printf("%-28s | %14zu | %14zu\n", "after questions and decode", shared.bytes_used(), unshared.bytes_used());
    std::printf("\nmemory used with sharing: %zu bytes (%d pages), without: %zu bytes (%d pages): %.1fx less\n",
                shared.bytes_used(), stats.pages_used, unshared.bytes_used(), unshared.statistics().pages_used,
                double(unshared.bytes_used()) / double(shared.bytes_used()));
    const bool pages_as_expected = stats.pages_used == expected_pages;
    std::printf("pages used with sharing equal the prompt once plus each request's own (%ld): %s\n", expected_pages,
                pages_as_expected ? "yes" : "no");
    const bool copies_ok = total_copies == (partial ? std::uint64_t(s.requests) : 0u);
    std::printf("pages copied on write over all %d requests: %llu (%s: %s)\n", s.requests,
                static_cast<unsigned long long>(total_copies), partial ? "one each" : "none needed",
                copies_ok ? "yes" : "no");
    const bool equal = max_difference == 0.0;
    std::printf("attention outputs (%zu calls) identical to the unshared sequences: %s (max difference %.3g)\n",
                with_sharing.values.size(), equal ? "yes" : "no", max_difference);
    const bool cascade_equal = cascade(shared, root, forks, s);
    return shared_by_count && one_copy && pages_as_expected && copies_ok && equal && cascade_equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("04_shared_prefix", [&]() -> int {
        ex::arguments args(argc, argv, {"--help"},
                           {"--requests", "--system", "--question", "--decode", "--page-size", "--layers", "--dtype",
                            "--threads", "--seed", "--repeats"});
        if (args.has("--help")) {
            std::cout << usage;
            return 0;
        }
        settings s;
        s.requests = args.integer("--requests", 8, 1, 4096);
        s.system = args.integer("--system", 1000, 1, 1 << 20);
        s.question = args.integer("--question", 24, 1, 1 << 16);
        s.decode = args.integer("--decode", 8, 0, 1 << 16);
        s.page_size = args.integer("--page-size", 16, 1, 1 << 16);
        s.layers = args.integer("--layers", 4, 1, 256);
        s.seed = args.integer("--seed", 1, 0, 1 << 30);
        s.repeats = args.integer("--repeats", 21, 1, 100000);
        const kvcache::element_kind element = args.element("--dtype", kvcache::element_kind::fp32);
        // parse_element_kind reads fp8 and int8 names; this program has no path for them
        if (kvcache::is_scaled_kind(element) || element == kvcache::element_kind::int8 ||
            element == kvcache::element_kind::int4)
            throw ex::usage_error("--dtype " + std::string(kvcache::to_string(element)) +
                                  ": 04_shared_prefix runs fp32, fp16 and bf16 caches (02_generate and 06_llama run fp8, int8 and int4)");
        kvcache::cpu::set_thread_count(args.integer("--threads", 0, 0, 1024));
        if (element == kvcache::element_kind::fp16) return run<kvcache::half>(s);
        if (element == kvcache::element_kind::bf16) return run<kvcache::bfloat16>(s);
        return run<float>(s);
    });
}
