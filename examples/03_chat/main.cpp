// 03_chat: a multi-turn conversation served the way a chat server sees it —
// every turn is a new request carrying the whole history. The paged cache's
// prefix cache finds the pages of all earlier turns (match_prefix), so only
// the new tokens are computed; a second run without the prefix cache
// recomputes the whole history each turn, and both must reply the same.
// With --conversations N, N conversations take turns on a pool too small for
// all of them: idle ones are swapped out to the cache's host tier and come
// back from it when their user returns. With --disk-tier DIR as well, each
// turn is a new request again: the prefix pages the small pool evicts spill
// to a host tier, and those the host tier evicts to files in DIR; a returning
// conversation's history comes back from whichever tier holds it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/run_main.hpp"
#include "kvcache/backend/cpu.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache_engine/arguments.hpp"
#include "kvcache_engine/flagship_model.hpp"
#include "kvcache_engine/kvcache_attention.hpp"
#include "kvcache_engine/timing.hpp"
#include "kvcache_engine/tiny_llama.hpp"

namespace ex = kvcache::examples;

namespace {

using model_heads = ex::flagship_heads;
using chat_cache = kvcache::paged_cache<float, model_heads>;

const char* usage = R"(usage: 03_chat [options]

A multi-turn conversation with a Llama-architecture decoder (deterministic
random weights): a system prompt, then turns of a user message (seeded
random token ids) and a greedy reply. Each turn is a new request holding the
whole history; the paged cache's prefix cache shares the pages of earlier
turns with it (match_prefix), so only the tokens after them are computed.
The same conversation is served again without the prefix cache (the whole
history recomputed every turn). Prints per turn the tokens reused and
computed and the prefill time of both, and checks the replies are identical.

options:
  --turns N        conversation turns (default 6)
  --system N       system prompt tokens (default 96)
  --user MIN,MAX   user message length range (default 16,48)
  --reply N        tokens generated per reply (default 24)
  --page-size N    tokens per page (default 16)
  --layers N       decoder layers (default 4)
  --threads N      CPU threads (default: all cores)
  --seed N         weights and conversation seed (default 1)
  --conversations N  serve N conversations in turn on one small pool (the
                   swap mode): each keeps its sequence between turns; when
                   the pool is short, the least recently served one is
                   swapped out to the host tier and swapped back in when its
                   user returns. Prints each returning turn's time to first
                   token from the host tier against recomputing the history.
  --pool-pages N   swap and disk-tier modes: pages in the pool (default: room
                   for two conversations)
  --disk-tier DIR  with --conversations (the disk-tier mode): every turn is a
                   new request sharing its history through the prefix cache;
                   cached pages the pool evicts spill to a host tier, those it
                   evicts to files in DIR (an existing, writable directory).
                   Conversations return in a seeded random order, so their
                   history is found in the pool, the host tier or on disk.
                   Prints each returning turn's time to first token by the
                   tier it came from against recomputing the history, the
                   bytes moved per tier, and compares every reply with a run
                   on a pool large enough for all conversations.
  --host-pages N   disk-tier mode: pages of the host tier (default: room for
                   one conversation)
  --disk-read-threads N
                   disk-tier mode: threads a returning turn reads its page
                   files on (default 0: the machine's hardware threads, at
                   most 8)
  --help           this text
)";

/// attention_backend over one sequence of a paged cache that plans every
/// forward call with its token ids (replan_with_tokens), so finished pages
/// enter the prefix cache and later requests can match them.
class prefix_cached_attention final : public ex::attention_backend {
public:
    prefix_cached_attention(chat_cache& cache, kvcache::sequence_id sequence) : cache_(cache), batch_{sequence} {}

    /// The token ids of the next forward call (as many as it feeds).
    void next_tokens(const int* ids) { ids_ = ids; }

    void begin_tokens(int first_position, int tokens) override {
        const int length = cache_.length(batch_[0]);
        kvcache::require(length == first_position, kvcache::error_code::invalid_argument, "the cache is at position ",
                         length, " but the model feeds position ", first_position);
        cache_.replan_with_tokens(plan_, batch_, {std::vector<std::int32_t>(ids_, ids_ + tokens)});
    }

