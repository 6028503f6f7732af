// Command-line parsing shared by the examples: "--name value" options with
// checked conversions, so a bad argument is one clear message, not a crash.
#pragma once

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcache/core/element.hpp"
#include "kvcache/layout/layout_interface.hpp"

namespace kvcache::examples {

/// A bad command line; main() prints what() and exits non-zero.
struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// The options of a command line: flags (no value) and "--name value" pairs.
class arguments {
public:
    /// `flags` lists the options that take no value; `valued` those that take one.
    arguments(int argc, char** argv, const std::vector<std::string>& flags, const std::vector<std::string>& valued) {
        for (int i = 1; i < argc; ++i) {
            std::string a = argv[i];
            if (is_one_of(a, flags)) {
                values_[a] = "";
            } else if (is_one_of(a, valued)) {
                if (i + 1 >= argc) throw usage_error("option " + a + " needs a value");
                values_[a] = argv[++i];
            } else {
                throw usage_error("unknown argument '" + a + "' (see --help)");
            }
        }
    }

    bool has(const std::string& name) const { return values_.count(name) != 0; }

    std::string text(const std::string& name, const std::string& fallback) const {
        auto it = values_.find(name);
        return it == values_.end() ? fallback : it->second;
    }

    /// An integer in [low, high].
    int integer(const std::string& name, int fallback, int low, int high) const {
        return has(name) ? parse_int(name, values_.at(name), low, high) : fallback;
    }

    /// A comma-separated list of integers in [low, high], e.g. "128,256".
    std::vector<int> integers(const std::string& name, const std::vector<int>& fallback, int low, int high) const {
        if (!has(name)) return fallback;
        std::vector<int> out;
        std::string list = values_.at(name);
        std::size_t start = 0;
        for (;;) {
            std::size_t comma = list.find(',', start);
            out.push_back(parse_int(name, list.substr(start, comma - start), low, high));
            if (comma == std::string::npos) break;
            start = comma + 1;
        }
        return out;
    }

    /// contiguous | paged | sliding_window (also "sliding").
    layout_kind layout(const std::string& name, layout_kind fallback) const {
        if (!has(name)) return fallback;
        const std::string& v = values_.at(name);
        if (v == "contiguous") return layout_kind::contiguous;
        if (v == "paged") return layout_kind::paged;
        if (v == "sliding_window" || v == "sliding") return layout_kind::sliding_window;
        throw usage_error(name + " '" + v + "' is not one of contiguous, paged, sliding_window");
    }

    /// The element kinds a usage error lists (kvcache::parse_element_kind's names).
    static constexpr const char* element_names = "fp32, fp16, bf16, fp8 (e4m3), e4m3, e5m2, int8, int4";

    /// fp32 | fp16 | bf16 | fp8 | e4m3 | e5m2 | int8 | int4 (kvcache::parse_element_kind's names).
    element_kind element(const std::string& name, element_kind fallback) const {
        if (!has(name)) return fallback;
        const std::string& v = values_.at(name);
        element_kind kind{};
        if (parse_element_kind(v.c_str(), kind)) return kind;
        throw usage_error(name + " '" + v + "' is not one of " + element_names);
    }

    /// The kinds of a cache's keys and values: `name` (one kind for both, or
    /// KEY+VALUE such as int8+int4), then key_name and value_name, where
    /// given, for that side alone (llama.cpp's -ctk / -ctv). E.g. --dtype fp16
    /// --v-dtype int4 stores fp16 keys and int4 values.
    kv_kinds kinds(const std::string& name, const std::string& key_name, const std::string& value_name,
                   element_kind fallback) const {
        kv_kinds kinds(fallback);
        if (has(name)) {
            const std::string& v = values_.at(name);
            if (!parse_kv_kinds(v, kinds))
                throw usage_error(name + " '" + v + "' is not one of " + element_names +
                                  ", or KEY+VALUE of two of them (e.g. int8+int4)");
        }
        kinds.key = element(key_name, kinds.key);
        kinds.value = element(value_name, kinds.value);
        return kinds;
    }

    static int parse_int(const std::string& name, const std::string& text, int low, int high) {
        errno = 0;
        char* end = nullptr;
        long v = std::strtol(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno == ERANGE)
            throw usage_error(name + " '" + text + "' is not an integer");
        if (v < low || v > high)
            throw usage_error(name + " " + text + " is outside [" + std::to_string(low) + ", " + std::to_string(high) + "]");
        return static_cast<int>(v);
    }

private:
    static bool is_one_of(const std::string& a, const std::vector<std::string>& names) {
        for (const auto& n : names)
            if (a == n) return true;
        return false;
    }

    std::map<std::string, std::string> values_;
};

}  // namespace kvcache::examples
