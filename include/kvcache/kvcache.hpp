// The umbrella header: everything kvcache offers host code.
#pragma once

#include "kvcache/core.hpp"
