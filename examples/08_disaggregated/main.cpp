// 08_disaggregated: prefill and decode in two processes, the prompt's K/V
// pages carried between them over UCX. The example forks itself: the child
// is the prefill worker (runs each prompt, exports its pages, sends them
// with the first generated token), the parent the decode worker (imports
// the pages and generates the rest). Tokens must equal single-process
// generation; prints the bytes and time of each transfer and the decode
// side's time to its first token with the pages against recomputing the
// prompt there. --throughput measures the transport itself instead.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "common/run_main.hpp"
#include "kvcache/cache/page_transfer.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/transport.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/flagship_model.hpp"
#include "kvcache_engine/generation_comparison.hpp"
#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/tiny_llama.hpp"
#include "kvcache_engine/timing.hpp"

namespace ex = kvcache::examples;

namespace {

using cache_type = kvcache::paged_cache<float, ex::flagship_heads>;

const char* usage = R"(usage: 08_disaggregated [options]

Disaggregated prefill and decode: this program forks a prefill worker, which
runs each request's prompt through the model (random weights, the flagship
shape) into a paged KV cache and sends the prompt's pages (page_export) with
the first generated token over UCX to the decode worker (this process); the
decode worker imports them into its own paged cache and generates the rest.
Prints, per request, the bytes and time of the transfer (from the header's
arrival to the payload's end; the first one includes UCX's connection
set-up) and the decode side's time to its first token (transfer + import)
against recomputing the prompt there, and whether the tokens equal
single-process generation.

With --throughput: instead, pages of 1, 16 and 64 MiB (--sizes) go from one
process to the other over shared memory and over TCP loopback, several
rounds each, against a memcpy of the same bytes in the same run.

options:
  --requests N      requests (default 4)
  --prompt N        prompt tokens of request 0; request i has N + 13 i (default 200)
  --new-tokens N    tokens generated per request (default 8)
  --layers N        decoder layers (default 2)
  --page-size N     tokens per page (default 16)
  --threads N       CPU threads per worker (default 1)
  --seed N          weights and prompt seed (default 1)
  --transports TLS  UCX_TLS of both workers (default: UCX's choice)
  --throughput      measure the transport instead (see above)
  --sizes L         --throughput: payload sizes in MiB (default 1,16,64)
  --rounds N        --throughput: rounds per size (default 7)
  --help            this text
)";

/// attention_backend over a sequence already in the cache (the imported pages): the model continues it.
class continue_attention final : public ex::attention_backend {
public:
    continue_attention(cache_type& cache, kvcache::sequence_id id) : cache_(cache), batch_{id} {}
    void begin_tokens(int first_position, int tokens) override {
        kvcache::require(cache_.length(batch_[0]) == first_position, kvcache::error_code::invalid_argument,
                         "the imported sequence holds ", cache_.length(batch_[0]), " tokens, not ", first_position);
        cache_.replan(plan_, batch_, {tokens});
    }
    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        const std::size_t q_count = std::size_t(tokens) * cache_.query_heads() * ex::flagship_heads::head_dim;
        const std::size_t kv_count = std::size_t(tokens) * cache_.kv_heads() * ex::flagship_heads::head_dim;
        ex::append_and_attend(kvcache::cpu_backend{}, plan_, layer, kvcache::span<const float>(q, q_count),
                              kvcache::span<const float>(k, kv_count), kvcache::span<const float>(v, kv_count),
                              kvcache::span<float>(out, q_count));
    }

private:
    cache_type& cache_;
    std::vector<kvcache::sequence_id> batch_;
    cache_type::plan_type plan_;
};

struct settings {
    int requests = 4, prompt = 200, new_tokens = 8, layers = 2, page_size = 16, threads = 1, seed = 1, rounds = 7;
    std::vector<int> sizes;
    kvcache::ucx_options ucx;

    int prompt_of(int r) const { return prompt + 13 * r; }
    int pages_needed() const {
        int pages = 0;
        for (int r = 0; r < requests; ++r) pages += (prompt_of(r) + new_tokens + page_size - 1) / page_size;
        return pages;
    }
};

std::vector<int> prompt_tokens(const settings& s, int r, int vocab) {
    return ex::seeded_prompt(s.prompt_of(r), vocab, std::uint64_t(s.seed) * 1000 + std::uint64_t(r));
}

