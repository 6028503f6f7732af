// Every host backend (reference, cpu, emulated) takes the same bad input the
// same way: an empty batch does nothing, a kv_splits outside [0, 32], a
// buffer one row short, or CSR offsets of the wrong count throw
// kvcache::error naming the field, the value and the limit, and nothing is
// written; per-sequence messages name the owner's sequence id.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/emulated.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/paged_cache.hpp"

using namespace kvcache;

namespace {

using heads = head_config<4, 2, 16>;
constexpr std::size_t q_row = heads::query_heads * heads::head_dim, kv_row = heads::kv_heads * heads::head_dim;

struct reference_calls {
    static constexpr const char* name = "reference";
    template <class... Args>
    static void append(Args&&... args) { reference::append(std::forward<Args>(args)...); }
    template <class... Args>
    static void decode(Args&&... args) { reference::decode_attention_with_lse(std::forward<Args>(args)...); }
    template <class... Args>
    static void prefill(Args&&... args) { reference::prefill_attention_with_lse(std::forward<Args>(args)...); }
    template <class... Args>
    static void merge(Args&&... args) { reference::merge_states(std::forward<Args>(args)...); }
};
struct cpu_calls {
    static constexpr const char* name = "cpu";
    template <class... Args>
    static void append(Args&&... args) { cpu::append(std::forward<Args>(args)...); }
    template <class... Args>
    static void decode(Args&&... args) { cpu::decode_attention_with_lse(std::forward<Args>(args)...); }
    template <class... Args>
    static void prefill(Args&&... args) { cpu::prefill_attention_with_lse(std::forward<Args>(args)...); }
    template <class... Args>
    static void merge(Args&&... args) { cpu::merge_states(std::forward<Args>(args)...); }
};
struct emulated_calls {
    static constexpr const char* name = "emulated";
    template <class... Args>
    static void append(Args&&... args) { emulated::append(std::forward<Args>(args)...); }
    template <class... Args>
    static void decode(Args&&... args) { emulated::decode_attention_with_lse(std::forward<Args>(args)...); }
    template <class... Args>
    static void prefill(Args&&... args) { emulated::prefill_attention_with_lse(std::forward<Args>(args)...); }
    template <class... Args>
    static void merge(Args&&... args) { emulated::merge_states(std::forward<Args>(args)...); }
};

/// The message of the kvcache::error f throws (fails the test when it throws none or another kind).
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const kvcache::error& e) {
        CHECK(e.code() == error_code::invalid_argument);
        return e.what();
    }
    FAIL("no kvcache::error was thrown");
    return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A paged cache holding ids 0, 1, 2 with lengths 5, 3, 4 (rows written), and id 0 removed,
/// so batch entry b is sequence id b + 1 and the two differ in messages.
struct two_sequences {
    paged_cache<float, heads> cache{1, 16, 4};
    std::vector<sequence_id> batch;
    two_sequences() {
        const int lengths[3] = {5, 3, 4};
        for (int n : lengths) {
            const sequence_id id = cache.add_sequence();
            const std::vector<float> rows(n * kv_row, 0.25f * float(id + 1));
            cache.append(id, 0, rows, rows, n);
        }
        cache.remove_sequence(0);
        batch = {1, 2};
    }
    std::string rows() const {
        std::string out;
        for (sequence_id id : batch) {
            std::vector<float> k(cache.length(id) * kv_row), v(k.size());
            cache.read(id, 0, 0, cache.length(id), k, v);
            for (float x : k) out += std::to_string(x) + ",";
            for (float x : v) out += std::to_string(x) + ";";
        }
        return out;
    }
};

}  // namespace

