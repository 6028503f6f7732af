// The CPU backend on a caller's thread pool: results on pools of 1, 2 and 3
// threads against the reference, every call running on the backend's pool,
// concurrent callers on their own pools and on a shared one, and the pool's
// own contract (inline when busy, counted; thread counts; errors).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/reference.hpp"
#include "support/attention_harness.hpp"
#include "support/layout_factories.hpp"

using namespace kvcache;
using namespace kvcache_test;

namespace {

using gqa = head_config<8, 2, 64>;

/// Keeps a pool busy from another thread: a loop whose bodies wait for
/// release(), so that until then every other caller finds the pool held.
/// Returns from its constructor once the loop has the pool.
class pool_holder {
public:
    explicit pool_holder(cpu::thread_pool& pool) {
        thread_ = std::thread([this, &pool] {
            pool.parallel_for(std::max(2, pool.threads()), [this](int) {
                std::unique_lock<std::mutex> lock(mutex_);
                entered_ = true;
                changed_.notify_all();
                changed_.wait(lock, [&] { return released_; });
            });
        });
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return entered_; });
    }
    pool_holder(const pool_holder&) = delete;
    pool_holder& operator=(const pool_holder&) = delete;
    ~pool_holder() { release(); }

    void release() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            released_ = true;
        }
        changed_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

private:
    std::mutex mutex_;
    std::condition_variable changed_;
    bool entered_ = false, released_ = false;
    std::thread thread_;
};

/// A decode the concurrent tests repeat: kv_splits fixed, so its result does
/// not depend on the pool's size (nor on which thread ran which item).
struct decode_case {
    std::unique_ptr<scatter_cache<half, gqa>> cache;
    std::vector<float> queries;
    attention_options options;

    decode_case() {
        context_case c{"three", {500, 260, 90}, 0, 0, 16, {1, 1, 1}, {}};
        cache = scatter_factory::make<half, gqa>(c, 31);
        fill_cache(cache->view(), 32);
        queries = random_rows<float>(3 * gqa::query_heads() * gqa::head_dim, 3.0f, 33);
        options.kv_splits = 2;
    }
    std::size_t rows() const { return 3 * gqa::query_heads(); }

    /// The backend's decode: outputs then log-sum-exps, in one vector.
    std::vector<float> run(const cpu_backend& cpu) const {
        std::vector<float> outputs(queries.size()), lse(rows());
        decode_params call(cache->view(), queries, outputs);
        call.lse = lse;
        call.options = options;
        cpu.decode(call);
        outputs.insert(outputs.end(), lse.begin(), lse.end());
        return outputs;
    }
};

/// Runs `rounds` decodes on each of two threads, each through its own
/// backend copy, and returns how many results differed from expected; keeps
/// going past `rounds` until until() holds or a deadline passes.
template <class Until>
int decode_on_two_threads(const decode_case& d, const cpu_backend& first, const cpu_backend& second,
                          const std::vector<float>& expected, int rounds, Until until) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int wrong[2] = {0, 0};
    auto loop = [&](const cpu_backend cpu, int& mismatches) {
        for (int i = 0; i < rounds || (!until() && std::chrono::steady_clock::now() < deadline); ++i)
            mismatches += d.run(cpu) != expected;
    };
    std::thread a(loop, first, std::ref(wrong[0])), b(loop, second, std::ref(wrong[1]));
    a.join();
    b.join();
    return wrong[0] + wrong[1];
}

}  // namespace

TEST_CASE("cpu backend on its own pool of 1, 2 and 3 threads matches the reference") {
    std::vector<context_case> cases = standard_cases();
    // One sequence, 2 KV heads: fewer items than threads, so kv_splits 0 splits by the pool's size.
    cases.push_back({"one long", {700}, 0, 0, 16, {50}, {}});
    const int process_wide = cpu::thread_count();
    for (int threads : {1, 2, 3}) {
        cpu::thread_pool pool(threads);
        const cpu_backend cpu(pool);
        CHECK(pool.threads() == threads);
        CHECK(cpu.threads() == threads);
        CHECK(&cpu.pool() == &pool);
        const std::string name = "cpu on a pool of " + std::to_string(threads);
        check_attention<scatter_factory, half, gqa>(cpu, name, gqa{}, cases);
        check_attention<paged_factory, float, head_config<4, 1, 32>>(cpu, name, {}, cases);
        check_append<contiguous_factory, half, gqa>(cpu, name);
        CHECK(pool.busy_inline_loops() == 0);
    }
    CHECK(cpu::thread_count() == process_wide);
    CHECK(&cpu_backend{}.pool() == &cpu::thread_pool::process_wide());
}

