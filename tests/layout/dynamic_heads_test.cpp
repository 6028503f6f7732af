// Owners over a dynamic head configuration: the counts given at construction
// size the storage, reach the views, survive save/load, and are checked.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"

using namespace kvcache;

namespace {

using runtime = dynamic_heads<16>;
using compiled = head_config<6, 3, 16>;

std::vector<float> rows(int tokens, int kv_heads, float phase) {
    std::vector<float> out(std::size_t(tokens) * kv_heads * 16);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::sin(phase + 0.3f * float(i));
    return out;
}

// The same tokens in a compiled and a dynamic owner attend alike, bit for bit (the reference is exact).
template <class Dynamic, class Compiled>
void check_same_attention(Dynamic& dynamic, Compiled& fixed) {
    const sequence_id a = dynamic.add_sequence(), b = fixed.add_sequence();
    const auto k = rows(11, 3, 0.5f), v = rows(11, 3, 1.5f);
    for (int layer = 0; layer < 2; ++layer) {
        dynamic.append(a, layer, k, v, 11);
        fixed.append(b, layer, k, v, 11);
    }
    CHECK(dynamic.kv_heads() == 3);
    CHECK(dynamic.query_heads() == 6);
    CHECK(dynamic.bytes_reserved() == fixed.bytes_reserved());
    std::vector<float> queries(6 * 16, 0.25f), out_a(queries.size()), out_b(queries.size());
    for (int layer = 0; layer < 2; ++layer) {
        const auto got = reference_backend{}.decode_exact(decode_params(dynamic.view(layer, {a}), queries, out_a));
        const auto want = reference_backend{}.decode_exact(decode_params(fixed.view(layer, {b}), queries, out_b));
        CHECK(got.outputs == want.outputs);
    }
}

}  // namespace

TEST_CASE("owners over dynamic head counts hold and attend like the compiled ones") {
    SUBCASE("paged") {
        paged_cache<float, runtime> dynamic({6, 3}, 2, 8, 4);
        paged_cache<float, compiled> fixed(2, 8, 4);
        check_same_attention(dynamic, fixed);
    }
    SUBCASE("contiguous") {
        static_cache<float, runtime> dynamic({6, 3}, 2, 2, 16);
        static_cache<float, compiled> fixed(2, 2, 16);
        check_same_attention(dynamic, fixed);
    }
    SUBCASE("sliding window") {
        sliding_window_cache<float, runtime> dynamic({6, 3}, 2, 2, 8, 2, 16);
        sliding_window_cache<float, compiled> fixed(2, 2, 8, 2, 16);
        check_same_attention(dynamic, fixed);
    }
}

TEST_CASE("a dynamic owner saves its counts, and a load into other counts is refused with nothing loaded") {
    paged_cache<half, runtime> source({6, 3}, 1, 8, 4);
    const sequence_id id = source.add_sequence();
    source.append(id, 0, rows(5, 3, 0.1f), rows(5, 3, 0.2f), 5);
    std::stringstream file;
    source.save(file);
    const std::string bytes = file.str();

    paged_cache<half, runtime> same({6, 3}, 1, 8, 4);
    std::istringstream in(bytes);
    const auto loaded = same.load(in);
    REQUIRE(loaded.size() == 1);
    CHECK(same.length(loaded[0]) == 5);

    paged_cache<half, runtime> other({8, 4}, 1, 8, 4);
    std::istringstream again(bytes);
    CHECK_THROWS_WITH_AS(other.load(again), doctest::Contains("6q/3kv/d16"), error);
    CHECK(other.sequence_count() == 0);
}

TEST_CASE("an owner over dynamic heads refuses counts that break the rules") {
    CHECK_THROWS_WITH_AS((paged_cache<float, runtime>({6, 4}, 1, 8, 4)),
                         doctest::Contains("query_heads = 6 is not a multiple of kv_heads = 4"), error);
    CHECK_THROWS_WITH_AS((paged_cache<float, runtime>(runtime{}, 1, 8, 4)),
                         doctest::Contains("the head counts are not set"), error);
}
