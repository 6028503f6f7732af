// Scratch folders of the model tests, written once: named per process and
// removed when the test program ends.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace kvcache::examples::testing {

/// An empty (not yet created) path <temp>/<prefix>_<process id>_<name>, removed
/// with everything in it when the program ends. The process id keeps
/// concurrent runs (two build trees, ctest -j) apart.
inline std::string scratch_dir(const std::string& prefix, const std::string& name) {
    struct folders {
        std::vector<std::filesystem::path> made;
        ~folders() {
            std::error_code ignored;
            for (const auto& dir : made) std::filesystem::remove_all(dir, ignored);
        }
    };
    static folders scratch;
    auto dir = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(dir);
    scratch.made.push_back(dir);
    return dir.string();
}

}  // namespace kvcache::examples::testing