    void attend(int layer, const float* q, const float* k, const float* v, int tokens, float* out) override {
        using heads = chat_cache::heads;
        const std::size_t q_count = std::size_t(tokens) * heads::query_heads() * heads::head_dim;
        const std::size_t kv_count = std::size_t(tokens) * heads::kv_heads() * heads::head_dim;
        const kvcache::span<const float> queries(q, q_count), keys(k, kv_count), values(v, kv_count);
        const kvcache::span<float> outputs(out, q_count);
        const auto view = plan_.view(layer);
        cpu_.append(kvcache::append_params(view, keys, values, plan_.new_token_offsets()));
        if (tokens == 1)
            cpu_.decode(kvcache::decode_params(view, queries, outputs));
        else
            cpu_.prefill(kvcache::prefill_params(view, queries, plan_.new_token_offsets(), outputs));
    }

private:
    chat_cache& cache_;
    std::vector<kvcache::sequence_id> batch_;
    chat_cache::plan_type plan_;
    kvcache::cpu_backend cpu_;
    const int* ids_ = nullptr;
};

/// One request: the history in, a reply out.
struct turn_result {
    int reused = 0;     // history tokens whose K/V came from the prefix cache
    int computed = 0;   // history tokens run through the model
    double prefill_seconds = 0, reply_seconds = 0;
    std::vector<int> reply;
    std::vector<std::vector<float>> logits;
};

/// Serves one turn: a new sequence, the longest cached prefix of the history
/// (when `reuse`), the rest of the history computed, then a greedy reply. The
/// sequence is removed at the end, which leaves its full pages in the prefix cache.
turn_result serve(chat_cache& cache, ex::llama_model& model, const std::vector<int>& history, int reply_tokens,
                  bool reuse) {
    turn_result r;
    const kvcache::sequence_id sequence = cache.add_sequence();
    prefix_cached_attention attention(cache, sequence);
    auto start = std::chrono::steady_clock::now();
    if (reuse) {
        // Leave the last token out: its logits start the reply, so it must be computed.
        const std::vector<std::int32_t> lookup(history.begin(), history.end() - 1);
        r.reused = cache.match_prefix(sequence, lookup);
    }
    r.computed = static_cast<int>(history.size()) - r.reused;
    attention.next_tokens(history.data() + r.reused);
    std::vector<float> logits = model.forward(history.data() + r.reused, r.computed, r.reused, attention);
    r.prefill_seconds = ex::seconds_since(start);
    start = std::chrono::steady_clock::now();
    int position = static_cast<int>(history.size());
    for (;;) {
        r.reply.push_back(ex::argmax(logits.data(), static_cast<int>(logits.size())));
        r.logits.push_back(std::move(logits));
        if (static_cast<int>(r.reply.size()) == reply_tokens) break;
        attention.next_tokens(&r.reply.back());
        logits = model.forward(&r.reply.back(), 1, position++, attention);
    }
    r.reply_seconds = ex::seconds_since(start);
    cache.remove_sequence(sequence);
    return r;
}

/// The seeded token ids of system prompts and user messages.
class conversation_tokens {
public:
    conversation_tokens(int seed, int vocab_size)
        : random_(static_cast<std::uint64_t>(seed) * 7919u + 23u), vocab_size_(vocab_size) {}
    /// The next n token ids.
    std::vector<int> operator()(int n) {
        std::vector<int> out(n);
        for (auto& t : out) t = static_cast<int>(random_.next() % static_cast<std::uint64_t>(vocab_size_));
        return out;
    }
    /// The next raw draw (message lengths come from the same stream).
    std::uint64_t next() { return random_.next(); }

private:
    ex::seeded_random random_;
    int vocab_size_;
};

/// The next user message: a length drawn from [user[0], user[1]], then its tokens.
std::vector<int> user_message(conversation_tokens& random_tokens, const std::vector<int>& user) {
    const int span = user[1] - user[0] + 1;
    return random_tokens(user[0] + static_cast<int>(random_tokens.next() % span));
}

/// One conversation of the swap mode: its sequence stays in the cache between turns.
struct conversation {
    kvcache::sequence_id sequence = -1;
    std::vector<int> history;  // every token so far; the cache holds all but the last reply token
    long last_served = -1;
};