TEST_CASE("decode over pages walks as many heads together as still balance the threads") {
    // The contract of heads_per_decode_item, checked over a grid: a divisor
    // of the KV heads; when more than one, the items are a multiple of the
    // threads or at least four per thread; and no larger divisor would do.
    auto balanced = [](int batch, int kv_heads, int threads, int heads) {
        const int items = batch * (kv_heads / heads);
        return items >= threads && (items % threads == 0 || items >= 4 * threads);
    };
    for (int batch = 1; batch <= 40; ++batch)
        for (int kv_heads = 1; kv_heads <= 16; ++kv_heads)
            for (int threads = 1; threads <= 32; ++threads) {
                const int heads = cpu::detail::heads_per_decode_item(batch, kv_heads, threads);
                CAPTURE(batch);
                CAPTURE(kv_heads);
                CAPTURE(threads);
                REQUIRE(heads >= 1);
                REQUIRE(kv_heads % heads == 0);
                if (heads > 1) CHECK(balanced(batch, kv_heads, threads, heads));
                for (int larger = heads + 1; larger <= kv_heads; ++larger)
                    if (kv_heads % larger == 0) CHECK_FALSE(balanced(batch, kv_heads, threads, larger));
            }
    // The cases the choice is for: one sequence on two threads takes half
    // the heads each; a batch the threads divide keeps a sequence whole; an
    // odd batch on two threads splits its sequences in two; 17 sequences on
    // 16 threads split four ways (68 items) instead of leaving 15 threads idle for the 17th.
    CHECK(cpu::detail::heads_per_decode_item(1, 8, 2) == 4);
    CHECK(cpu::detail::heads_per_decode_item(8, 8, 2) == 8);
    CHECK(cpu::detail::heads_per_decode_item(3, 8, 2) == 4);
    CHECK(cpu::detail::heads_per_decode_item(17, 8, 16) == 2);
}

TEST_CASE("cpu backend runs append, decode and prefill on its pool: inline while another thread holds it") {
    cpu::thread_pool pool(2);
    const cpu_backend cpu(pool);
    context_case c{"two", {300, 200}, 0, 0, 16, {40, 25}, {}};
    auto cache = scatter_factory::make<half, gqa>(c, 41);
    const auto view = cache->view();
    fill_cache(view, 42);
    pool_holder holder(pool);
    {  // decode: 4 items, kv_splits 0 gives 1 split (4 >= 2 threads): one loop
        const std::size_t rows = 2 * gqa::query_heads();
        const auto queries = random_rows<float>(rows * gqa::head_dim, 3.0f, 43);
        std::vector<float> outputs(queries.size()), lse(rows);
        decode_params call(view, queries, outputs);
        call.lse = lse;
        const auto before = pool.busy_inline_loops();
        cpu.decode(call);
        CHECK(pool.busy_inline_loops() == before + 1);
        compare(outputs, lse, reference_backend{}.decode_exact(call), "decode on a held pool");
    }
    {  // prefill: one loop over its blocks
        const std::vector<int> offsets = {0, 40, 65};
        const std::size_t rows = 65 * gqa::query_heads();
        const auto queries = random_rows<float>(rows * gqa::head_dim, 3.0f, 44);
        std::vector<float> outputs(queries.size()), lse(rows);
        prefill_params call(view, queries, offsets, outputs);
        call.lse = lse;
        const auto before = pool.busy_inline_loops();
        cpu.prefill(call);
        CHECK(pool.busy_inline_loops() == before + 1);
        compare(outputs, lse, reference_backend{}.prefill_exact(call), "prefill on a held pool");
    }
    {  // append: one loop per call the harness makes
        const auto before = pool.busy_inline_loops();
        check_append<scatter_factory, half, gqa>(cpu, "cpu on a held pool", gqa{}, {c});
        CHECK(pool.busy_inline_loops() > before);
    }
    holder.release();
    const auto before = pool.busy_inline_loops();
    check_append<scatter_factory, half, gqa>(cpu, "cpu on a released pool", gqa{}, {c});
    CHECK(pool.busy_inline_loops() == before);
}

