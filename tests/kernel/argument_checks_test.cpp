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
constexpr std::size_t q_row = heads::query_heads() * heads::head_dim, kv_row = heads::kv_heads() * heads::head_dim;

/// Params with the optional fields filled, so each check reads as one line.
template <class View, class Queries, class Outputs, class Lse>
auto decode_call(const View& view, const Queries& queries, Outputs& outputs, Lse&& lse,
                 const attention_options& options = {}) {
    decode_params call(view, queries, outputs);
    call.lse = lse;
    call.options = options;
    return call;
}
template <class View, class Queries, class Offsets, class Outputs, class Lse>
auto prefill_call(const View& view, const Queries& queries, const Offsets& offsets, Outputs& outputs, Lse&& lse) {
    prefill_params call(view, queries, offsets, outputs);
    call.lse = lse;
    return call;
}
template <class States, class StateLse, class Merged, class MergedLse>
auto merge_call(int states, int rows, int dim, const States& outputs, const StateLse& lse, Merged&& merged,
                MergedLse&& merged_lse) {
    merge_params call(states, rows, dim, outputs, lse, merged);
    call.merged_lse = merged_lse;
    return call;
}

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

TEST_CASE_TEMPLATE("an empty batch does nothing on every backend and operation", Backend, reference_backend, cpu_backend, emulated_backend) {
    paged_cache<float, heads> cache(1, 4, 4);
    const auto view = cache.view(0, {});
    REQUIRE(view.sequence_count() == 0);
    std::vector<float> none, none_lse;
    const std::vector<int> no_offsets, zero_offset = {0};
    for (const auto& offsets : {no_offsets, zero_offset}) {
        CHECK_NOTHROW(Backend{}.append(append_params(view, none, none, offsets)));
        CHECK_NOTHROW(Backend{}.prefill(prefill_call(view, none, offsets, none, none_lse)));
    }
    CHECK_NOTHROW(Backend{}.decode(decode_call(view, none, none, none_lse)));
    attention_options split;
    split.kv_splits = 4;
    CHECK_NOTHROW(Backend{}.decode(decode_call(view, none, none, none_lse, split)));
    CHECK_NOTHROW(Backend{}.merge(merge_call(3, 0, heads::head_dim, none, none, none, none_lse)));
}

TEST_CASE_TEMPLATE("kv_splits outside [0, 32] is refused the same way by every backend", Backend, reference_backend, cpu_backend, emulated_backend) {
    two_sequences s;
    const auto view = s.cache.view(0, s.batch);
    const std::vector<float> queries(2 * q_row, 1.0f);
    for (int splits : {-1, 33, 1 << 30}) {
        attention_options options;
        options.kv_splits = splits;
        std::vector<float> outputs(2 * q_row, 7.0f), lse(2 * heads::query_heads(), 7.0f);
        const std::string message = error_of([&] { Backend{}.decode(decode_call(view, queries, outputs, lse, options)); });
        INFO(message);
        CHECK(contains(message, "kv_splits = " + std::to_string(splits)));
        CHECK(contains(message, "[0, 32]"));
        CHECK(outputs == std::vector<float>(2 * q_row, 7.0f));
    }
    for (int splits : {0, 1, 32}) {
        attention_options options;
        options.kv_splits = splits;
        std::vector<float> outputs(2 * q_row), lse(2 * heads::query_heads());
        CHECK_NOTHROW(Backend{}.decode(decode_call(view, queries, outputs, lse, options)));
    }
}

