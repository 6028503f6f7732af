// The examples' main(): their exit codes and error lines, written once.
#pragma once

#include <cstdio>
#include <exception>

#include "kvcache_engine/arguments.hpp"

namespace kvcache::examples {

/// Runs an example's body and turns its exceptions into exit codes: a
/// usage_error prints "<program>: <what>" and gives 2, any other exception
/// "<program>: error: <what>" and gives 1.
/// @tparam Body a callable taking nothing and returning the exit code
template <class Body>
int run_main(const char* program, Body&& body) {
    try {
        return body();
    } catch (const usage_error& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: error: %s\n", program, e.what());
        return 1;
    }
}

}  // namespace kvcache::examples
