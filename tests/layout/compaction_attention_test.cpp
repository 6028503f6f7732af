// Attention after compaction of a paged or a contiguous cache: every backend (reference, CPU,
// emulated kernels) over a compacted sequence equals the reference's
// attention over the kept rows alone at their true positions, for decode and
// prefill chunks appended after the compaction, with causal masks, windows
// and sinks on true positions, in float, half and bfloat16 (and fp8 e4m3 on
// the reference and CPU backends), and again after a second compaction.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/testing.hpp"

namespace {

using heads = kvcache::head_config<4, 2, 16>;
constexpr int kv = heads::kv_heads(), dim = heads::head_dim, group = heads::group_size();
constexpr int row = kv * dim, layers = 2, page = 4;

/// A row element: a fixed function of (salt, position, layer, index), in [-2, 2].
float value_at(int salt, int position, int layer, int i) {
    return static_cast<float>((salt * 17 + position * 131 + layer * 71 + i * 29) % 61 - 30) / 15.0f;
}

/// What one layer of one sequence stores, by the model: positions and their
/// rows (as the element type holds them, in double), [row][kv_head][head_dim].
struct layer_model {
    std::vector<int> positions;
    std::vector<double> keys, values;

    void add(int position, const std::vector<double>& k, const std::vector<double>& v) {
        positions.push_back(position);
        keys.insert(keys.end(), k.begin(), k.end());
        values.insert(values.end(), v.begin(), v.end());
    }
    /// Keeps only the rows at the given indices.
    void keep(const std::vector<int>& kept) {
        layer_model out;
        for (int i : kept)
            out.add(positions[std::size_t(i)],
                    std::vector<double>(keys.begin() + std::ptrdiff_t(i) * row, keys.begin() + std::ptrdiff_t(i + 1) * row),
                    std::vector<double>(values.begin() + std::ptrdiff_t(i) * row, values.begin() + std::ptrdiff_t(i + 1) * row));
        *this = out;
    }
    /// The reference's gathered rows of one KV head.
    kvcache::reference::gathered_rows gathered(int kv_head) const {
        kvcache::reference::gathered_rows g;
        g.head_dim = dim;
        g.positions = positions;
        for (std::size_t r = 0; r < positions.size(); ++r) {
            const std::size_t at = r * row + std::size_t(kv_head) * dim;
            g.keys.insert(g.keys.end(), keys.begin() + std::ptrdiff_t(at), keys.begin() + std::ptrdiff_t(at + dim));
            g.values.insert(g.values.end(), values.begin() + std::ptrdiff_t(at), values.begin() + std::ptrdiff_t(at + dim));
        }
        return g;
    }
};

struct sequence_model {
    int length = 0;
    std::vector<layer_model> layer{std::size_t(layers)};
};

/// Rows of n new tokens from position first, of one layer, and the same as the
/// model keeps them (rounded to Element).
template <class Element>
void new_rows(int salt, int first, int n, int l, std::vector<float>& keys, std::vector<float>& values,
              sequence_model* model) {
    keys.clear();
    values.clear();
    for (int t = 0; t < n; ++t) {
        std::vector<double> k, v;
        for (int i = 0; i < row; ++i) {
            keys.push_back(value_at(salt, first + t, l, i));
            values.push_back(value_at(salt + 7, first + t, l, i));
            k.push_back(kvcache::to_float(kvcache::from_float<Element>(keys.back())));
            v.push_back(kvcache::to_float(kvcache::from_float<Element>(values.back())));
        }
        if (model) model->layer[std::size_t(l)].add(first + t, k, v);
    }
}

/// Output tolerance of float outputs over rows held exactly (the oracle reads
/// the same rounded rows): FP32 accumulation over a few dozen keys.
constexpr double tolerance = 5e-5;

/// One step through a plan: appends chunk[i] tokens to batch[i] with the
/// backend's append (every layer), then attends (decode when every chunk is 1
/// and decode is asked for, else prefill) and compares each layer with the
/// reference over the model's rows.
template <class Cache, class Backend>
void step_and_check(Cache& cache, const Backend& backend,
                    const std::vector<kvcache::sequence_id>& batch, std::vector<sequence_model*> models,
                    const std::vector<int>& chunk, bool decode, kvcache::attention_options options, int salt) {
    using Element = typename Cache::element_type;
    auto plan = cache.plan(batch, chunk);
    const auto offsets = plan.host_offsets();
    const int tokens = plan.total_new_tokens();
    for (int l = 0; l < layers; ++l) {
        std::vector<float> keys, values;
        for (std::size_t b = 0; b < batch.size(); ++b) {
            std::vector<float> k, v;
            new_rows<Element>(salt + int(b), plan.first_new_position(int(b)), chunk[b], l, k, v, models[b]);
            keys.insert(keys.end(), k.begin(), k.end());
            values.insert(values.end(), v.begin(), v.end());
        }
        backend.append(kvcache::append_params(plan.view(l), keys, values, plan.new_token_offsets()));
    }
    for (std::size_t b = 0; b < batch.size(); ++b) models[b]->length += chunk[b];
    const kvcache::attention_visibility visibility{options.window, options.sinks};
    const double scale = 1.0 / std::sqrt(double(dim));
    for (int l = 0; l < layers; ++l) {
        std::vector<float> queries(std::size_t(tokens) * heads::query_heads() * dim);
        for (std::size_t i = 0; i < queries.size(); ++i) queries[i] = value_at(salt + 3, int(i), l, int(i % 13)) / 2.0f;
        std::vector<float> outputs(queries.size());
        if (decode) {
            kvcache::decode_params call(plan.view(l), queries, outputs);
            call.options = options;
            backend.decode(call);
        } else {
            kvcache::prefill_params call(plan.view(l), queries, plan.new_token_offsets(), outputs);
            call.options = options;
            backend.prefill(call);
        }
        double worst = 0.0;
        for (std::size_t b = 0; b < batch.size(); ++b) {
            const sequence_model& m = *models[b];
            for (int t = 0; t < chunk[b]; ++t) {
                const int position = m.length - chunk[b] + t;
                for (int h = 0; h < heads::query_heads(); ++h) {
                    const auto rows = m.layer[std::size_t(l)].gathered(h / group);
                    const std::size_t at = (std::size_t(offsets[b] + t) * heads::query_heads() + h) * dim;
                    std::vector<double> q(queries.begin() + std::ptrdiff_t(at), queries.begin() + std::ptrdiff_t(at + dim));
                    std::vector<double> want(dim);
                    kvcache::reference::detail::attend(q.data(), rows, position, visibility, scale, 0.0, want.data());
                    for (int d = 0; d < dim; ++d) worst = std::max(worst, std::fabs(double(outputs[at + d]) - want[std::size_t(d)]));
                }
            }
        }
        INFO("layer " << l << (decode ? " decode" : " prefill") << " window " << options.window << " sinks "
                      << options.sinks);
        CHECK(worst <= tolerance);
    }
}

/// Fills a sequence of n tokens through write() (every layer) and the model.
template <class Cache>
void fill(Cache& cache, kvcache::sequence_id id, sequence_model& model, int n, int salt) {
    using Element = typename Cache::element_type;
    const int first = cache.begin_append(id, n);
    for (int l = 0; l < layers; ++l) {
        std::vector<float> k, v;
        new_rows<Element>(salt, first, n, l, k, v, &model);
        cache.write(id, l, first, k, v, n);
    }
    model.length += n;
}

/// The cache's stored positions and rows of every layer equal the model's.
template <class Cache>
void check_rows(const Cache& cache, kvcache::sequence_id id, const sequence_model& model) {
    using Element = typename Cache::element_type;
    REQUIRE(cache.length(id) == model.length);
    for (int l = 0; l < layers; ++l) {
        const layer_model& m = model.layer[std::size_t(l)];
        INFO("sequence " << id << " layer " << l);
        REQUIRE(cache.present_positions(id, l) == m.positions);
        CHECK(cache.visible_count(id, l) == int(m.positions.size()));
        for (std::size_t i = 0; i < m.positions.size(); ++i) {
            std::vector<Element> k(row), v(row);
            cache.read(id, l, m.positions[i], 1, k, v);
            for (int e = 0; e < row; ++e) {
                CHECK(double(kvcache::to_float(k[std::size_t(e)])) == m.keys[i * row + std::size_t(e)]);
                CHECK(double(kvcache::to_float(v[std::size_t(e)])) == m.values[i * row + std::size_t(e)]);
            }
        }
    }
}

/// A paged cache of 48 pages, or a contiguous one of 2 slots of 40 rows: a
/// has 23 + 11 positions, of which it stores at most 23 after the compaction.
template <class Cache>
Cache make_cache() {
    if constexpr (Cache::kind == kvcache::layout_kind::paged) return Cache(layers, 48, page);
    else return Cache(layers, 2, 40);
}

template <class Element, class Backend, class Cache = kvcache::paged_cache<Element, heads>>
void run_backend(const Backend& backend) {
    Cache cache = make_cache<Cache>();
    const auto a = cache.add_sequence(), b = cache.add_sequence();
    sequence_model ma, mb;
    fill(cache, a, ma, 23, 1);
    fill(cache, b, mb, 9, 2);
    // PyramidKV-like: the layers keep different rows and different counts;
    // layer 0 keeps the sinks, scattered middle rows and the recent ones.
    const std::vector<std::vector<int>> kept = {{0, 1, 2, 5, 6, 7, 8, 13, 17, 20, 21, 22}, {0, 3, 4, 9, 10, 11, 12, 19}};
    cache.compact(a, kept);
    for (int l = 0; l < layers; ++l) ma.layer[std::size_t(l)].keep(kept[std::size_t(l)]);
    check_rows(cache, a, ma);
    CHECK(cache.length(a) == 23);  // the next token's position is unchanged

    kvcache::attention_options plain;
    step_and_check(cache, backend, {a, b}, {&ma, &mb}, {1, 1}, true, plain, 10);
    step_and_check(cache, backend, {a, b}, {&ma, &mb}, {5, 3}, false, plain, 20);  // a chunk after the compaction
    kvcache::attention_options windowed;
    windowed.window = 6;
    windowed.sinks = 2;
    step_and_check(cache, backend, {b, a}, {&mb, &ma}, {1, 1}, true, windowed, 30);
    step_and_check(cache, backend, {a, b}, {&ma, &mb}, {4, 2}, false, windowed, 40);
    check_rows(cache, a, ma);

    // Compact again (every N steps): the rows appended since are among those picked.
    const int rows0 = cache.visible_count(a, 0);
    const std::vector<int> again = {0, 1, 4, rows0 - 7, rows0 - 5, rows0 - 4, rows0 - 1};
    cache.compact(a, 0, again);
    ma.layer[0].keep(again);
    check_rows(cache, a, ma);
    step_and_check(cache, backend, {a, b}, {&ma, &mb}, {1, 1}, true, plain, 50);
    step_and_check(cache, backend, {a}, {&ma}, {3}, false, windowed, 60);
    check_rows(cache, a, ma);
    check_rows(cache, b, mb);
}

/// Drops from the model what a window of `sinks` sinks and a ring of `ring`
/// rows no longer holds: positions p >= sinks with p < length - ring.
void evict(sequence_model& m, int sinks, int ring) {
    for (layer_model& l : m.layer) {
        std::vector<int> keep;
        for (std::size_t i = 0; i < l.positions.size(); ++i)
            if (l.positions[i] < sinks || l.positions[i] >= m.length - ring) keep.push_back(int(i));
        l.keep(keep);
    }
}

/// The sliding-window owner: compaction leaves holes, the ring moves on, and
/// attention (the layout's own window and sinks) equals the reference over
/// the rows the model says are kept and held.
template <class Element, class Backend>
void run_sliding(const Backend& backend) {
    constexpr int window = 6, sinks = 2, chunk = 5, ring = window + chunk - 1;
    kvcache::sliding_window_cache<Element, heads> cache(layers, 2, window, sinks, chunk);
    const auto a = cache.add_sequence(), b = cache.add_sequence();
    sequence_model ma, mb;
    for (int done = 0; done < 23; done += chunk) fill(cache, a, ma, std::min(chunk, 23 - done), 1 + done);
    fill(cache, b, mb, 4, 2);
    evict(ma, sinks, ring);  // a holds 0, 1 and 13..22
    check_rows(cache, a, ma);
    const std::vector<std::vector<int>> kept = {{0, 2, 3, 5, 7, 8, 11}, {1, 2, 4, 6, 9, 10, 11}};
    cache.compact(a, kept);
    for (int l = 0; l < layers; ++l) ma.layer[std::size_t(l)].keep(kept[std::size_t(l)]);
    check_rows(cache, a, ma);

    kvcache::attention_options own;
    own.window = window;
    own.sinks = sinks;
    step_and_check(cache, backend, {a, b}, {&ma, &mb}, {1, 1}, true, own, 10);
    step_and_check(cache, backend, {a, b}, {&ma, &mb}, {5, 3}, false, own, 20);
    evict(ma, sinks, ring);
    evict(mb, sinks, ring);
    check_rows(cache, a, ma);
    const int rows0 = cache.visible_count(a, 0);
    const std::vector<int> again = {1, 2, rows0 - 4, rows0 - 2, rows0 - 1};
    cache.compact(a, 0, again);
    ma.layer[0].keep(again);
    check_rows(cache, a, ma);
    step_and_check(cache, backend, {b, a}, {&mb, &ma}, {1, 1}, true, own, 30);
    step_and_check(cache, backend, {a, b}, {&ma, &mb}, {4, 2}, false, own, 40);
    evict(ma, sinks, ring);
    evict(mb, sinks, ring);
    check_rows(cache, a, ma);
    check_rows(cache, b, mb);
}

}  // namespace

