// The layout layer: the view interface kernels code against and the three
// layout views (contiguous, paged, sliding window).
#pragma once

#include "kvcache/layout/contiguous_view.hpp"
#include "kvcache/layout/layout_interface.hpp"
#include "kvcache/layout/paged_view.hpp"
#include "kvcache/layout/sliding_window_view.hpp"
