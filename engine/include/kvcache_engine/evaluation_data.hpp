// The evaluation data of a byte-level model, as tools/train_model/train.py writes
// it beside the weights: held-out text cut into windows of bytes, and a recall
// set (texts with the byte spans of their answers) in JSON.
#pragma once

#include <cstddef>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvcache/core/error.hpp"
#include "kvcache_engine/evaluation.hpp"

namespace kvcache::examples {

/// The bytes of a file, as they are.
inline std::string read_file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    require(bool(in), error_code::invalid_argument, path, ": cannot open");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Token ids of a byte-level model: bos, then each byte's value (0..255).
inline std::vector<int> byte_tokens(const std::string& bytes, int bos) {
    std::vector<int> ids{bos};
    for (unsigned char b : bytes) ids.push_back(b);
    return ids;
}

/// Consecutive non-overlapping windows of window_bytes bytes of text, each as byte_tokens
/// (a shorter tail is dropped), at most max_windows of them (0: all).
inline std::vector<std::vector<int>> byte_windows(const std::string& text, int window_bytes, int bos,
                                                  int max_windows = 0) {
    require(window_bytes > 0, error_code::invalid_argument, "byte_windows: window_bytes = ", window_bytes,
            " must be positive");
    std::vector<std::vector<int>> windows;
    const std::size_t w = static_cast<std::size_t>(window_bytes);
    for (std::size_t first = 0; first + w <= text.size(); first += w) {
        if (max_windows > 0 && windows.size() == static_cast<std::size_t>(max_windows)) break;
        windows.push_back(byte_tokens(text.substr(first, w), bos));
    }
    return windows;
}

/// A recall set file: {"bos_token": id, "items": [{"text": "...", "answers": [[first_byte, length], ...]}]}.
/// Each text becomes byte_tokens(text, bos_token), its answers token positions (byte + 1).
/// Throws kvcache::error naming the file and the item of a malformed entry.
inline std::vector<recall_item> read_recall_set(const std::string& path) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_file_bytes(path));
    } catch (const nlohmann::json::exception& e) {
        throw_error(error_code::format_error, path, ": ", e.what());
    }
    require(j.is_object() && j.contains("bos_token") && j["bos_token"].is_number_integer() && j.contains("items") &&
                j["items"].is_array(),
            error_code::format_error, path, ": needs an integer 'bos_token' and an array 'items'");
    const int bos = j["bos_token"].get<int>();
    std::vector<recall_item> items;
    for (std::size_t i = 0; i < j["items"].size(); ++i) {
        const nlohmann::json& e = j["items"][i];
        require(e.is_object() && e.contains("text") && e["text"].is_string() && e.contains("answers") &&
                    e["answers"].is_array(),
                error_code::format_error, path, ": items[", i, "] needs a string 'text' and an array 'answers'");
        recall_item item;
        const std::string text = e["text"].get<std::string>();
        item.tokens = byte_tokens(text, bos);
        for (const nlohmann::json& a : e["answers"]) {
            require(a.is_array() && a.size() == 2 && a[0].is_number_integer() && a[1].is_number_integer(),
                    error_code::format_error, path, ": items[", i, "]: answer ", a.dump(),
                    " is not [first_byte, length]");
            const int first = a[0].get<int>(), length = a[1].get<int>();
            require(first >= 0 && length >= 1 && static_cast<std::size_t>(first) + length <= text.size(),
                    error_code::format_error, path, ": items[", i, "]: answer [", first, ", ", length,
                    "] is outside its text of ", text.size(), " bytes");
            item.answers.push_back({first + 1, length});
        }
        items.push_back(std::move(item));
    }
    return items;
}

}  // namespace kvcache::examples