TEST_CASE_TEMPLATE("buffers one row short are refused before anything is written", Backend, reference_backend, cpu_backend, emulated_backend) {
    two_sequences s;
    s.cache.begin_append(1, 1);
    s.cache.begin_append(2, 1);
    const std::string before = s.rows();
    const auto view = s.cache.view(0, s.batch);
    const std::vector<int> one_each = {0, 1, 2};

    // append: two new tokens need 2 x kv_row elements of keys and of values.
    const std::vector<float> rows(2 * kv_row, 3.0f), short_rows(2 * kv_row - 1, 3.0f);
    std::string message = error_of([&] { Backend{}.append(append_params(view, short_rows, rows, one_each)); });
    CHECK(contains(message, "keys holds " + std::to_string(2 * kv_row - 1) + " elements"));
    CHECK(contains(message, std::to_string(2 * kv_row) + " are needed"));
    message = error_of([&] { Backend{}.append(append_params(view, rows, short_rows, one_each)); });
    CHECK(contains(message, "values holds"));
    CHECK(s.rows() == before);
    const std::vector<int> too_few = {0, 1};
    message = error_of([&] { Backend{}.append(append_params(view, rows, rows, too_few)); });
    CHECK(contains(message, "new_token_offsets has 2 entries but a batch of 2 sequences needs 3"));
    CHECK(s.rows() == before);

    // decode: queries and outputs of 2 x q_row, lse of 2 x query_heads.
    const std::vector<float> queries(2 * q_row, 1.0f), short_queries(2 * q_row - 1, 1.0f);
    std::vector<float> outputs(2 * q_row, 7.0f), short_outputs(2 * q_row - 1, 7.0f);
    std::vector<float> lse(2 * heads::query_heads(), 7.0f), short_lse(2 * heads::query_heads() - 1, 7.0f);
    CHECK(contains(error_of([&] { Backend{}.decode(decode_call(view, short_queries, outputs, lse)); }), "queries holds"));
    CHECK(contains(error_of([&] { Backend{}.decode(decode_call(view, queries, short_outputs, lse)); }), "outputs holds"));
    CHECK(contains(error_of([&] { Backend{}.decode(decode_call(view, queries, outputs, short_lse)); }), "lse holds"));
    CHECK(outputs == std::vector<float>(2 * q_row, 7.0f));
    CHECK(short_outputs == std::vector<float>(2 * q_row - 1, 7.0f));

    // prefill: the same sizes for one query token each, and offsets of batch + 1 entries from 0.
    CHECK(contains(error_of([&] { Backend{}.prefill(prefill_call(view, short_queries, one_each, outputs, lse)); }), "queries holds"));
    CHECK(contains(error_of([&] { Backend{}.prefill(prefill_call(view, queries, one_each, short_outputs, lse)); }), "outputs holds"));
    CHECK(contains(error_of([&] { Backend{}.prefill(prefill_call(view, queries, std::vector<int>{1, 2, 3}, outputs, lse)); }),
                   "query_offsets[0] = 1 must be 0"));
    CHECK(outputs == std::vector<float>(2 * q_row, 7.0f));

    // merge: 3 states x 2 rows.
    const int dim = heads::head_dim;
    const std::vector<float> states(3 * 2 * dim, 1.0f), state_lse(3 * 2, 0.0f);
    std::vector<float> merged(2 * dim, 7.0f), merged_lse(2, 7.0f);
    CHECK(contains(error_of([&] { Backend{}.merge(merge_call(3, 2, dim, std::vector<float>(3 * 2 * dim - 1), state_lse, merged, merged_lse)); }),
                   "outputs holds"));
    CHECK(contains(error_of([&] { Backend{}.merge(merge_call(3, 2, dim, states, std::vector<float>(5), merged, merged_lse)); }),
                   "lse holds 5 elements"));
    CHECK(contains(error_of([&] { Backend{}.merge(merge_call(3, 2, dim, states, state_lse, std::vector<float>(2 * dim - 1), merged_lse)); }),
                   "merged holds"));
    CHECK(contains(error_of([&] { Backend{}.merge(merge_call(3, 2, dim, states, state_lse, merged, std::vector<float>(1))); }),
                   "merged_lse holds 1 elements"));
    CHECK(merged == std::vector<float>(2 * dim, 7.0f));
}

