// The kernel test matrix, shared by every backend under test: builds a cache
// through a factory, fills it through reference_backend::append, runs the backend's
// decode / prefill / append and compares with the double-precision reference.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvcache/backend/reference.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/memory.hpp"
#include "scatter_layout.hpp"
#include "scored_queries.hpp"

namespace kvcache_test {

using namespace kvcache;

/// One context shape: sequence lengths, the window and sinks the layout keeps
/// (0: everything), rows per run, prefill chunk per sequence, options.
struct context_case {
    const char* name;
    std::vector<int> lengths;
    int window = 0;
    int sinks = 0;
    int run_length = 16;
    std::vector<int> chunk;  ///< prefill query tokens per sequence (<= length)
    attention_options options{};
    bool drop = true;  ///< false: the layout keeps every position and only visibility() applies the window
};

/// The three contexts of the matrix: short; crossing runs (pages) and the
/// window, with a soft cap; long enough to split the decode, with a scale.
inline std::vector<context_case> standard_cases() {
    attention_options capped;
    capped.logits_soft_cap = 5.0f;
    attention_options split;
    split.softmax_scale = 0.3f;
    split.kv_splits = 3;
    return {
        {"short", {5, 9, 1}, 0, 0, 16, {3, 9, 1}, {}},
        {"crossing", {37, 70}, 24, 4, 12, {20, 33}, capped},
        {"long", {600, 300}, 0, 0, 16, {40, 17}, split},
        {"masked", {150, 90}, 40, 3, 8, {30, 90}, {}, false},
    };
}

/// Counts distinct (kernel, layout, type, heads) combinations verified and prints them at exit.
class combination_registry {
public:
    static combination_registry& instance() {
        static combination_registry registry;
        return registry;
    }
    void add(const std::string& kernel, const std::string& layout, const std::string& type, const std::string& heads) {
        combinations_.insert(kernel + " / " + layout + " / " + type + " / " + heads);
    }
    ~combination_registry() {
        std::printf("kvcache kernel tests: %zu (kernel, layout, type, heads) combinations verified against the reference\n",
                    combinations_.size());
    }

private:
    std::set<std::string> combinations_;
};

/// Tolerance on outputs (|value| <= 1: convex combinations of values in [-1, 1]).
/// float outputs: FP32 accumulation over at most a few hundred keys of
/// head_dim <= 128 differs from double by ~1e-6 relative; 2e-5 leaves margin
/// without hiding a wrong weight (a single misplaced key moves outputs by
/// >1e-3 at these lengths). half outputs: rounding the result to binary16
/// alone costs up to 2^-11 = 4.9e-4 at magnitude 1, so 1e-3. bfloat16
/// outputs: its 8-bit significand rounds a value below 1 by up to 2^-9 =
/// 1.95e-3, so 2.5e-3 (still under the 1e-2 a wrong weight would cost with
/// the bfloat16 rounding of the stored values at these lengths).
template <class Output>
double output_tolerance() {
    if constexpr (std::is_same_v<Output, float>) return 2e-5;
    if constexpr (std::is_same_v<Output, bfloat16>) return 2.5e-3;
    return 1e-3;
}

/// Tolerance on log-sum-exp (magnitude up to ~10): FP32 sum of exps, 1e-5 relative.
inline double lse_tolerance(double lse) { return 1e-5 * std::max(1.0, std::fabs(lse)); }

/// Compares a backend's outputs and log-sum-exps (any buffers with size() and []) with the reference's.
template <class Outputs, class Lse>
void compare(const Outputs& actual, const Lse& actual_lse, const reference::attention_result& expected,
             const std::string& what) {
    using Output = detail::range_element_t<const Outputs>;
    INFO(what);
    REQUIRE(actual.size() == expected.outputs.size());
    double worst = 0.0;
    std::size_t worst_index = 0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const double error = std::fabs(double(to_float(actual[i])) - expected.outputs[i]);
        if (!(error <= worst)) worst = error, worst_index = i;  // NaN counts as worst
    }
    INFO("worst output error " << worst << " at " << worst_index);
    CHECK(worst <= output_tolerance<Output>());
    for (std::size_t i = 0; i < actual_lse.size(); ++i) {
        if (std::isinf(expected.lse[i])) {
            CHECK(std::isinf(actual_lse[i]));
            CHECK(actual_lse[i] < 0);
            continue;
        }
        if (std::fabs(actual_lse[i] - expected.lse[i]) > lse_tolerance(expected.lse[i])) {
            INFO("lse " << actual_lse[i] << " vs " << expected.lse[i] << " at " << i);
            CHECK(false);
            break;
        }
    }
}

