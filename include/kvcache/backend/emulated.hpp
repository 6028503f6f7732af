// The emulated CUDA backend (tests only): the very kernel bodies the CUDA
// backend launches, run on the host by the SIMT emulator, every thread of
// every block, with its fault checks. Views and pointers are host memory.
#pragma once

#include "kvcache/backend/detail/launch_sequence.hpp"
#include "kvcache/core/memory.hpp"
#include "kvcache/execution/emulator.hpp"

namespace kvcache {
namespace emulated {

/// Multiprocessors the emulated backend plans for: small, so the split and
/// multi-block paths are taken on test-sized inputs without many idle blocks.
inline constexpr int emulated_multiprocessors = 2;

namespace detail {

/// The Launcher policy of launch_sequence.hpp over kvcache::emulate.
struct emulated_launcher {
    emulator_options options;
    int multiprocessors() const noexcept { return emulated_multiprocessors; }
    template <class Body, class Params>
    void launch(index3 grid, std::size_t shared_bytes, const Params& params) {
        emulate<Body>(grid, shared_bytes, params, options);
    }
    template <class T>
    host_buffer<T> workspace(std::size_t count) {
        return host_buffer<T>(count);
    }
};

}  // namespace detail

/// Appends new tokens' K/V (see cpu::append) with the append kernel.
/// @tparam Layout a layout view over host memory
/// @tparam Keys a sized buffer of float or kvcache::half
/// @tparam Values a sized buffer of the same element type
/// @tparam Offsets a sized buffer of int
template <class Layout, class Keys, class Values, class Offsets>
void append(const Layout& view, const Keys& keys, const Values& values, const Offsets& new_token_offsets,
            const emulator_options& emulator = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Keys>, kvcache::detail::range_element_t<Values>>();
    const auto k = make_span(keys);
    const auto v = make_span(values);
    const span<const int> offsets = make_span(new_token_offsets);
    kvcache::detail::check_append(view, k.size(), v.size(), offsets, true);
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_append(launcher, view, k.data(), v.data(), offsets.data());
}

/// Decode attention (see cpu::decode_attention) with the decode and merge kernels.
/// @tparam Layout a layout view over host memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Outputs a sized buffer of the same element type
template <class Layout, class Queries, class Outputs>
void decode_attention(const Layout& view, const Queries& queries, Outputs&& outputs, const attention_options& options = {},
                      const emulator_options& emulator = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Queries>, kvcache::detail::range_element_t<Outputs>>();
    const auto q = make_span(queries);
    const auto o = make_span(outputs);
    kvcache::detail::check_decode(view, q.size(), o.size(), false, 0, options);
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_decode(launcher, view, q.data(), o.data(), static_cast<float*>(nullptr), options);
}

/// Decode attention that also writes each (sequence, query head)'s log-sum-exp.
/// @tparam Layout a layout view over host memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Outputs a sized buffer of the same element type
/// @tparam Lse a sized buffer of float
template <class Layout, class Queries, class Outputs, class Lse>
void decode_attention_with_lse(const Layout& view, const Queries& queries, Outputs&& outputs, Lse&& lse,
                               const attention_options& options = {}, const emulator_options& emulator = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Queries>, kvcache::detail::range_element_t<Outputs>>();
    const auto q = make_span(queries);
    const auto o = make_span(outputs);
    const span<float> l = make_span(lse);
    kvcache::detail::check_decode(view, q.size(), o.size(), true, l.size(), options);
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_decode(launcher, view, q.data(), o.data(), l.data(), options);
}

/// Prefill attention (see cpu::prefill_attention) with the prefill kernel.
/// @tparam Layout a layout view over host memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Offsets a sized buffer of int
/// @tparam Outputs a sized buffer of the queries' element type
template <class Layout, class Queries, class Offsets, class Outputs>
void prefill_attention(const Layout& view, const Queries& queries, const Offsets& query_offsets, Outputs&& outputs,
                       const attention_options& options = {}, const emulator_options& emulator = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Queries>, kvcache::detail::range_element_t<Outputs>>();
    const auto q = make_span(queries);
    const span<const int> offsets = make_span(query_offsets);
    const auto o = make_span(outputs);
    kvcache::detail::check_prefill(view, q.size(), offsets, o.size(), false, 0, options, true);
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_prefill(launcher, view, q.data(), offsets.data(), o.data(), static_cast<float*>(nullptr), options);
}

/// Prefill attention that also writes each (token, query head)'s log-sum-exp.
/// @tparam Layout a layout view over host memory
/// @tparam Queries a sized buffer of float or kvcache::half
/// @tparam Offsets a sized buffer of int
/// @tparam Outputs a sized buffer of the queries' element type
/// @tparam Lse a sized buffer of float
template <class Layout, class Queries, class Offsets, class Outputs, class Lse>
void prefill_attention_with_lse(const Layout& view, const Queries& queries, const Offsets& query_offsets,
                                Outputs&& outputs, Lse&& lse, const attention_options& options = {},
                                const emulator_options& emulator = {}) {
    kvcache::detail::check_element_types<kvcache::detail::range_element_t<Queries>, kvcache::detail::range_element_t<Outputs>>();
    const auto q = make_span(queries);
    const span<const int> offsets = make_span(query_offsets);
    const auto o = make_span(outputs);
    const span<float> l = make_span(lse);
    kvcache::detail::check_prefill(view, q.size(), offsets, o.size(), true, l.size(), options, true);
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_prefill(launcher, view, q.data(), offsets.data(), o.data(), l.data(), options);
}

/// Merges partial states (see cpu::merge_states) with the merge kernel; head_dim a multiple of 8.
/// @tparam States a sized buffer of float or kvcache::half
/// @tparam StateLse a sized buffer of float
/// @tparam Merged a sized buffer of float or kvcache::half
/// @tparam MergedLse a sized buffer of float, or std::nullptr_t
template <class States, class StateLse, class Merged, class MergedLse>
void merge_states(int states, int rows, int head_dim, const States& outputs, const StateLse& lse, Merged&& merged,
                  MergedLse&& merged_lse, const emulator_options& emulator = {}) {
    const auto o = make_span(outputs);
    const span<const float> l = make_span(lse);
    const auto m = make_span(merged);
    const span<float> ml = kvcache::detail::optional_lse(merged_lse);
    kvcache::detail::check_merge(states, rows, head_dim, o.size(), l.size(), m.size(), !ml.empty(), ml.size());
    detail::emulated_launcher launcher{emulator};
    kvcache::detail::run_merge(launcher, kvcache::detail::state_major_merge(states, rows, head_dim, o.data(), l.data(),
                                                                            m.data(), ml.empty() ? nullptr : ml.data()));
}

}  // namespace emulated
}  // namespace kvcache
