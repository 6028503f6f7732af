// The small interface every KV layout view offers, and the only thing kernels
// know about a layout. A view is trivially copyable and passed to kernels by
// value; its accessors are __host__ __device__.
//
// A view covers a batch of sequences, addressed by batch slot 0..N-1 (the
// owner maps its sequence ids to slots when it makes the view). Positions are
// logical token positions 0..length-1 in the sequence. Of those, a layout may
// keep only some ("present": the sliding window drops old ones); present
// positions are numbered by a "visible index" 0..visible_count-1 in ascending
// position order.
//
// Members of a layout view V with element type E:
//   using element_type = E;  using heads = head_config<...>;
//   static constexpr layout_kind kind;
//   int  sequence_count() const;                  batch slots in the view
//   int  query_heads() const, kv_heads() const, group_size() const;
//                                                 the head counts (constants for a compiled head_config)
//   int  length(int seq) const;                   tokens the sequence holds (logical)
//   int  visible_count(int seq) const;            present positions
//   int  visible_position(int seq, int i) const;  logical position of visible index i (ascending in i)
//   K*   key(int seq, int kv_head, int position) const;    row of head_dim elements; position present
//   V*   value(int seq, int kv_head, int position) const;  (K, V: key_element_t<E>, value_element_t<E>,
//                                                 both E unless E is a kv_elements pair)
//   position_run<E> run(int seq, int kv_head, int visible_begin) const;
//                                                 the maximal evenly strided run from visible_begin
//   attention_visibility visibility() const;      which present keys a query may see
// and, optionally (kvcache's own views have it; read through scales_of()):
//   kv_scales scales;                             what stored keys and values are multiplied by (fp8)
//
// Owners reserve space (pages, ring slots, length) before a kernel writes the
// new tokens' rows through key()/value(); kernels never allocate.
#pragma once

#include <type_traits>

#include "kvcache/core/config.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/core/kv_elements.hpp"

namespace kvcache {

/// Which layout a view is; used in files, dispatch and messages.
enum class layout_kind : int { contiguous = 0, paged = 1, sliding_window = 2 };

/// The name of a layout kind.
inline const char* to_string(layout_kind kind) noexcept {
    switch (kind) {
    case layout_kind::contiguous: return "contiguous";
    case layout_kind::paged: return "paged";
    case layout_kind::sliding_window: return "sliding_window";
    }
    return "unknown";
}

namespace detail {
/// A run's value stride: none of its own for one element type (values share
/// the key stride), value_stride for a kv_elements pair, whose value rows
/// differ in size from its key rows.
template <bool Pair>
struct value_run_stride {};
template <>
struct value_run_stride<true> {
    int value_stride = 0;  ///< value elements from one row to the next
};
}  // namespace detail

/// A run of present positions whose key and value rows for one KV head are
/// evenly strided in memory: kernels stream it with wide loads. Read value
/// rows through value_stride_of(run): for a kv_elements pair the values have
/// a stride of their own.
/// @tparam Element the stored element type, or a kv_elements pair
template <class Element>
struct position_run : detail::value_run_stride<is_kv_pair_v<Element>> {
    key_element_t<Element>* keys = nullptr;      ///< key row of the run's first position
    value_element_t<Element>* values = nullptr;  ///< value row of the run's first position
    int first_visible = 0;      ///< visible index of the first position
    int first_position = 0;     ///< logical position of the first row; row r is first_position + r
    int count = 0;              ///< rows in the run (0 past the end)
    int stride = 0;             ///< elements from one (key) row to the next
};

/// Value elements from one row of the run to the next: the run's own value
/// stride for a kv_elements pair, its stride otherwise.
/// @tparam Element the run's element type
template <class Element>
KVCACHE_HOST_DEVICE constexpr int value_stride_of(const position_run<Element>& run) noexcept {
    if constexpr (is_kv_pair_v<Element>) return run.value_stride;
    else return run.stride;
}

/// Which keys a query may attend to, on top of causality (key <= query):
/// with window > 0 only keys newer than query - window, plus the first
/// `sinks` positions, which stay visible forever.
struct attention_visibility {
    int window = 0;  ///< 0: unlimited
    int sinks = 0;   ///< positions kept visible regardless of the window

    /// True when a query at query_position may attend to key_position.
    KVCACHE_HOST_DEVICE constexpr bool allows(int query_position, int key_position) const noexcept {
        if (key_position > query_position) return false;
        if (window <= 0 || key_position < sinks) return true;
        return key_position > query_position - window;
    }
};

namespace detail {

template <class View, class = void>
struct has_layout_interface : std::false_type {};

template <class View>
struct has_layout_interface<
    View, std::void_t<typename View::element_type, typename View::heads, decltype(View::kind),
                      decltype(std::declval<const View&>().sequence_count()),
                      decltype(std::declval<const View&>().kv_heads()),
                      decltype(std::declval<const View&>().query_heads()),
                      decltype(std::declval<const View&>().group_size()),
                      decltype(std::declval<const View&>().length(0)),
                      decltype(std::declval<const View&>().visible_count(0)),
                      decltype(std::declval<const View&>().visible_position(0, 0)),
                      decltype(std::declval<const View&>().key(0, 0, 0)),
                      decltype(std::declval<const View&>().value(0, 0, 0)),
                      decltype(std::declval<const View&>().run(0, 0, 0)),
                      decltype(std::declval<const View&>().visibility())>>
    : std::bool_constant<std::is_trivially_copyable_v<View>> {};

}  // namespace detail

namespace detail {

/// The view with writable element pointers. Attention over a read-only view
/// (const elements) runs the kernels compiled for the writable one, which
/// only read through them; append never gets here with a read-only view.
/// @tparam View a layout view with with_elements()
template <class View>
KVCACHE_HOST_DEVICE constexpr auto attention_view_of(const View& view) noexcept {
    using element = typename View::element_type;
    if constexpr (std::is_const_v<element>) {
        using writable = std::remove_const_t<element>;
        using key = key_element_t<writable>;
        using value = value_element_t<writable>;
        return view.template with_elements<writable>(const_cast<key*>(view.keys), const_cast<value*>(view.values));
    } else {
        return view;
    }
}

/// The view type attention_view_of() returns.
/// @tparam View a layout view
template <class View>
using attention_view_t = decltype(attention_view_of(std::declval<const View&>()));

}  // namespace detail

namespace detail {
template <class View, class = void>
struct has_scales : std::false_type {};
template <class View>
struct has_scales<View, std::void_t<decltype(std::declval<const View&>().scales)>> : std::true_type {};
}  // namespace detail

/// The scales a view's stored rows are read through: its `scales` member, or
/// 1 and 1 for a layout of the caller's that has none.
/// @tparam View a layout view
template <class View>
KVCACHE_HOST_DEVICE constexpr kv_scales scales_of(const View& view) noexcept {
    if constexpr (detail::has_scales<View>::value) return view.scales;
    else return kv_scales{};
}

/// True when View offers the layout interface above and is trivially copyable.
/// @tparam View candidate layout view type
template <class View>
inline constexpr bool is_layout_view_v = detail::has_layout_interface<View>::value;

}  // namespace kvcache