/// The swap mode: conversations take turns; before a turn, the least recently
/// served resident ones are swapped out until the pool has room for it; a
/// returning conversation is swapped back in, then only its new tokens run.
/// Each turn is checked against recomputing its whole history without a cache.
int run_swap_mode(ex::llama_model& model, const ex::model_config& config, int conversations, int pool_pages,
                  int turns, int system_tokens, const std::vector<int>& user, int reply_tokens, int page_size,
                  int layers, int seed, int threads) {
    const long longest = system_tokens + static_cast<long>(turns) * (user[1] + reply_tokens);
    const int pages_each = static_cast<int>(longest / page_size + 2);
    if (pool_pages == 0) pool_pages = 2 * pages_each;
    if (pool_pages < pages_each)
        throw ex::usage_error("--pool-pages " + std::to_string(pool_pages) + " cannot hold one conversation of up to " +
                              std::to_string(longest) + " tokens (" + std::to_string(pages_each) + " pages)");
    chat_cache cache(layers, pool_pages, page_size, /*prefix_caching=*/false);
    cache.attach_host_tier(conversations * pages_each);
    chat_cache scratch(layers, pages_each + 2, page_size, /*prefix_caching=*/false);  // the recompute runs

    std::printf("model: Llama-architecture decoder, %s, random weights (seed %d)\n", config.describe().c_str(), seed);
    std::printf("cache: paged, %d pages of %d tokens (a conversation needs up to %d), host tier of %d pages, fp32, "
                "%d threads\n",
                pool_pages, page_size, pages_each, cache.host_tier_pages(), threads);
    std::printf("conversations: %d, %d turns each, system prompt %d tokens, user messages %d..%d, replies %d\n\n",
                conversations, turns, system_tokens, user[0], user[1], reply_tokens);
    std::printf("%4s | %4s | %7s | %-9s | %11s | %15s | %16s | %9s\n", "turn", "conv", "history", "from",
                "swap-in ms", "first token ms", "recompute ms", "identical");

    conversation_tokens random_tokens(seed, config.vocab_size);
    {  // warm-up (threads started, memory touched)
        std::vector<int> warm(std::min(system_tokens + user[0], page_size * pages_each - 1), 1);
        serve(scratch, model, warm, 2, false);
    }
    std::vector<conversation> chats(conversations);
    for (auto& c : chats) c.history = random_tokens(system_tokens);
    bool identical = true;
    int returning = 0;
    double tier_first_token = 0, recompute_first_token = 0;
    long clock = 0;
    for (int turn = 1; turn <= turns; ++turn) {
        for (int index = 0; index < conversations; ++index) {
            conversation& c = chats[index];
            const std::vector<int> message = user_message(random_tokens, user);
            c.history.insert(c.history.end(), message.begin(), message.end());
            const turn_result expected = serve(scratch, model, c.history, reply_tokens, false);

            const auto start = std::chrono::steady_clock::now();
            const char* from = "new";
            double swap_seconds = 0;
            if (c.sequence < 0) {
                c.sequence = cache.add_sequence();
            } else if (cache.swapped_out(c.sequence)) {
                from = "host tier";
            } else {
                from = "pool";
            }
            // Room for this turn: swap out the least recently served resident conversations.
            const int turn_pages = static_cast<int>((c.history.size() + reply_tokens + page_size - 1) / page_size);
            const int held_pages = cache.swapped_out(c.sequence) ? 0 : static_cast<int>(cache.pages(c.sequence).size());
            for (;;) {
                const auto st = cache.statistics();
                if (st.pages_free + st.pages_evictable >= turn_pages - held_pages) break;
                conversation* victim = nullptr;
                for (auto& other : chats)
                    if (&other != &c && other.sequence >= 0 && !cache.swapped_out(other.sequence) &&
                        (!victim || other.last_served < victim->last_served))
                        victim = &other;
                if (!victim) throw ex::usage_error("the pool cannot hold this conversation's turn");
                cache.swap_out(victim->sequence);
            }
            if (cache.swapped_out(c.sequence)) {
                const auto swap_start = std::chrono::steady_clock::now();
                cache.swap_in(c.sequence);
                swap_seconds = ex::seconds_since(swap_start);
            }
            // Feed what the cache does not hold yet: the last reply token and the new message.
            const int held = cache.length(c.sequence);
            prefix_cached_attention attention(cache, c.sequence);
            attention.next_tokens(c.history.data() + held);
            std::vector<float> logits =
                model.forward(c.history.data() + held, static_cast<int>(c.history.size()) - held, held, attention);
            const double first_token = ex::seconds_since(start);
            std::vector<int> reply;
            int position = static_cast<int>(c.history.size());
            for (;;) {
                reply.push_back(ex::argmax(logits.data(), static_cast<int>(logits.size())));
                if (static_cast<int>(reply.size()) == reply_tokens) break;
                attention.next_tokens(&reply.back());
                logits = model.forward(&reply.back(), 1, position++, attention);
            }
            const bool same = reply == expected.reply;
            identical = identical && same;
            if (std::string(from) == "host tier") {
                ++returning;
                tier_first_token += first_token;
                recompute_first_token += expected.prefill_seconds;
            }
            std::printf("%4d | %4d | %7zu | %-9s | %11.2f | %15.2f | %16.2f | %9s\n", turn, index + 1,
                        c.history.size(), from, swap_seconds * 1e3, first_token * 1e3,
                        expected.prefill_seconds * 1e3, same ? "yes" : "NO");
            std::fflush(stdout);
            c.history.insert(c.history.end(), reply.begin(), reply.end());
            c.last_served = ++clock;
        }
    }
    const auto st = cache.statistics();
    std::printf("\nturns returning from the host tier: %d; time to first token %.2f ms from the tier, %.2f ms "
                "recomputing the history (%.1fx)\n",
                returning, returning ? tier_first_token * 1e3 / returning : 0.0,
                returning ? recompute_first_token * 1e3 / returning : 0.0,
                tier_first_token > 0 ? recompute_first_token / tier_first_token : 0.0);
    std::printf("moved: %llu pages (%.2f MiB) out, %llu pages (%.2f MiB) in, %llu moves spared by a copy still held\n",
                static_cast<unsigned long long>(st.pages_swapped_out), double(st.bytes_swapped_out) / (1 << 20),
                static_cast<unsigned long long>(st.pages_swapped_in), double(st.bytes_swapped_in) / (1 << 20),
                static_cast<unsigned long long>(st.swap_copies_avoided));
    std::printf("replies identical to recomputing each history: %s\n", identical ? "yes" : "no");
    return identical && returning > 0 ? 0 : 1;
}

