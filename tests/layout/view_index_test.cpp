// Index math of the three layout views, checked exhaustively on small shapes
// against the obvious formulas, and the run() contract checked generically.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kvcache/layout.hpp"

namespace {

using heads = kvcache::head_config<4, 2, 8>;
constexpr int kv = heads::kv_heads();
constexpr int dim = heads::head_dim;

// Walks the runs of (seq, kv_head) from visible index 0 and checks that they
// tile the visible positions exactly, with each row where key()/value() say.
template <class View>
void check_runs(const View& view, int seq, int kv_head) {
    const int visible = view.visible_count(seq);
    int at = 0;
    while (at < visible) {
        const auto r = view.run(seq, kv_head, at);
        REQUIRE(r.count > 0);
        REQUIRE(at + r.count <= visible);
        CHECK(r.first_visible == at);
        CHECK(r.first_position == view.visible_position(seq, at));
        for (int i = 0; i < r.count; ++i) {
            const int p = view.visible_position(seq, at + i);
            CHECK(p == r.first_position + i);
            CHECK(r.keys + std::int64_t(i) * r.stride == view.key(seq, kv_head, p));
            CHECK(r.values + std::int64_t(i) * r.stride == view.value(seq, kv_head, p));
        }
        at += r.count;
    }
    CHECK(view.run(seq, kv_head, visible).count == 0);
}

}  // namespace

TEST_CASE("layout views are trivially copyable layout views") {
    CHECK(kvcache::is_layout_view_v<kvcache::contiguous_view<float, heads>>);
    CHECK(kvcache::is_layout_view_v<kvcache::paged_view<kvcache::half, heads>>);
    CHECK(kvcache::is_layout_view_v<kvcache::sliding_window_view<float, heads>>);
    CHECK_FALSE(kvcache::is_layout_view_v<int>);
    CHECK(kvcache::contiguous_view<float, heads>::kind == kvcache::layout_kind::contiguous);
    CHECK(kvcache::paged_view<float, heads>::kind == kvcache::layout_kind::paged);
    CHECK(kvcache::sliding_window_view<float, heads>::kind == kvcache::layout_kind::sliding_window);
}

TEST_CASE("contiguous view: packed and custom strides, slot remapping") {
    const int slots = 3;
    for (int capacity = 1; capacity <= 6; ++capacity) {
        for (int padding = 0; padding <= 8; padding += 8) {
            // Custom strides: rows padded by `padding`, heads and slots padded too.
            const std::int64_t position_stride = dim + padding;
            const std::int64_t head_stride = capacity * position_stride + padding;
            const std::int64_t slot_stride = kv * head_stride + 3 * padding;
            std::vector<float> keys(slots * slot_stride), values(slots * slot_stride);
            std::vector<int> lengths = {capacity, 0, capacity > 1 ? capacity - 1 : 1};
            std::vector<int> remap = {2, 0, 1};
            for (bool use_remap : {false, true}) {
                kvcache::contiguous_view<float, heads> view;
                if (padding == 0) {
                    view = kvcache::contiguous_view<float, heads>::packed(keys.data(), values.data(), lengths.data(),
                                                                          nullptr, slots, capacity);
                    CHECK(view.position_stride == position_stride);
                    CHECK(view.head_stride == head_stride);
                    CHECK(view.slot_stride == slot_stride);
                } else {
                    view.keys = keys.data();
                    view.values = values.data();
                    view.lengths = lengths.data();
                    view.sequences = slots;
                    view.capacity = capacity;
                    view.position_stride = position_stride;
                    view.head_stride = head_stride;
                    view.slot_stride = slot_stride;
                }
                view.slots = use_remap ? remap.data() : nullptr;
                CHECK(view.sequence_count() == slots);
                CHECK(view.visibility().window == 0);
                CHECK(view.visibility().sinks == 0);
                for (int s = 0; s < slots; ++s) {
                    const int slot = use_remap ? remap[s] : s;
                    CHECK(view.length(s) == lengths[s]);
                    CHECK(view.visible_count(s) == lengths[s]);
                    for (int h = 0; h < kv; ++h) {
                        for (int p = 0; p < capacity; ++p) {
                            const std::int64_t expected = slot * slot_stride + h * head_stride + p * position_stride;
                            CHECK(view.key(s, h, p) == keys.data() + expected);
                            CHECK(view.value(s, h, p) == values.data() + expected);
                        }
                        check_runs(view, s, h);
                        if (lengths[s] > 0) CHECK(view.run(s, h, 0).count == lengths[s]);
                    }
                    for (int i = 0; i < lengths[s]; ++i) CHECK(view.visible_position(s, i) == i);
                }
            }
        }
    }
}

