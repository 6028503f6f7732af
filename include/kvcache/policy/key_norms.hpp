// Key norms: a score that needs no attention. Keys of low L2 norm draw much
// attention (the knorm policy keeps them), so a layer can be ranked from the
// cache alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "kvcache/core/element.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache {

/// norms[(b x kv_heads + h) x stride + i] = the L2 norm of the key row at
/// visible index i of sequence b, KV head h, read through the view's scales
/// (an fp8 cache's key scale, an int8 row's own scale); entries past the visible count are 0. The
/// view is host memory; norms holds batch x kv_heads x stride floats and
/// stride is at least every visible count.
/// @tparam Layout a layout view over host memory
template <class Layout>
void key_norms(const Layout& view, span<float> norms, int stride) {
    static_assert(is_layout_view_v<Layout>, "kvcache::key_norms needs a layout view");
    constexpr int dim = Layout::heads::head_dim;
    const int batch = view.sequence_count();
    require(stride > 0, error_code::invalid_argument, "key_norms stride = ", stride, " must be positive");
    require(norms.size() == std::size_t(batch) * std::size_t(view.kv_heads()) * std::size_t(stride),
            error_code::invalid_argument, "norms holds ", norms.size(), " entries but ", batch, " sequences x ",
            view.kv_heads(), " kv_heads x stride ", stride, " = ", std::size_t(batch) * view.kv_heads() * stride,
            " are needed");
    for (int b = 0; b < batch; ++b) {
        const int visible = view.length(b) > 0 ? view.visible_count(b) : 0;
        require(visible <= stride, error_code::invalid_argument, "batch entry ", b, " has ", visible,
                " visible rows but the key_norms stride is ", stride);
    }
    const float scale = scales_of(view).key;
    for (int b = 0; b < batch; ++b) {
        const int visible = view.length(b) > 0 ? view.visible_count(b) : 0;
        for (int h = 0; h < view.kv_heads(); ++h) {
            float* out = norms.data() + (std::size_t(b) * view.kv_heads() + h) * stride;
            for (int i = 0; i < visible; ++i) {
                const auto* key = view.key(b, h, view.visible_position(b, i));
                double sum = 0.0;
                if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(key)>>, qint4>) {
                    for (int d = 0; d < dim; ++d) {
                        const double x = double(qint4_value(key, dim, d));  // its group's minimum + code * scale
                        sum += x * x;
                    }
                    out[i] = float(std::sqrt(sum));
                } else {
                    for (int d = 0; d < dim; ++d) {
                        const double x = double(to_float(key[d]));
                        sum += x * x;
                    }
                    out[i] = float(std::sqrt(sum) * scale * row_scale_of(key, dim));  // an int8 row's scale; 1 otherwise
                }
            }
            std::fill(out + visible, out + stride, 0.0f);
        }
    }
}

}  // namespace kvcache