TEST_CASE_TEMPLATE("an empty batch does nothing on every backend and operation", Calls, reference_calls, cpu_calls,
                   emulated_calls) {
    paged_cache<float, heads> cache(1, 4, 4);
    const auto view = cache.view(0, {});
    REQUIRE(view.sequence_count() == 0);
    std::vector<float> none, none_lse;
    const std::vector<int> no_offsets, zero_offset = {0};
    for (const auto& offsets : {no_offsets, zero_offset}) {
        CHECK_NOTHROW(Calls::append(view, none, none, offsets));
        CHECK_NOTHROW(Calls::prefill(view, none, offsets, none, none_lse));
    }
    CHECK_NOTHROW(Calls::decode(view, none, none, none_lse));
    attention_options split;
    split.kv_splits = 4;
    CHECK_NOTHROW(Calls::decode(view, none, none, none_lse, split));
    CHECK_NOTHROW(Calls::merge(3, 0, heads::head_dim, none, none, none, none_lse));
}

TEST_CASE_TEMPLATE("kv_splits outside [0, 32] is refused the same way by every backend", Calls, reference_calls,
                   cpu_calls, emulated_calls) {
    two_sequences s;
    const auto view = s.cache.view(0, s.batch);
    const std::vector<float> queries(2 * q_row, 1.0f);
    for (int splits : {-1, 33, 1 << 30}) {
        attention_options options;
        options.kv_splits = splits;
        std::vector<float> outputs(2 * q_row, 7.0f), lse(2 * heads::query_heads, 7.0f);
        const std::string message = error_of([&] { Calls::decode(view, queries, outputs, lse, options); });
        INFO(Calls::name << ": " << message);
        CHECK(contains(message, "kv_splits = " + std::to_string(splits)));
        CHECK(contains(message, "[0, 32]"));
        CHECK(outputs == std::vector<float>(2 * q_row, 7.0f));
    }
    for (int splits : {0, 1, 32}) {
        attention_options options;
        options.kv_splits = splits;
        std::vector<float> outputs(2 * q_row), lse(2 * heads::query_heads);
        CHECK_NOTHROW(Calls::decode(view, queries, outputs, lse, options));
    }
}

TEST_CASE_TEMPLATE("buffers one row short are refused before anything is written", Calls, reference_calls, cpu_calls,
                   emulated_calls) {
    two_sequences s;
    s.cache.begin_append(1, 1);
    s.cache.begin_append(2, 1);
    const std::string before = s.rows();
    const auto view = s.cache.view(0, s.batch);
    const std::vector<int> one_each = {0, 1, 2};

    // append: two new tokens need 2 x kv_row elements of keys and of values.
    const std::vector<float> rows(2 * kv_row, 3.0f), short_rows(2 * kv_row - 1, 3.0f);
    std::string message = error_of([&] { Calls::append(view, short_rows, rows, one_each); });
    CHECK(contains(message, "keys holds " + std::to_string(2 * kv_row - 1) + " elements"));
    CHECK(contains(message, std::to_string(2 * kv_row) + " are needed"));
    message = error_of([&] { Calls::append(view, rows, short_rows, one_each); });
    CHECK(contains(message, "values holds"));
    CHECK(s.rows() == before);
    message = error_of([&] { Calls::append(view, rows, rows, std::vector<int>{0, 1}); });
    CHECK(contains(message, "new_token_offsets has 2 entries but a batch of 2 sequences needs 3"));
    CHECK(s.rows() == before);

    // decode: queries and outputs of 2 x q_row, lse of 2 x query_heads.
    const std::vector<float> queries(2 * q_row, 1.0f), short_queries(2 * q_row - 1, 1.0f);
    std::vector<float> outputs(2 * q_row, 7.0f), short_outputs(2 * q_row - 1, 7.0f);
    std::vector<float> lse(2 * heads::query_heads, 7.0f), short_lse(2 * heads::query_heads - 1, 7.0f);
    CHECK(contains(error_of([&] { Calls::decode(view, short_queries, outputs, lse); }), "queries holds"));
    CHECK(contains(error_of([&] { Calls::decode(view, queries, short_outputs, lse); }), "outputs holds"));
    CHECK(contains(error_of([&] { Calls::decode(view, queries, outputs, short_lse); }), "lse holds"));
    CHECK(outputs == std::vector<float>(2 * q_row, 7.0f));
    CHECK(short_outputs == std::vector<float>(2 * q_row - 1, 7.0f));

    // prefill: the same sizes for one query token each, and offsets of batch + 1 entries from 0.
    CHECK(contains(error_of([&] { Calls::prefill(view, short_queries, one_each, outputs, lse); }), "queries holds"));
    CHECK(contains(error_of([&] { Calls::prefill(view, queries, one_each, short_outputs, lse); }), "outputs holds"));
    CHECK(contains(error_of([&] { Calls::prefill(view, queries, std::vector<int>{1, 2, 3}, outputs, lse); }),
                   "query_offsets[0] = 1 must be 0"));
    CHECK(outputs == std::vector<float>(2 * q_row, 7.0f));

    // merge: 3 states x 2 rows.
    const int dim = heads::head_dim;
    const std::vector<float> states(3 * 2 * dim, 1.0f), state_lse(3 * 2, 0.0f);
    std::vector<float> merged(2 * dim, 7.0f), merged_lse(2, 7.0f);
    CHECK(contains(error_of([&] { Calls::merge(3, 2, dim, std::vector<float>(3 * 2 * dim - 1), state_lse, merged, merged_lse); }),
                   "outputs holds"));
    CHECK(contains(error_of([&] { Calls::merge(3, 2, dim, states, std::vector<float>(5), merged, merged_lse); }),
                   "lse holds 5 elements"));
    CHECK(contains(error_of([&] { Calls::merge(3, 2, dim, states, state_lse, std::vector<float>(2 * dim - 1), merged_lse); }),
                   "merged holds"));
    CHECK(contains(error_of([&] { Calls::merge(3, 2, dim, states, state_lse, merged, std::vector<float>(1)); }),
                   "merged_lse holds 1 elements"));
    CHECK(merged == std::vector<float>(2 * dim, 7.0f));
}