TEST_CASE("paged view: every page size 1..9, shuffled page tables") {
    std::mt19937 random(7);
    for (int page_size = 1; page_size <= 9; ++page_size) {
        const int pool_pages = 12;
        const std::int64_t page_elements = std::int64_t(kv) * page_size * dim;
        std::vector<kvcache::half> keys(pool_pages * page_elements), values(pool_pages * page_elements);
        std::vector<int> pages(pool_pages);
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), random);
        // Three sequences: lengths chosen to hit empty, partial and exactly full last pages.
        const std::vector<int> lengths = {2 * page_size + 1, 0, 3 * page_size};
        std::vector<int> offsets = {0};
        std::vector<int> table;
        int next = 0;
        for (int n : lengths) {
            const int needed = (n + page_size - 1) / page_size;
            for (int i = 0; i < needed; ++i) table.push_back(pages[next++]);
            offsets.push_back(static_cast<int>(table.size()));
        }
        const auto view = kvcache::paged_view<kvcache::half, heads>::packed(
            keys.data(), values.data(), offsets.data(), table.data(), lengths.data(), 3, page_size);
        const bool power = (page_size & (page_size - 1)) == 0;
        CHECK(view.page_shift == (power ? __builtin_ctz(page_size) : -1));
        CHECK(view.page_stride == page_elements);
        for (int s = 0; s < 3; ++s) {
            CHECK(view.length(s) == lengths[s]);
            CHECK(view.visible_count(s) == lengths[s]);
            for (int p = 0; p < lengths[s]; ++p) {
                CHECK(view.page_of(p) == p / page_size);
                CHECK(view.row_of(p) == p % page_size);
                CHECK(view.visible_position(s, p) == p);
                const int page = table[offsets[s] + p / page_size];
                for (int h = 0; h < kv; ++h) {
                    const std::int64_t expected = page * page_elements + (h * page_size + p % page_size) * dim;
                    CHECK(view.key(s, h, p) == keys.data() + expected);
                    CHECK(view.value(s, h, p) == values.data() + expected);
                    const auto r = view.run(s, h, p);
                    CHECK(r.count == std::min(page_size - p % page_size, lengths[s] - p));
                    CHECK(r.stride == dim);
                }
            }
            for (int h = 0; h < kv; ++h) check_runs(view, s, h);
        }
    }
}

TEST_CASE("sliding window view: sinks 0..3, ring 1..6, lengths 0..30") {
    for (int sinks = 0; sinks <= 3; ++sinks) {
        for (int ring = 1; ring <= 6; ++ring) {
            const int window = (ring + 1) / 2;
            std::vector<int> lengths(31);
            std::iota(lengths.begin(), lengths.end(), 0);
            const int slots = static_cast<int>(lengths.size());
            const std::int64_t head_stride = std::int64_t(sinks + ring) * dim;
            std::vector<float> keys(slots * kv * head_stride), values(slots * kv * head_stride);
            const auto view = kvcache::sliding_window_view<float, heads>::packed(
                keys.data(), values.data(), lengths.data(), nullptr, slots, sinks, ring, window);
            CHECK(view.visibility().window == window);
            CHECK(view.visibility().sinks == sinks);
            for (int s = 0; s < slots; ++s) {
                const int n = lengths[s];
                // The obvious definition: sinks, and the `ring` newest positions.
                std::vector<int> present;
                for (int p = 0; p < n; ++p)
                    if (p < sinks || p >= n - ring) present.push_back(p);
                REQUIRE(view.visible_count(s) == static_cast<int>(present.size()));
                std::set<int> rows;
                for (int i = 0; i < view.visible_count(s); ++i) {
                    const int p = view.visible_position(s, i);
                    CHECK(p == present[i]);
                    const int row = p < sinks ? p : sinks + (p - sinks) % ring;
                    rows.insert(row);
                    for (int h = 0; h < kv; ++h) {
                        const std::int64_t expected = s * kv * head_stride + h * head_stride + row * dim;
                        CHECK(view.key(s, h, p) == keys.data() + expected);
                        CHECK(view.value(s, h, p) == values.data() + expected);
                    }
                }
                // Present positions never share a row: nothing visible was overwritten.
                CHECK(rows.size() == present.size());
                // Every key the newest query may see is present.
                for (int p = 0; p < n; ++p)
                    if (view.visibility().allows(n - 1, p))
                        CHECK(std::find(present.begin(), present.end(), p) != present.end());
                for (int h = 0; h < kv; ++h) check_runs(view, s, h);
                if (n > 0 && n <= sinks + ring) CHECK(view.run(s, 0, 0).count == n);
            }
        }
    }
}

TEST_CASE("sliding window: a chunk of new tokens still sees its window when ring = window + chunk - 1") {
    const int window = 4, chunk = 3, sinks = 2, ring = window + chunk - 1;
    for (int before = 0; before < 20; ++before) {
        const int n = before + chunk;  // the chunk's tokens are positions before..n-1
        std::vector<int> lengths = {n};
        std::vector<float> keys(kv * (sinks + ring) * dim), values(keys.size());
        const auto view = kvcache::sliding_window_view<float, heads>::packed(keys.data(), values.data(),
                                                                              lengths.data(), nullptr, 1, sinks,
                                                                              ring, window);
        std::set<int> present;
        for (int i = 0; i < view.visible_count(0); ++i) present.insert(view.visible_position(0, i));
        for (int q = before; q < n; ++q)
            for (int p = 0; p <= q; ++p)
                if (view.visibility().allows(q, p)) CHECK(present.count(p) == 1);
    }
}