/// Times of the returning turns whose history came (at its deepest) from one tier.
struct tier_times {
    int turns = 0;
    double first_token = 0, recompute = 0;  // seconds, summed
};

/// The disk-tier mode: conversations return in a seeded random order, each
/// turn a new request whose history is shared through the prefix cache; the
/// pool's evicted pages spill to a host tier and on to files in directory.
/// Every reply is compared with the same turn on a pool that holds every
/// conversation, and each turn's time to first token with recomputing it.
int run_tier_mode(ex::llama_model& model, const ex::model_config& config, int conversations, int pool_pages,
                  int host_pages, const std::string& directory, int read_threads, int turns, int system_tokens,
                  const std::vector<int>& user, int reply_tokens, int page_size, int layers, int seed, int threads) {
    const long longest = system_tokens + static_cast<long>(turns) * (user[1] + reply_tokens);
    const int pages_each = static_cast<int>(longest / page_size + 2);
    if (pool_pages == 0) pool_pages = 2 * pages_each;
    if (host_pages == 0) host_pages = pages_each;
    if (pool_pages < pages_each)
        throw ex::usage_error("--pool-pages " + std::to_string(pool_pages) + " cannot hold one conversation of up to " +
                              std::to_string(longest) + " tokens (" + std::to_string(pages_each) + " pages)");
    chat_cache tiered(layers, pool_pages, page_size, /*prefix_caching=*/true);
    tiered.attach_host_tier(host_pages);
    try {
        tiered.attach_disk_tier(directory, conversations * pages_each, read_threads);
    } catch (const kvcache::error& e) {
        if (e.code() != kvcache::error_code::io_error) throw;
        throw ex::usage_error("--disk-tier '" + directory + "' is not a writable directory (it must exist)");
    }
    // Every turn leaves its pages cached and the next turn of the conversation shares them: room for all of them.
    chat_cache unlimited(layers, 2 * conversations * pages_each + 2, page_size, /*prefix_caching=*/true);
    chat_cache scratch(layers, pages_each + 2, page_size, /*prefix_caching=*/false);  // the recompute runs

    std::printf("model: Llama-architecture decoder, %s, random weights (seed %d)\n", config.describe().c_str(), seed);
    std::printf("cache: paged, %d pages of %d tokens (a conversation needs up to %d), host tier of %d pages, disk "
                "tier of %d pages in %s (read on %d threads), fp32, %d threads\n",
                pool_pages, page_size, pages_each, tiered.host_tier_pages(), tiered.disk_tier_pages(),
                directory.c_str(), tiered.disk_read_threads(), threads);
    std::printf("conversations: %d, %d turns each in a seeded random order, system prompt %d tokens, user messages "
                "%d..%d, replies %d\n\n",
                conversations, turns, system_tokens, user[0], user[1], reply_tokens);
    std::printf("%4s | %4s | %7s | %-10s | %4s | %4s | %4s | %14s | %12s | %9s\n", "turn", "conv", "history", "from",
                "pool", "host", "disk", "first token ms", "recompute ms", "identical");

    conversation_tokens random_tokens(seed, config.vocab_size);
    {  // warm-up (threads started, memory touched)
        std::vector<int> warm(std::min(system_tokens + user[0], page_size * pages_each - 1), 1);
        serve(scratch, model, warm, 2, false);
    }
    // Each conversation's first turn in order, then the others shuffled, so a
    // conversation returns after a varying number of other turns.
    std::vector<int> order;
    for (int t = 0; t < turns; ++t)
        for (int c = 0; c < conversations; ++c) order.push_back(c);
    for (std::size_t i = order.size() - 1; i > std::size_t(conversations); --i)
        std::swap(order[i], order[conversations + random_tokens.next() % (i - conversations + 1)]);
    std::vector<std::vector<int>> histories(conversations);
    for (auto& h : histories) h = random_tokens(system_tokens);
    std::vector<bool> started(conversations, false);
    tier_times pool_times, host_times, disk_times;
    bool identical = true;
    for (std::size_t step = 0; step < order.size(); ++step) {
        std::vector<int>& history = histories[order[step]];
        const std::vector<int> message = user_message(random_tokens, user);
        history.insert(history.end(), message.begin(), message.end());
        const turn_result expected = serve(unlimited, model, history, reply_tokens, true);
        const turn_result recomputed = serve(scratch, model, history, reply_tokens, false);
        const auto before = tiered.statistics();
        const turn_result r = serve(tiered, model, history, reply_tokens, true);
        const auto after = tiered.statistics();
        const int host = static_cast<int>(after.host_prefix_hit_pages - before.host_prefix_hit_pages);
        const int disk = static_cast<int>(after.disk_prefix_hit_pages - before.disk_prefix_hit_pages);
        const int pool = r.reused / page_size - host - disk;
        // A turn counts under the deepest tier it needed: the slowest part of its bring-back.
        const char* from = !started[order[step]] ? "new" : disk > 0 ? "disk tier" : host > 0 ? "host tier"
                                                         : pool > 0 ? "pool" : "recomputed";
        tier_times* times = disk > 0 ? &disk_times : host > 0 ? &host_times : pool > 0 ? &pool_times : nullptr;
        if (started[order[step]] && times) {
            ++times->turns;
            times->first_token += r.prefill_seconds;
            times->recompute += recomputed.prefill_seconds;
        }
        started[order[step]] = true;
        const bool same = r.reply == expected.reply;
        identical = identical && same;
        std::printf("%4zu | %4d | %7zu | %-10s | %4d | %4d | %4d | %14.2f | %12.2f | %9s\n", step + 1, order[step] + 1,
                    history.size(), from, pool, host, disk, r.prefill_seconds * 1e3, recomputed.prefill_seconds * 1e3,
                    same ? "yes" : "NO");
        std::fflush(stdout);
        history.insert(history.end(), r.reply.begin(), r.reply.end());
    }
    // The reference must have kept everything, or it would not be the unlimited pool it stands for.
    if (unlimited.statistics().evictions != 0) throw std::logic_error("03_chat: the unlimited pool evicted pages");
    std::printf("\n");
    const auto report = [](const char* tier, const tier_times& t) {
        if (t.turns == 0) {
            std::printf("returning turns from the %s: 0\n", tier);
            return;
        }
        std::printf("returning turns from the %s: %d; time to first token %.2f ms, %.2f ms recomputing the history "
                    "(%.1fx)\n",
                    tier, t.turns, t.first_token * 1e3 / t.turns, t.recompute * 1e3 / t.turns,
                    t.recompute / t.first_token);
    };
    report("pool", pool_times);
    report("host tier", host_times);
    report("disk tier", disk_times);
    const auto st = tiered.statistics();
    constexpr double mib = 1 << 20;
    std::printf("moved: host tier %llu pages (%.2f MiB) spilled in, %llu pages (%.2f MiB) brought back; disk tier %llu "
                "pages (%.2f MiB) written, %llu pages (%.2f MiB) read\n",
                static_cast<unsigned long long>(st.pages_spilled), double(st.bytes_spilled) / mib,
                static_cast<unsigned long long>(st.host_prefix_hit_pages), double(st.bytes_brought_back_from_host) / mib,
                static_cast<unsigned long long>(st.pages_written_to_disk), double(st.bytes_written_to_disk) / mib,
                static_cast<unsigned long long>(st.disk_prefix_hit_pages), double(st.bytes_read_from_disk) / mib);
    std::printf("prefix pages hit: %llu in the pool (no copy), %llu in the host tier, %llu on disk\n",
                static_cast<unsigned long long>(st.pool_prefix_hit_pages),
                static_cast<unsigned long long>(st.host_prefix_hit_pages),
                static_cast<unsigned long long>(st.disk_prefix_hit_pages));
    std::printf("prefix pages missed: %llu in the pool, %llu in the host tier, %llu on disk (%llu page files "
                "refused)\n",
                static_cast<unsigned long long>(st.pool_prefix_miss_pages),
                static_cast<unsigned long long>(st.host_prefix_miss_pages),
                static_cast<unsigned long long>(st.disk_prefix_miss_pages),
                static_cast<unsigned long long>(st.disk_pages_refused));
    std::printf("replies identical to an unlimited pool: %s\n", identical ? "yes" : "no");
    return identical ? 0 : 1;
}