/// The prefill worker: runs each prompt, sends its pages with the first token (the tag).
int prefill_worker(const settings& s, std::uint16_t port) {
    const ex::model_config config = ex::flagship_config(s.layers);
    ex::thread_pool pool(s.threads);
    ex::llama_model model(ex::make_random_weights(config, std::uint64_t(s.seed)), pool);
    cache_type cache(s.layers, s.pages_needed(), s.page_size);
    kvcache::ucx_sender sender("127.0.0.1", port, s.ucx);
    for (int r = 0; r < s.requests; ++r) {
        const std::vector<int> prompt = prompt_tokens(s, r, config.vocab_size);
        ex::kvcache_attention<cache_type> attention(cache);
        const std::vector<float> logits = model.forward(prompt.data(), int(prompt.size()), 0, attention);
        const int first = ex::argmax(logits.data(), int(logits.size()));
        sender.send(kvcache::export_pages(cache, attention.sequence()), std::uint64_t(first));
        // UCX moves data only while this process progresses it: wait for the transfer before the
        // next prompt's compute (an engine would progress from a thread of its own and overlap them).
        sender.flush();
    }
    std::printf("prefill worker: UCX lanes of the transfers:\n%s", sender.describe().c_str());
    return 0;
}

/// The decode worker: imports each request's pages, generates the rest, checks the tokens.
int decode_worker(const settings& s, kvcache::ucx_receiver& receiver) {
    const ex::model_config config = ex::flagship_config(s.layers);
    ex::thread_pool pool(s.threads);
    ex::llama_model model(ex::make_random_weights(config, std::uint64_t(s.seed)), pool);
    cache_type cache(s.layers, s.pages_needed(), s.page_size);
    bool all_identical = true;
    std::size_t all_bytes = 0;
    for (int r = 0; r < s.requests; ++r) {
        const std::vector<int> prompt = prompt_tokens(s, r, config.vocab_size);
        kvcache::received_pages<float> got = receiver.receive<float>();
        const auto received = std::chrono::steady_clock::now();
        const kvcache::sequence_id id = kvcache::import_pages(cache, got.pages);
        const double import_ms = ex::seconds_since(received) * 1e3;
        // The first token came with the pages: the decode side has it once they are in (from the header's arrival).
        const double ready_ms = got.seconds * 1e3 + import_ms;
        std::vector<int> tokens{int(got.user_tag)};
        {
            continue_attention attention(cache, id);
            for (int step = 1; step < s.new_tokens; ++step) {
                const int position = int(prompt.size()) + step - 1;
                const std::vector<float> logits = model.forward(&tokens.back(), 1, position, attention);
                tokens.push_back(ex::argmax(logits.data(), int(logits.size())));
            }
        }
        cache.remove_sequence(id);
        // The same request in one process, and the prompt recomputed here (what the decode side saves).
        cache_type single(s.layers, s.pages_needed(), s.page_size);
        ex::kvcache_attention<cache_type> local(single);
        const auto recompute_start = std::chrono::steady_clock::now();
        const std::vector<float> logits = model.forward(prompt.data(), int(prompt.size()), 0, local);
        const double recompute_ms = ex::seconds_since(recompute_start) * 1e3;
        std::vector<int> reference{ex::argmax(logits.data(), int(logits.size()))};
        for (int step = 1; step < s.new_tokens; ++step) {
            const int position = int(prompt.size()) + step - 1;
            const std::vector<float> next = model.forward(&reference.back(), 1, position, local);
            reference.push_back(ex::argmax(next.data(), int(next.size())));
        }
        const bool identical = tokens == reference;
        all_identical = all_identical && identical;
        all_bytes += got.bytes;
        std::printf("request %d: prompt %zu tokens, %zu bytes in %.3f ms (%.1f MB/s), import %.3f ms; decode side's "
                    "first token after %.3f ms with the pages vs %.3f ms recomputing the prompt; tokens identical: %s\n",
                    r, prompt.size(), got.bytes, got.seconds * 1e3, got.bytes / std::max(got.seconds, 1e-9) / 1e6,
                    import_ms, ready_ms, recompute_ms, identical ? "yes" : "no");
    }
    std::printf("pages of %d requests received: %zu bytes\n", s.requests, all_bytes);
    std::printf("tokens identical to single-process generation: %s\n", all_identical ? "yes" : "no");
    return all_identical ? 0 : 1;
}