// fp8 too where it runs (the emulated and CUDA launches refuse fp8 storage):
// compaction moves stored elements and never reads them.
TEST_CASE_TEMPLATE("attention after compaction equals the reference over the kept rows: reference backend", Element,
                   float, kvcache::half, kvcache::bfloat16, kvcache::float8_e4m3) {
    run_backend<Element>(kvcache::reference_backend{});
}

TEST_CASE_TEMPLATE("attention after compaction equals the reference over the kept rows: CPU backend", Element, float,
                   kvcache::half, kvcache::bfloat16, kvcache::float8_e4m3) {
    run_backend<Element>(kvcache::cpu_backend{});
}

TEST_CASE_TEMPLATE("attention after compaction equals the reference over the kept rows: emulated kernels", Element,
                   float, kvcache::half, kvcache::bfloat16) {
    run_backend<Element>(kvcache::emulated_backend{});
}

// The contiguous owner compacts with the same call: rows move to the front of
// the slot, and the view presents them at their true positions.
TEST_CASE_TEMPLATE("contiguous: attention after compaction equals the reference over the kept rows", Element, float,
                   kvcache::half, kvcache::bfloat16) {
    using cache = kvcache::static_cache<Element, heads>;
    run_backend<Element, kvcache::reference_backend, cache>(kvcache::reference_backend{});
    run_backend<Element, kvcache::cpu_backend, cache>(kvcache::cpu_backend{});
    run_backend<Element, kvcache::emulated_backend, cache>(kvcache::emulated_backend{});
}

TEST_CASE("contiguous fp8: attention after compaction equals the reference over the kept rows") {
    using cache = kvcache::dynamic_cache<kvcache::float8_e4m3, heads>;
    run_backend<kvcache::float8_e4m3, kvcache::reference_backend, cache>(kvcache::reference_backend{});
    run_backend<kvcache::float8_e4m3, kvcache::cpu_backend, cache>(kvcache::cpu_backend{});
}

TEST_CASE_TEMPLATE("sliding window: attention after compaction equals the reference over the kept rows", Element, float,
                   kvcache::half, kvcache::bfloat16) {
    run_sliding<Element>(kvcache::reference_backend{});
    run_sliding<Element>(kvcache::cpu_backend{});
    run_sliding<Element>(kvcache::emulated_backend{});
}