int run(int argc, char** argv) {
    ex::arguments args(argc, argv, {"--help"},
                       {"--turns", "--system", "--user", "--reply", "--page-size", "--layers", "--threads", "--seed",
                        "--conversations", "--pool-pages", "--disk-tier", "--host-pages", "--disk-read-threads"});
    if (args.has("--help")) {
        std::cout << usage;
        return 0;
    }
    const int turns = args.integer("--turns", 6, 1, 1000);
    const int system_tokens = args.integer("--system", 96, 1, 1 << 16);
    const std::vector<int> user = args.integers("--user", {16, 48}, 1, 1 << 16);
    if (user.size() != 2 || user[0] > user[1])
        throw ex::usage_error("--user needs MIN,MAX with MIN <= MAX, e.g. 16,48");
    const int reply_tokens = args.integer("--reply", 24, 1, 1 << 16);
    const int page_size = args.integer("--page-size", 16, 1, 1 << 16);
    const int layers = args.integer("--layers", 4, 1, 64);
    const int threads = args.integer("--threads", 0, 0, 1024);
    const int seed = args.integer("--seed", 1, 0, 1 << 30);

    const ex::model_config config = ex::flagship_config(layers);
    ex::thread_pool pool(threads);
    kvcache::cpu::set_thread_count(threads);
    ex::llama_model model(ex::make_random_weights(config, static_cast<std::uint64_t>(seed)), pool);
    const int conversations = args.integer("--conversations", 0, 0, 1 << 12);
    if (args.has("--disk-tier") && conversations == 0)
        throw ex::usage_error("--disk-tier needs --conversations N (N >= 1): it is a mode of several conversations");
    if (args.has("--host-pages") && !args.has("--disk-tier"))
        throw ex::usage_error("--host-pages sizes the host tier of the --disk-tier mode; give --disk-tier DIR too");
    if (args.has("--disk-read-threads") && !args.has("--disk-tier"))
        throw ex::usage_error("--disk-read-threads is for the --disk-tier mode; give --disk-tier DIR too");
    if (args.has("--disk-tier"))
        return run_tier_mode(model, config, conversations, args.integer("--pool-pages", 0, 0, 1 << 24),
                             args.integer("--host-pages", 0, 1, 1 << 24), args.text("--disk-tier", ""),
                             args.integer("--disk-read-threads", 0, 0, 256), turns,
                             system_tokens, user, reply_tokens, page_size, layers, seed, pool.size());
    if (conversations > 0)
        return run_swap_mode(model, config, conversations, args.integer("--pool-pages", 0, 0, 1 << 24), turns,
                             system_tokens, user, reply_tokens, page_size, layers, seed, pool.size());

    // Room for the whole conversation twice over, so nothing cached is evicted and every
    // turn can reuse everything before it.
    const long total = system_tokens + static_cast<long>(turns) * (user[1] + reply_tokens);
    const long pages = 2 * (total / page_size + turns + 2);
    if (pages > (1 << 24)) throw ex::usage_error("the conversation is too long for this example's page pool");
    chat_cache with_prefix(layers, static_cast<int>(pages), page_size, /*prefix_caching=*/true);
    chat_cache without_prefix(layers, static_cast<int>(pages), page_size, /*prefix_caching=*/false);

    std::printf("model: Llama-architecture decoder, %s, random weights (seed %d)\n", config.describe().c_str(), seed);
    std::printf("cache: paged, page %d tokens, fp32, kvcache CPU backend, %d threads\n", page_size, pool.size());
    std::printf("conversation: system prompt %d tokens, %d turns, user messages %d..%d tokens, replies %d tokens\n\n",
                system_tokens, turns, user[0], user[1], reply_tokens);
    std::printf("%4s | %7s | %6s | %8s | %17s | %17s | %8s | %9s\n", "turn", "history", "reused", "computed",
                "prefill ms (reuse)", "prefill ms (full)", "saved ms", "identical");

    conversation_tokens random_tokens(seed, config.vocab_size);
    {  // warm-up request (threads started, memory touched) so turn 1's times are not a cold start
        std::vector<int> warm(std::min(system_tokens + user[0], static_cast<int>(total) - 1), 1);
        serve(without_prefix, model, warm, 2, false);
    }
    std::vector<int> history = random_tokens(system_tokens);
    bool identical = true, all_pages_reused = true;
    double max_logit_diff = 0, reuse_seconds = 0, full_seconds = 0;
    long reused_total = 0, history_total = 0;
    int cached_length = 0;  // positions the previous turn left in the cache
    for (int turn = 1; turn <= turns; ++turn) {
        const std::vector<int> message = user_message(random_tokens, user);
        history.insert(history.end(), message.begin(), message.end());

        const turn_result fast = serve(with_prefix, model, history, reply_tokens, true);
        const turn_result slow = serve(without_prefix, model, history, reply_tokens, false);

        // Every full page the previous turn wrote (the last reply token is never fed) must be found.
        const int expected = std::min(cached_length, static_cast<int>(history.size()) - 1) / page_size * page_size;
        all_pages_reused = all_pages_reused && fast.reused == expected;
        const bool same = fast.reply == slow.reply;
        identical = identical && same;
        for (std::size_t s = 0; s < fast.logits.size() && s < slow.logits.size(); ++s)
            for (std::size_t i = 0; i < fast.logits[s].size(); ++i)
                max_logit_diff = std::max(max_logit_diff, double(std::fabs(fast.logits[s][i] - slow.logits[s][i])));
        reuse_seconds += fast.prefill_seconds;
        full_seconds += slow.prefill_seconds;
        reused_total += fast.reused;
        history_total += static_cast<long>(history.size());
        std::printf("%4d | %7zu | %6d | %8d | %18.2f | %17.2f | %8.2f | %9s\n", turn, history.size(), fast.reused,
                    fast.computed, fast.prefill_seconds * 1e3, slow.prefill_seconds * 1e3,
                    (slow.prefill_seconds - fast.prefill_seconds) * 1e3, same ? "yes" : "NO");
        std::fflush(stdout);

        cached_length = static_cast<int>(history.size()) + reply_tokens - 1;
        history.insert(history.end(), fast.reply.begin(), fast.reply.end());
    }

    const auto st = with_prefix.statistics();
    std::printf("\nhistory tokens reused from the prefix cache: %ld of %ld (%.0f%%); prefix-cache page hit rate %.0f%%\n",
                reused_total, history_total, 100.0 * double(reused_total) / double(history_total), 100.0 * st.hit_rate());
    std::printf("prefill time: %.1f ms with reuse, %.1f ms recomputing the whole history: %.1f ms saved (%.0f%%)\n",
                reuse_seconds * 1e3, full_seconds * 1e3, (full_seconds - reuse_seconds) * 1e3,
                full_seconds > 0 ? 100.0 * (full_seconds - reuse_seconds) / full_seconds : 0.0);
    std::printf("every turn reused all full pages of the earlier turns: %s\n", all_pages_reused ? "yes" : "no");
    std::printf("replies identical to the run without reuse: %s\n", identical ? "yes" : "no");
    std::printf("largest logit difference: %.3g\n", max_logit_diff);
    return identical && all_pages_reused ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    return ex::run_main("03_chat", [&] { return run(argc, argv); });
}