/// Median, min and max of samples.
struct summary {
    double median, min, max;
};
summary summarise(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

/// An export of about mib MiB of rows (one layer, synthetic), as the transport carries it.
kvcache::page_export<float> synthetic_export(int mib) {
    kvcache::page_export<float> e;
    e.heads = kvcache::shape_of<ex::flagship_heads>();
    e.page_size = 16, e.layers = 1;
    const std::size_t per_token = 2 * std::size_t(e.heads.kv_heads) * e.heads.head_dim;  // elements, K and V
    e.length = int(std::size_t(mib) * (1 << 20) / sizeof(float) / per_token);
    e.scales.assign(1, kvcache::kv_scales{});
    e.page_checksums.assign(std::size_t(e.page_count()), 0);
    e.payload.assign(std::size_t(e.length) * per_token, 0.5f);
    return e;
}

/// The sender's side of --throughput: each size, rounds times, each send flushed (the receiver has it).
int throughput_sender(const settings& s, std::uint16_t port, const char* name) {
    kvcache::ucx_sender sender("127.0.0.1", port, s.ucx);
    sender.send(synthetic_export(1));  // connection and wireup out of the way
    sender.flush();
    for (int mib : s.sizes) {
        kvcache::page_export<float> e = synthetic_export(mib);
        std::vector<double> seconds, copy_seconds;
        std::vector<float> target(e.payload.size());
        for (int round = 0; round < s.rounds; ++round) {
            auto start = std::chrono::steady_clock::now();
            std::memcpy(target.data(), e.payload.data(), e.payload_bytes());
            copy_seconds.push_back(ex::seconds_since(start));
            kvcache::page_export<float> copy = e;  // send() takes its export: copied before the clock starts
            start = std::chrono::steady_clock::now();
            sender.send(std::move(copy));
            sender.flush();
            seconds.push_back(ex::seconds_since(start));
        }
        const summary t = summarise(seconds), c = summarise(copy_seconds);
        const double bytes = double(e.payload_bytes());
        std::printf("%-5s %4d MiB: UCX %8.2f GB/s (min %.2f, max %.2f) | memcpy %8.2f GB/s (min %.2f, max %.2f)\n", name,
                    mib, bytes / t.median / 1e9, bytes / t.max / 1e9, bytes / t.min / 1e9, bytes / c.median / 1e9,
                    bytes / c.max / 1e9, bytes / c.min / 1e9);
    }
    std::printf("%-5s lanes:\n%s", name, sender.describe().c_str());
    return 0;
}

/// Forks the child (the sender) and runs parent(receiver) here; the child's exit status is folded in.
template <class Child, class Parent>
int two_workers(const settings& s, Child&& child, Parent&& parent) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
        close(fds[1]);
        std::uint16_t port = 0;
        int status = 3;
        if (read(fds[0], &port, sizeof port) == sizeof port)
            status = ex::run_main("08_disaggregated (prefill worker)", [&] { return child(port); });
        std::fflush(nullptr);
        _exit(status);
    }
    close(fds[0]);
    int result = 1;
    try {
        kvcache::ucx_receiver receiver(s.ucx);
        const std::uint16_t port = receiver.port();
        if (write(fds[1], &port, sizeof port) != sizeof port) throw std::runtime_error("cannot tell the worker the port");
        close(fds[1]);
        result = parent(receiver);
    } catch (...) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        throw;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::printf("the prefill worker failed (status %d)\n", status);
        return 1;
    }
    return result;
}

int run(int argc, char** argv) {
    ex::arguments args(argc, argv, {"--help", "--throughput"},
                       {"--requests", "--prompt", "--new-tokens", "--layers", "--page-size", "--threads", "--seed",
                        "--transports", "--sizes", "--rounds"});
    if (args.has("--help")) {
        std::cout << usage;
        return 0;
    }
    settings s;
    s.requests = args.integer("--requests", 4, 1, 1024);
    s.prompt = args.integer("--prompt", 200, 1, 1 << 16);
    s.new_tokens = args.integer("--new-tokens", 8, 1, 4096);
    s.layers = args.integer("--layers", 2, 1, 64);
    s.page_size = args.integer("--page-size", 16, 1, 1 << 16);
    s.threads = args.integer("--threads", 1, 0, 1024);
    s.seed = args.integer("--seed", 1, 0, 1 << 30);
    s.sizes = args.integers("--sizes", {1, 16, 64}, 1, 4096);
    s.rounds = args.integer("--rounds", 7, 1, 1000);
    s.ucx.transports = args.text("--transports", "");
    if (args.has("--throughput")) {
        std::printf("page transfer throughput between two processes over UCX (payload only; median over %d rounds, "
                    "min and max in brackets)\n", s.rounds);
        for (const char* tls : {"shm,tcp", "tcp"}) {
            s.ucx.transports = tls;
            const char* name = std::strcmp(tls, "tcp") == 0 ? "tcp" : "shm";
            const int status = two_workers(
                s, [&](std::uint16_t port) { return throughput_sender(s, port, name); },
                [&](kvcache::ucx_receiver& receiver) {
                    for (std::size_t i = 0; i < 1 + s.sizes.size() * std::size_t(s.rounds); ++i)
                        (void)receiver.receive<float>();
                    return 0;
                });
            if (status != 0) return status;
        }
        return 0;
    }
    std::printf("model: flagship shape, %d layers, random weights (seed %d); paged fp32 caches of pages of %d tokens; "
                "%d requests, %d new tokens each\n", s.layers, s.seed, s.page_size, s.requests, s.new_tokens);
    return two_workers(
        s, [&](std::uint16_t port) { return prefill_worker(s, port); },
        [&](kvcache::ucx_receiver& receiver) { return decode_worker(s, receiver); });
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("08_disaggregated", [&] { return run(argc, argv); });
}
