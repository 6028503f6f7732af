// A private test layout: every present position's row lives in an arbitrary
// slot of one pool, so runs break wherever slots are not consecutive. It lets
// the kernel tests exercise layouts with short, irregular runs and with
// positions dropped anywhere, independently of the shipped layouts.
#pragma once

#include <algorithm>
#include <random>
#include <vector>

#include "kvcache/core/element.hpp"
#include "kvcache/core/heads.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache_test {

using namespace kvcache;

/// View over a scatter_cache. Rows of slot s: [s][kv_heads][stored row] (a
/// K/V pair's values in rows of their own type: the layout interface's
/// key_element_t and value_element_t, and a run's value_stride).
template <class Element, class Heads>
struct scatter_view {
    using element_type = Element;
    using key_type = key_element_t<Element>;
    using value_type = value_element_t<Element>;
    using heads = Heads;
    static constexpr layout_kind kind = layout_kind::paged;

    int sequences = 0;
    const int* lengths = nullptr;
    const int* offsets = nullptr;    // CSR over present positions
    const int* positions = nullptr;  // ascending per sequence
    const int* slots = nullptr;
    key_type* keys = nullptr;
    value_type* values = nullptr;
    attention_visibility window{};

    Heads head_counts{};

    int sequence_count() const { return sequences; }
    int query_heads() const { return head_counts.query_heads(); }
    int kv_heads() const { return head_counts.kv_heads(); }
    int group_size() const { return head_counts.group_size(); }
    int length(int s) const { return lengths[s]; }
    int visible_count(int s) const { return offsets[s + 1] - offsets[s]; }
    int visible_position(int s, int i) const { return positions[offsets[s] + i]; }
    int index_of(int s, int position) const {
        const int* first = positions + offsets[s];
        return int(std::lower_bound(first, positions + offsets[s + 1], position) - first);
    }
    /// Rows (one KV head's) before (s, h, position) in either plane.
    std::size_t row(int s, int h, int position) const {
        return std::size_t(slots[offsets[s] + index_of(s, position)]) * kv_heads() + h;
    }
    key_type* key(int s, int h, int position) const { return keys + row(s, h, position) * row_elements<key_type>(Heads::head_dim); }
    value_type* value(int s, int h, int position) const {
        return values + row(s, h, position) * row_elements<value_type>(Heads::head_dim);
    }
    position_run<Element> run(int s, int h, int begin) const {
        position_run<Element> r;
        const int count = visible_count(s);
        if (begin >= count) return r;
        const int* slot = slots + offsets[s];
        const int* position = positions + offsets[s];
        int n = 1;
        while (begin + n < count && slot[begin + n] == slot[begin] + n && position[begin + n] == position[begin] + n) ++n;
        r.keys = key(s, h, position[begin]);
        r.values = value(s, h, position[begin]);
        r.first_visible = begin;
        r.first_position = position[begin];
        r.count = n;
        r.stride = kv_heads() * row_elements<key_type>(Heads::head_dim);
        if constexpr (is_kv_pair_v<Element>) r.value_stride = kv_heads() * row_elements<value_type>(Heads::head_dim);
        return r;
    }
    attention_visibility visibility() const { return window; }
};

/// Owner of a scatter layout: present positions are the sinks plus the last
/// `window` positions (all when window is 0 or drop_outside_window is false,
/// so only visibility() hides them); slots come in runs of
/// `run_length` and the runs are shuffled across the pool.
template <class Element, class Heads>
class scatter_cache {
public:
    scatter_cache(const std::vector<int>& lengths, int window, int sinks, int run_length, unsigned seed,
                  bool drop_outside_window = true, const Heads& heads = Heads{})
        : lengths_(lengths), window_{window, sinks}, heads_(heads) {
        offsets_.push_back(0);
        for (int length : lengths) {
            for (int p = 0; p < length; ++p)
                if (!drop_outside_window || window <= 0 || p < sinks || p >= length - window) positions_.push_back(p);
            offsets_.push_back(int(positions_.size()));
        }
        const int rows = int(positions_.size());
        const int runs = (rows + run_length - 1) / std::max(run_length, 1);
        std::vector<int> order(std::max(runs, 0));
        for (int i = 0; i < runs; ++i) order[i] = i;
        std::mt19937 random(seed);
        std::shuffle(order.begin(), order.end(), random);
        for (int i = 0; i < rows; ++i) slots_.push_back(order[i / run_length] * run_length + i % run_length);
        const std::size_t rows_held = std::size_t(std::max(runs * run_length, 1)) * heads.kv_heads();
        keys_ = host_buffer<key_element_t<Element>>(rows_held * row_elements<key_element_t<Element>>(Heads::head_dim));
        values_ = host_buffer<value_element_t<Element>>(rows_held * row_elements<value_element_t<Element>>(Heads::head_dim));
    }

    scatter_view<Element, Heads> view() {
        return {int(lengths_.size()), lengths_.data(), offsets_.data(), positions_.data(), slots_.data(),
                keys_.data(), values_.data(), window_, heads_};
    }

    /// Fills every stored row with uniform values in [-1, 1].
    void fill_random(unsigned seed) {
        std::mt19937 random(seed);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        for (std::size_t i = 0; i < keys_.size(); ++i) keys_[i] = from_float<Element>(uniform(random));
        for (std::size_t i = 0; i < values_.size(); ++i) values_[i] = from_float<Element>(uniform(random));
    }

    host_buffer<key_element_t<Element>>& keys() { return keys_; }
    host_buffer<value_element_t<Element>>& values() { return values_; }

private:
    std::vector<int> lengths_;
    attention_visibility window_;
    Heads heads_;
    std::vector<int> offsets_, positions_, slots_;
    host_buffer<key_element_t<Element>> keys_;
    host_buffer<value_element_t<Element>> values_;
};

}  // namespace kvcache_test
