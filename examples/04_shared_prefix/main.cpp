// 04_shared_prefix: many requests sharing one long system prompt on the
// paged layout. The prompt's K/V are written once; each request is a fork
// that shares its pages by reference count; the first write of a request
// into the shared, partly filled last page copies that one page (copy on
// write). The same requests in an unshared cache give the memory to compare
// with and the attention outputs the shared ones must equal.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common/arguments.hpp"
#include "common/model_weights.hpp"
#include "common/run_main.hpp"
#include "kvcache/backend/cpu.hpp"
#include "kvcache/cache/paged_cache.hpp"

namespace ex = kvcache::examples;

namespace {

using heads = kvcache::head_config<8, 2, 64>;
constexpr int kv_row = heads::kv_heads * heads::head_dim;
constexpr int q_row = heads::query_heads * heads::head_dim;

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

options:
  --requests N    requests sharing the prompt (default 8)
  --system N      system prompt tokens (default 1000)
  --question N    tokens of each request's own question; request i has N - i % 4 (default 24)
  --decode N      decode steps per request (default 8)
  --page-size N   tokens per page (default 16)
  --layers N      layers (default 4)
  --dtype TYPE    fp32 | fp16: the cache's element type (default fp32)
  --threads N     CPU threads (default: all cores)
  --seed N        seed of the keys, values and queries (default 1)
  --help          this text
)";

struct settings {
    int requests = 8, system = 1000, question = 24, decode = 8, page_size = 16, layers = 4, seed = 1;
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

/// Runs the requests' questions (batched prefill) and decode steps (batched decode).
/// `reserved(r)` runs after request r's question positions are reserved (where copy on write happens).
template <class Cache, class Hook>
outputs run_requests(Cache& cache, const std::vector<kvcache::sequence_id>& requests, const workload& w,
                     const settings& s, Hook&& reserved) {
    outputs out;
    for (std::size_t r = 0; r < requests.size(); ++r) {
        cache.begin_append(requests[r], w.question_offsets[r + 1] - w.question_offsets[r]);
        reserved(r);
    }
    for (int l = 0; l < s.layers; ++l) {
        const auto view = cache.view(l, requests);
        kvcache::cpu::append(view, w.question_keys[l], w.question_values[l], w.question_offsets);
        out.values.emplace_back(w.question_queries[l].size());
        kvcache::cpu::prefill_attention(view, w.question_queries[l], w.question_offsets,
                                        out.values.back());
    }
    std::vector<int> one_each(requests.size() + 1);
    for (std::size_t i = 0; i < one_each.size(); ++i) one_each[i] = static_cast<int>(i);
    for (int step = 0; step < s.decode; ++step) {
        for (auto id : requests) cache.begin_append(id, 1);
        for (int l = 0; l < s.layers; ++l) {
            const std::size_t i = std::size_t(step) * s.layers + l;
            const auto view = cache.view(l, requests);
            kvcache::cpu::append(view, w.step_keys[i], w.step_values[i], one_each);
            out.values.emplace_back(w.step_queries[i].size());
            kvcache::cpu::decode_attention(view, w.step_queries[i], out.values.back());
        }
    }
    return out;
}

/// Writes the system prompt's K/V of every layer into sequence id.
template <class Cache>
void write_system_prompt(Cache& cache, kvcache::sequence_id id, const workload& w, const settings& s) {
    cache.begin_append(id, s.system);
    const int offsets[2] = {0, s.system};
    for (int l = 0; l < s.layers; ++l)
        kvcache::cpu::append(cache.view(l, {id}), w.system_keys[l], w.system_values[l], offsets);
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
                s.layers, heads::query_heads, heads::kv_heads, heads::head_dim,
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

    // Copy on write, watched on request 0: reserving its question's positions writes into the
    // shared, partly filled last page, so that one page is copied first.
    const std::vector<int> before = shared.pages(forks[0]);
    std::vector<int> after;
    std::uint64_t first_copies = 0;
    const outputs with_sharing = run_requests(shared, forks, w, s, [&](std::size_t r) {
        if (r != 0) return;
        after = shared.pages(forks[0]);
        first_copies = shared.statistics().copies;
        if (partial)
            std::printf("request 0 diverges: copy on write copied %llu page (page %d -> %d, its %d prompt rows "
                        "carried over); pages %d..%d stay shared (%d references), the root's page %d now has %d\n",
                        static_cast<unsigned long long>(first_copies), before.back(), after[system_pages - 1],
                        s.system % P, before.front(), before[std::max(0, full_system_pages - 1)],
                        shared.page_references(before.front()), before.back(), shared.page_references(before.back()));
        else
            std::printf("request 0 diverges: the prompt ends on a page boundary, so it takes fresh pages and "
                        "copies %llu\n", static_cast<unsigned long long>(first_copies));
    });
    const bool kept_full_pages = std::equal(before.begin(), before.begin() + full_system_pages, after.begin());
    const bool one_copy = first_copies == (partial ? 1u : 0u) && kept_full_pages;
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
    const outputs without_sharing = run_requests(unshared, alone, w, s, [](std::size_t) {});

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
    return shared_by_count && one_copy && pages_as_expected && copies_ok && equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("04_shared_prefix", [&]() -> int {
        ex::arguments args(argc, argv, {"--help"},
                           {"--requests", "--system", "--question", "--decode", "--page-size", "--layers", "--dtype",
                            "--threads", "--seed"});
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
        const kvcache::element_kind element = args.element("--dtype", kvcache::element_kind::fp32);
        kvcache::cpu::set_thread_count(args.integer("--threads", 0, 0, 1024));
        return element == kvcache::element_kind::fp16 ? run<kvcache::half>(s) : run<float>(s);
    });
}