TEST_CASE("two threads decoding concurrently: correct on their own pools and on a shared one") {
    const decode_case d;
    cpu::thread_pool one(1);
    const std::vector<float> expected = d.run(cpu_backend(one));
    {
        std::vector<float> outputs(expected.begin(), expected.begin() + d.queries.size());
        std::vector<float> lse(expected.begin() + d.queries.size(), expected.end());
        decode_params call(d.cache->view(), d.queries, span<float>());
        call.options = d.options;
        compare(outputs, lse, reference_backend{}.decode_exact(call), "decode on one thread");
    }
    SUBCASE("each thread on its own pool: neither pool is ever busy") {
        cpu::thread_pool first(2), second(2);
        const auto process_wide_busy = cpu::thread_pool::process_wide().busy_inline_loops();
        CHECK(decode_on_two_threads(d, cpu_backend(first), cpu_backend(second), expected, 200, [] { return true; }) == 0);
        CHECK(first.busy_inline_loops() == 0);
        CHECK(second.busy_inline_loops() == 0);
        // Had the backends used the process-wide pool, the two threads would have collided there.
        CHECK(cpu::thread_pool::process_wide().busy_inline_loops() == process_wide_busy);
    }
    SUBCASE("both threads on one pool: still correct, and the pool counts the loops that ran inline") {
        // Which loops collide is up to the scheduler (the held-pool tests force
        // it); the threads go on past 200 rounds until one has, within 20 s.
        cpu::thread_pool shared(2);
        const cpu_backend cpu(shared);
        CHECK(decode_on_two_threads(d, cpu, cpu, expected, 200, [&] { return shared.busy_inline_loops() > 0; }) == 0);
        CHECK(shared.busy_inline_loops() > 0);
        MESSAGE("loops run inline on the shared pool: " << shared.busy_inline_loops());
    }
}

TEST_CASE("thread pool: a loop called while another thread's loop holds the pool runs inline and is counted") {
    cpu::thread_pool pool(3);
    const auto me = std::this_thread::get_id();
    auto ran_where = [&](std::vector<std::thread::id>& ids) {
        pool.parallel_for(int(ids.size()), [&](int i) {
            ids[i] = std::this_thread::get_id();
            std::this_thread::sleep_for(std::chrono::milliseconds(5));  // long enough for the workers to take some
        });
    };
    std::vector<std::thread::id> ids(12);
    {
        pool_holder holder(pool);
        ran_where(ids);
        CHECK(pool.busy_inline_loops() == 1);
        CHECK(std::count(ids.begin(), ids.end(), me) == 12);
    }
    ran_where(ids);  // free again: the workers take part, nothing counted
    CHECK(pool.busy_inline_loops() == 1);
    CHECK(std::count(ids.begin(), ids.end(), me) < 12);

    // From inside a body, on a worker or the caller: inline on that thread, no
    // deadlock, not counted (the thread is already one of the loop's).
    std::mutex mutex;
    int nested_elsewhere = 0, nested_items = 0;
    pool.parallel_for(4, [&](int) {
        const auto here = std::this_thread::get_id();
        pool.parallel_for(5, [&](int) {
            std::lock_guard<std::mutex> lock(mutex);
            ++nested_items;
            nested_elsewhere += std::this_thread::get_id() != here;
        });
    });
    CHECK(nested_items == 20);
    CHECK(nested_elsewhere == 0);
    CHECK(pool.busy_inline_loops() == 1);

    // Resizing from inside one of its own bodies would wait for itself: refused.
    CHECK_THROWS_WITH_AS(pool.parallel_for(2, [&](int) { pool.resize(2); }),
                         doctest::Contains("inside one of the pool's own loops"), kvcache::error);
    CHECK(pool.threads() == 3);
}

TEST_CASE("thread pool: 0 threads means every hardware thread, a negative count is refused by value") {
    const int hardware = int(std::max(1u, std::thread::hardware_concurrency()));
    CHECK(cpu::thread_pool(0).threads() == hardware);
    CHECK(cpu::thread_pool(1).threads() == 1);
    CHECK(cpu::thread_pool(4).threads() == 4);
    CHECK_THROWS_WITH_AS(cpu::thread_pool(-2), doctest::Contains("thread count -2 must not be negative"),
                         kvcache::error);
    cpu::thread_pool pool(2);
    CHECK_THROWS_WITH_AS(pool.resize(-1), doctest::Contains("thread count -1 must not be negative"), kvcache::error);
    CHECK(pool.threads() == 2);
    pool.resize(0);
    CHECK(pool.threads() == hardware);
    CHECK_THROWS_WITH_AS(cpu::set_thread_count(-3), doctest::Contains("thread count -3"), kvcache::error);
    bool invalid_argument = false;
    try {
        cpu::thread_pool bad(-5);
    } catch (const kvcache::error& e) {
        invalid_argument = e.code() == error_code::invalid_argument;
    }
    CHECK(invalid_argument);
}