template <class T>
std::vector<T> random_rows(std::size_t count, float magnitude, unsigned seed) {
    std::mt19937 random(seed);
    std::uniform_real_distribution<float> uniform(-magnitude, magnitude);
    std::vector<T> rows(count);
    for (auto& x : rows) x = from_float<T>(uniform(random));
    return rows;
}

/// A Buffer<T> (host_buffer, or memory a device backend reads) holding values.
/// @tparam Buffer the factory's buffer template
template <template <class> class Buffer, class T>
Buffer<T> buffer_of(const std::vector<T>& values) {
    Buffer<T> buffer(std::max<std::size_t>(values.size(), 1));
    std::copy(values.begin(), values.end(), &buffer[0]);
    return buffer;
}

/// A Buffer<T> of count copies of value (outputs the backend must overwrite).
/// @tparam Buffer the factory's buffer template
template <template <class> class Buffer, class T>
Buffer<T> filled(std::size_t count, T value) {
    return buffer_of<Buffer>(std::vector<T>(count, value));
}

/// The first count elements of a buffer as a span (buffer_of keeps at least one).
template <class Buffer>
auto first(Buffer& buffer, std::size_t count) {
    return span<detail::range_element_t<Buffer>>(buffer.data(), count);
}
template <class Buffer>
auto first(const Buffer& buffer, std::size_t count) {
    return span<const detail::range_element_t<const Buffer>>(buffer.data(), count);
}

/// Fills every present row of a cache through reference_backend::append of whole sequences.
template <class View>
void fill_cache(const View& view, unsigned seed) {
    using heads = typename View::heads;
    std::vector<int> offsets(1, 0);
    for (int b = 0; b < view.sequence_count(); ++b) offsets.push_back(offsets.back() + view.length(b));
    const std::size_t count = std::size_t(offsets.back()) * view.kv_heads() * heads::head_dim;
    const auto keys = random_rows<float>(count, 1.0f, seed);
    const auto values = random_rows<float>(count, 1.0f, seed + 1);
    reference_backend{}.append(append_params(view, keys, values, offsets));
}

/// Query positions for a prefill of chunk[b] tokens per sequence placed by
/// hand: unsorted, repeated, some past the sequence's length (cascade), some
/// before its end (what a tree of drafts asks).
inline std::vector<int> scattered_positions(const std::vector<int>& offsets, const std::vector<int>& lengths,
                                            unsigned seed) {
    std::mt19937 random(seed);
    std::vector<int> positions;
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
        std::uniform_int_distribution<int> pick(0, lengths[b] + 8);
        for (int t = offsets[b]; t < offsets[b + 1]; ++t) positions.push_back(pick(random));
    }
    return positions;
}

inline std::string heads_name(int q, int kv, int d) {
    return std::to_string(q) + "q/" + std::to_string(kv) + "kv/d" + std::to_string(d);
}