TEST_CASE_TEMPLATE("per-sequence messages name the owner's sequence id", Calls, reference_calls, cpu_calls,
                   emulated_calls) {
    two_sequences s;
    const std::string before = s.rows();
    const auto view = s.cache.view(0, s.batch);  // entries 0, 1 are ids 1, 2; id 2 has length 4
    const std::vector<float> rows(6 * kv_row, 3.0f);
    std::string message = error_of([&] { Calls::append(view, rows, rows, std::vector<int>{0, 1, 6}); });
    CHECK(contains(message, "sequence 2 (batch entry 1) appends 5 tokens but its length is 4"));
    message = error_of([&] { Calls::append(view, rows, rows, std::vector<int>{0, 2, 1}); });
    CHECK(contains(message, "decreases at sequence 2 (batch entry 1)"));
    CHECK(s.rows() == before);
    const std::vector<float> queries(6 * q_row, 1.0f);
    std::vector<float> outputs(6 * q_row), lse(6 * heads::query_heads);
    message = error_of([&] { Calls::prefill(view, queries, std::vector<int>{0, 4, 5}, outputs, lse); });
    CHECK(contains(message, "sequence 1 (batch entry 0) has 4 tokens but its length is 3"));
}

TEST_CASE("owner write and read refuse buffers one row short and change nothing") {
    two_sequences s;
    const std::string before = s.rows();
    const std::vector<float> rows(2 * kv_row, 9.0f), short_rows(2 * kv_row - 1, 9.0f);
    std::string message = error_of([&] { s.cache.write(1, 0, 0, short_rows, rows, 2); });
    CHECK(contains(message, "keys holds " + std::to_string(2 * kv_row - 1) + " elements"));
    CHECK(contains(message, "write of sequence 1, layer 0"));
    message = error_of([&] { s.cache.write(2, 0, 0, rows, short_rows, 2); });
    CHECK(contains(message, "values holds"));
    CHECK(s.rows() == before);
    std::vector<float> k(2 * kv_row), v(2 * kv_row - 1);
    message = error_of([&] { s.cache.read(2, 0, 1, 2, k, v); });
    CHECK(contains(message, "values holds"));
    CHECK(contains(message, "read of sequence 2, layer 0"));
    message = error_of([&] { s.cache.append(2, 0, short_rows, rows, 2); });  // layer 0 opens the step: nothing reserved
    CHECK(contains(message, "keys holds"));
    CHECK(s.cache.length(2) == 4);
    CHECK(s.rows() == before);
}
