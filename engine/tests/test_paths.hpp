// Paths of the data the engine tests read (the shipped model, the config
// fixtures), given by CTest in the environment rather than compiled in: a path
// compiled into an object file makes it differ in every clone, so ccache could
// never serve it to a fresh CI checkout.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace kvcache_test {

/// The directory the environment variable `name` names; throws naming the
/// variable when it is unset or empty (run the test through ctest, which sets it).
inline std::string directory_from_environment(const char* name) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0')
        throw std::runtime_error(std::string(name) +
                                 " is not set: run this test through ctest, which sets it to the data's directory");
    return value;
}

}  // namespace kvcache_test