/// Runs decode and prefill (at the last positions and at explicit query
/// positions) of a backend on a cache from Factory for every standard case
/// and compares with the reference. Query elements are Query; heads carries
/// the counts of a dynamic head configuration. Every buffer is the factory's
/// (memory the backend reads); the backend's synchronize() precedes each comparison.
/// @tparam Factory struct with name, buffer<T>, and make<Element, Heads>(case, seed, heads) returning an owner with view()
/// @tparam Element the cache's element type
/// @tparam Heads a head_config
/// @tparam Query the queries' and outputs' element type
/// @tparam Backend a backend object (reference_backend, cpu_backend, emulated_backend, ...)
template <class Factory, class Element, class Heads, class Query = Element, class Backend>
void check_attention(const Backend& backend, const std::string& backend_name, const Heads& counts = Heads{},
                     const std::vector<context_case>& cases = standard_cases()) {
    const std::string type = element_name<Element>();
    const std::string query_type = element_traits<Query>::name;
    const std::string heads = heads_name(counts.query_heads(), counts.kv_heads(), Heads::head_dim) +
                              (Heads::static_counts ? "" : " (dynamic)");
    const reference_backend reference;
    unsigned seed = 11;
    for (const context_case& c : cases) {
        auto cache = Factory::template make<Element, Heads>(c, seed++, counts);
        const auto view = cache->view();
        fill_cache(view, seed++);
        const std::string what = backend_name + " " + Factory::name + " " + type + " cache, " + query_type +
                                 " queries, " + heads + ", " + c.name;
        const int batch = view.sequence_count();
        {  // decode
            const std::size_t rows = std::size_t(batch) * counts.query_heads();
            const auto host_queries = random_rows<Query>(rows * Heads::head_dim, 3.0f, seed++);
            const auto queries = buffer_of<Factory::template buffer>(host_queries);
            auto outputs = filled<Factory::template buffer>(rows * Heads::head_dim, from_float<Query>(99.0f));
            auto lse = filled<Factory::template buffer>(rows, 99.0f);
            decode_params call(view, first(queries, rows * Heads::head_dim), first(outputs, rows * Heads::head_dim));
            call.lse = first(lse, rows);
            call.options = c.options;
            backend.decode(call);
            backend.synchronize();
            const auto scored = scored_queries<Backend>::template of<Element, Heads::head_dim>(
                host_queries, resolved_softmax_scale(c.options, Heads::head_dim), counts.query_heads() / counts.kv_heads());
            compare(call.outputs, call.lse, decode_as_scored(call, scored), what + ", decode");
        }
        std::vector<int> host_offsets(1, 0);
        for (int b = 0; b < batch; ++b) host_offsets.push_back(host_offsets.back() + c.chunk[b]);
        const auto offsets = buffer_of<Factory::template buffer>(host_offsets);
        const std::size_t rows = std::size_t(host_offsets.back()) * counts.query_heads();
        const auto queries = buffer_of<Factory::template buffer>(random_rows<Query>(rows * Heads::head_dim, 3.0f, seed++));
        const auto offset_span = first(offsets, host_offsets.size());
        for (const bool explicit_positions : {false, true}) {  // at the last positions, then placed by hand
            const auto positions = buffer_of<Factory::template buffer>(scattered_positions(host_offsets, c.lengths, seed++));
            auto outputs = filled<Factory::template buffer>(rows * Heads::head_dim, from_float<Query>(99.0f));
            auto lse = filled<Factory::template buffer>(rows, 99.0f);
            prefill_params call(view, first(queries, rows * Heads::head_dim), offset_span,
                                first(outputs, rows * Heads::head_dim));
            call.lse = first(lse, rows);
            if (explicit_positions) call.query_positions = first(positions, std::size_t(host_offsets.back()));
            call.options = c.options;
            backend.prefill(call);
            backend.synchronize();
            compare(call.outputs, call.lse, reference.prefill_exact(call),
                    what + (explicit_positions ? ", prefill at explicit positions" : ", prefill"));
        }
    }
    combination_registry::instance().add("decode", Factory::name, type, heads);
    combination_registry::instance().add("prefill", Factory::name, type, heads);
}