TEST_CASE_TEMPLATE("per-sequence messages name the owner's sequence id", Backend, reference_backend, cpu_backend, emulated_backend) {
    two_sequences s;
    const std::string before = s.rows();
    const auto view = s.cache.view(0, s.batch);  // entries 0, 1 are ids 1, 2; id 2 has length 4
    const std::vector<float> rows(6 * kv_row, 3.0f);
    const std::vector<int> past_length = {0, 1, 6}, decreasing = {0, 2, 1};
    std::string message = error_of([&] { Backend{}.append(append_params(view, rows, rows, past_length)); });
    CHECK(contains(message, "sequence 2 (batch entry 1) appends 5 tokens but its length is 4"));
    message = error_of([&] { Backend{}.append(append_params(view, rows, rows, decreasing)); });
    CHECK(contains(message, "decreases at sequence 2 (batch entry 1)"));
    CHECK(s.rows() == before);
    const std::vector<float> queries(6 * q_row, 1.0f);
    std::vector<float> outputs(6 * q_row), lse(6 * heads::query_heads());
    message = error_of([&] { Backend{}.prefill(prefill_call(view, queries, std::vector<int>{0, 4, 5}, outputs, lse)); });
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

TEST_CASE_TEMPLATE("explicit positions are checked: one per token, inside the sequence, not negative", Backend,
                   reference_backend, cpu_backend, emulated_backend) {
    two_sequences s;
    const std::string before = s.rows();
    const auto view = s.cache.view(0, s.batch);  // ids 1, 2 with lengths 3, 4
    const std::vector<int> one_each = {0, 1, 2};
    const std::vector<float> rows(2 * kv_row, 3.0f);
    append_params append(view, rows, rows, one_each);
    const std::vector<int> too_few = {0};
    append.positions = too_few;
    CHECK(contains(error_of([&] { Backend{}.append(append); }), "positions has 1 entries but the batch has 2 tokens"));
    const std::vector<int> past_end = {1, 4};
    append.positions = past_end;
    try {
        Backend{}.append(append);
        FAIL("no error");
    } catch (const kvcache::error& e) {
        CHECK(e.code() == error_code::out_of_range);
        CHECK(contains(e.what(), "positions[1] = 4 of sequence 2 (batch entry 1) is outside its length 4"));
    }
    CHECK(s.rows() == before);

    const std::vector<float> queries(2 * q_row, 1.0f);
    std::vector<float> outputs(2 * q_row, 7.0f);
    prefill_params prefill(view, queries, one_each, outputs);
    const std::vector<int> negative = {0, -1};
    prefill.query_positions = negative;
    CHECK(contains(error_of([&] { Backend{}.prefill(prefill); }),
                   "query_positions[1] = -1 of sequence 2 (batch entry 1) is negative"));
    CHECK(outputs == std::vector<float>(2 * q_row, 7.0f));
    // With explicit positions a sequence may have more query tokens than its length (cascade).
    const std::vector<float> many(6 * q_row, 1.0f);
    std::vector<float> many_outputs(6 * q_row);
    const std::vector<int> five_and_one = {0, 5, 6};
    prefill_params cascade(view, many, five_and_one, many_outputs);
    const std::vector<int> past_prefix(6, 9);
    cascade.query_positions = past_prefix;
    CHECK_NOTHROW(Backend{}.prefill(cascade));
}

TEST_CASE("plan refuses unknown and repeated ids, bad counts and what does not fit, reserving nothing") {
    two_sequences s;
    auto not_found = [&](auto&& f) {
        try {
            f();
        } catch (const kvcache::error& e) {
            return e.code() == error_code::not_found;
        }
        return false;
    };
    CHECK(not_found([&] { s.cache.plan({1, 0}, {1, 1}); }));
    CHECK(contains(error_of([&] { s.cache.plan({1, 2, 1}, {1, 1, 1}); }),
                   "sequence 1 appears twice in the batch (entries 0 and 2)"));
    CHECK(contains(error_of([&] { s.cache.plan({1, 2}, {1}); }), "new_tokens has 1 entries but the batch has 2"));
    CHECK(contains(error_of([&] { s.cache.plan({1, 2}, {1, -2}); }), "new_tokens[1] = -2 of sequence 2 is negative"));
    try {
        s.cache.plan({1, 2}, {1, 1000});  // the first reservation fits, the second does not
        FAIL("no error");
    } catch (const kvcache::error& e) {
        CHECK(e.code() == error_code::capacity_exceeded);
    }
    CHECK(s.cache.length(1) == 3);
    CHECK(s.cache.length(2) == 4);
    auto plan = s.cache.plan({2, 1}, {2, 0});
    CHECK(s.cache.length(2) == 6);
    CHECK(plan.first_new_position(0) == 4);
    CHECK(plan.new_tokens(1) == 0);
    CHECK(plan.total_new_tokens() == 2);
    CHECK(plan.view(0).length(0) == 6);
    const std::vector<int> expected_offsets = {0, 2, 2};
    CHECK(std::vector<int>(plan.host_offsets().begin(), plan.host_offsets().end()) == expected_offsets);
}

TEST_CASE("plan_with_tokens records token ids: the full pages it wrote are found by match_prefix") {
    paged_cache<float, heads> cache(1, 16, 4);
    const sequence_id first = cache.add_sequence();
    const std::vector<std::int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    auto plan = cache.plan_with_tokens({first}, {prompt});
    CHECK(plan.total_new_tokens() == 9);
    const std::vector<float> rows(9 * kv_row, 0.5f);
    cpu_backend{}.append(append_params(plan.view(0), rows, rows, plan.new_token_offsets()));
    cache.publish(first);
    const sequence_id second = cache.add_sequence();
    CHECK(cache.match_prefix(second, prompt) == 8);  // two full pages of 4
    CHECK(cache.pages(second)[1] == cache.pages(first)[1]);
    CHECK(contains(error_of([&] { cache.plan_with_tokens({first, second}, {prompt}); }),
                   "new_token_ids has 1 entries but the batch has 2"));
    static_assert(std::is_same_v<decltype(plan), paged_cache<float, heads>::plan_type>);
}
