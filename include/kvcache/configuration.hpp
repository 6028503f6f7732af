// The configuration layer: compiled configurations (layout x element type x
// head configuration) as types and lists, the model presets, and the one
// runtime dispatcher that maps a model's runtime shape onto what was compiled.
#pragma once

#include "kvcache/configuration/configuration.hpp"
#include "kvcache/configuration/dispatch.hpp"
#include "kvcache/configuration/presets.hpp"
#include "kvcache/configuration/tensor_parallel.hpp"
