// What the quality examples (07_compress, 09_kv_precision) share to read a
// comma-separated option and to write their tables in kvcache_bench's JSON
// schema.
#pragma once

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvcache::examples {

/// The comma-separated items of an option's value ("a,b,c"), empty items kept.
inline std::vector<std::string> split_commas(const std::string& list) {
    std::vector<std::string> out;
    std::size_t start = 0;
    for (;;) {
        const std::size_t comma = list.find(',', start);
        out.push_back(list.substr(start, comma - start));
        if (comma == std::string::npos) return out;
        start = comma + 1;
    }
}

/// Writes {"machine", "results"} to `path` (--json), then says so on stdout;
/// throws naming the path when it cannot be written.
inline void write_json_report(const std::string& path, const nlohmann::json& machine, const nlohmann::json& results) {
    std::ofstream out(path);
    out << nlohmann::json{{"machine", machine}, {"results", results}}.dump(2) << "\n";
    if (!out) throw std::runtime_error("--json: could not write '" + path + "'");
    std::printf("\nwrote %s\n", path.c_str());
}

}  // namespace kvcache::examples