/// Appends the last chunk[b] tokens of every sequence with a backend and
/// with the reference into two identical caches and compares every stored row
/// bit for bit; then the same at explicit positions (every other present one).
/// @tparam Factory see check_attention
/// @tparam Element the cache's element type
/// @tparam Heads a head_config
/// @tparam Input the new rows' element type
/// @tparam Backend a backend object
template <class Factory, class Element, class Heads, class Input = Element, class Backend>
void check_append(const Backend& backend, const std::string& backend_name, const Heads& counts = Heads{},
                  const std::vector<context_case>& cases = standard_cases()) {
    const std::string type = element_name<Element>();
    // A stored row's bytes, an int8 row's scale and int4's group records too (a K/V pair's each side's).
    constexpr std::size_t key_bytes = row_elements<key_element_t<Element>>(Heads::head_dim) * sizeof(key_element_t<Element>);
    constexpr std::size_t value_bytes =
        row_elements<value_element_t<Element>>(Heads::head_dim) * sizeof(value_element_t<Element>);
    unsigned seed = 101;
    for (const context_case& c : cases) {
        for (const bool explicit_positions : {false, true}) {
            auto actual = Factory::template make<Element, Heads>(c, seed, counts);
            auto expected = Factory::template make<Element, Heads>(c, seed, counts);
            seed++;
            const auto view = actual->view();
            const auto expected_view = expected->view();
            std::vector<int> offsets(1, 0), positions;
            for (int b = 0; b < view.sequence_count(); ++b) {
                int tokens = c.chunk[b];
                if (explicit_positions) {  // every other present position, newest first
                    tokens = 0;
                    for (int i = view.visible_count(b) - 1; i >= 0; i -= 2, ++tokens)
                        positions.push_back(view.visible_position(b, i));
                }
                offsets.push_back(offsets.back() + tokens);
            }
            const std::size_t count = std::size_t(offsets.back()) * counts.kv_heads() * Heads::head_dim;
            const auto keys = buffer_of<Factory::template buffer>(random_rows<Input>(count, 1.0f, seed++));
            const auto values = buffer_of<Factory::template buffer>(random_rows<Input>(count, 1.0f, seed++));
            const auto offset_buffer = buffer_of<Factory::template buffer>(offsets), position_buffer = buffer_of<Factory::template buffer>(positions);
            append_params call(view, first(keys, count), first(values, count), first(offset_buffer, offsets.size()));
            call.positions = first(position_buffer, positions.size());
            backend.append(call);
            backend.synchronize();
            append_params expected_call(expected_view, call.keys, call.values, call.new_token_offsets);
            expected_call.positions = call.positions;
            reference_backend{}.append(expected_call);
            INFO(backend_name << " append, " << Factory::name << " " << type << ", " << c.name
                              << (explicit_positions ? ", explicit positions" : ""));
            std::size_t mismatches = 0;
            for (int b = 0; b < view.sequence_count(); ++b)
                for (int i = 0; i < view.visible_count(b); ++i) {
                    const int p = view.visible_position(b, i);
                    for (int h = 0; h < counts.kv_heads(); ++h) {
                        mismatches += std::memcmp(view.key(b, h, p), expected_view.key(b, h, p), key_bytes) != 0;
                        mismatches += std::memcmp(view.value(b, h, p), expected_view.value(b, h, p), value_bytes) != 0;
                    }
                }
            CHECK(mismatches == 0);
        }
    }
    combination_registry::instance().add("append", Factory::name, type,
                                         heads_name(counts.query_heads(), counts.kv_heads(), Heads::head_dim));
}

/// Factory of the private scatter layout.
struct scatter_factory {
    static constexpr const char* name = "scatter";
    template <class T>
    using buffer = host_buffer<T>;
    template <class Element, class Heads>
    static std::unique_ptr<scatter_cache<Element, Heads>> make(const context_case& c, unsigned seed,
                                                                 const Heads& heads = Heads{}) {
        return std::make_unique<scatter_cache<Element, Heads>>(c.lengths, c.window, c.sinks, c.run_length, seed, c.drop,
                                                               heads);
    }
};

}  // namespace kvcache_test
