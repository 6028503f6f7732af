// Collects benchmark results, prints them as a table and writes the JSON file
// {"machine": {...}, "results": [{"benchmark", "params", "metrics"}]}.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/timing.hpp"
#include "kvcache/core/error.hpp"

namespace kvcache::bench {

/// One measured configuration of one benchmark.
struct result {
    std::string benchmark;     ///< generation, decode_bandwidth, layout_overhead, memory_waste, prefill
    nlohmann::json params;     ///< what was run
    nlohmann::json metrics;    ///< what was measured
};

/// Adds name (the median), name_min and name_max of a timing, scaled (e.g. 1e3 for ms).
inline void add_timing(nlohmann::json& metrics, const std::string& name, const timing& t, double scale) {
    metrics[name] = t.median * scale;
    metrics[name + "_min"] = t.min * scale;
    metrics[name + "_max"] = t.max * scale;
}

/// Adds name (amount per second at the median time), name_min (at the slowest
/// run) and name_max (at the fastest), e.g. bytes / 1e9 as gbytes_per_s.
inline void add_rate(nlohmann::json& metrics, const std::string& name, double amount, const timing& t) {
    metrics[name] = amount / t.median;
    metrics[name + "_min"] = amount / t.max;
    metrics[name + "_max"] = amount / t.min;
}

namespace detail {

/// "key=value key=value" with numbers to four significant digits.
inline std::string compact(const nlohmann::json& object) {
    std::string out;
    char buffer[64];
    for (auto it = object.begin(); it != object.end(); ++it) {
        std::string value;
        if (it->is_number_float()) {
            std::snprintf(buffer, sizeof buffer, "%.4g", it->get<double>());
            value = buffer;
        } else if (it->is_boolean()) {
            value = it->get<bool>() ? "yes" : "NO";
        } else if (it->is_string()) {
            value = it->get<std::string>();
        } else {
            value = it->dump();
        }
        if (!out.empty()) out += ' ';
        out += it.key() + '=' + value;
    }
    return out;
}

}  // namespace detail

/// All results of a run, with the machine they ran on.
class report {
public:
    explicit report(nlohmann::json machine) : machine_(std::move(machine)) {}

    /// Records a result and prints it as one table row.
    void add(result r) {
        std::printf("%-16s | %-58s | %s\n", r.benchmark.c_str(), detail::compact(r.params).c_str(),
                    detail::compact(r.metrics).c_str());
        std::fflush(stdout);
        results_.push_back(std::move(r));
    }

    const std::vector<result>& results() const noexcept { return results_; }
    nlohmann::json& machine() noexcept { return machine_; }

    /// The whole run as JSON.
    nlohmann::json to_json() const {
        nlohmann::json out;
        out["machine"] = machine_;
        out["results"] = nlohmann::json::array();
        for (const auto& r : results_)
            out["results"].push_back({{"benchmark", r.benchmark}, {"params", r.params}, {"metrics", r.metrics}});
        return out;
    }

    /// Writes the JSON file; throws kvcache::error naming the path on failure.
    void write(const std::string& path) const {
        std::ofstream out(path);
        if (!out) throw_error(error_code::io_error, "cannot open '", path, "' for writing");
        out << to_json().dump(2) << '\n';
        if (!out) throw_error(error_code::io_error, "writing '", path, "' failed");
    }

private:
    nlohmann::json machine_;
    std::vector<result> results_;
};

}  // namespace kvcache::bench
