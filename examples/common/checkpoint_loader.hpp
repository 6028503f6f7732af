// Loading a Hugging Face Llama-family checkpoint folder: config.json for the
// architecture, *.safetensors (sharded through model.safetensors.index.json
// when present) for the weights, converted to float once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/model_weights.hpp"
#include "common/safetensors.hpp"

namespace kvcache::examples {

/// The model types the loader runs, for messages and docs.
inline const char* supported_model_types() noexcept { return "llama, mistral, qwen2"; }

/// What a checkpoint's config says beyond the architecture.
struct checkpoint_config {
    model_config model;
    int sliding_window = 0;  ///< the model attends only to this many recent tokens; 0: unlimited
};

namespace detail {

inline const nlohmann::json* config_field(const nlohmann::json& j, const char* field) {
    auto it = j.find(field);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

inline int config_int(const nlohmann::json& j, const std::string& file, const char* field, std::optional<int> fallback) {
    const nlohmann::json* v = config_field(j, field);
    if (!v) {
        require(fallback.has_value(), error_code::format_error, file, ": required field '", field, "' is missing");
        return *fallback;
    }
    require(v->is_number_integer() && v->get<std::int64_t>() >= 0 && v->get<std::int64_t>() <= (1 << 30),
            error_code::format_error, file, ": field '", field, "' = ", v->dump(), " is not an integer in [0, 2^30]");
    return static_cast<int>(v->get<std::int64_t>());
}

inline double config_number(const nlohmann::json& j, const std::string& file, const char* field, double fallback) {
    const nlohmann::json* v = config_field(j, field);
    if (!v) return fallback;
    require(v->is_number(), error_code::format_error, file, ": field '", field, "' = ", v->dump(), " is not a number");
    return v->get<double>();
}

inline bool config_bool(const nlohmann::json& j, const std::string& file, const char* field, bool fallback) {
    const nlohmann::json* v = config_field(j, field);
    if (!v) return fallback;
    require(v->is_boolean(), error_code::format_error, file, ": field '", field, "' = ", v->dump(), " is not true/false");
    return v->get<bool>();
}

inline nlohmann::json read_json_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    require(static_cast<bool>(in), error_code::io_error, path, ": cannot open");
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        throw_error(error_code::format_error, path, ": not valid JSON: ", e.what());
    }
}

}  // namespace detail

/// The architecture from a parsed config.json; refuses what the model cannot run, naming the field.
inline checkpoint_config parse_model_config(const nlohmann::json& j, const std::string& file) {
    require(j.is_object(), error_code::format_error, file, ": not a JSON object");
    checkpoint_config out;
    model_config& c = out.model;
    const nlohmann::json* type = detail::config_field(j, "model_type");
    require(type && type->is_string(), error_code::format_error, file, ": field 'model_type' is missing");
    c.model_type = type->get<std::string>();
    require(c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2",
            error_code::unsupported_configuration, file, ": model_type = '", c.model_type,
            "' is not supported (supported: ", supported_model_types(), ")");
    if (const nlohmann::json* act = detail::config_field(j, "hidden_act"))
        require(act->is_string() && act->get<std::string>() == "silu", error_code::unsupported_configuration, file,
                ": hidden_act = ", act->dump(), " is not supported (only silu)");
    require(!detail::config_bool(j, file, "mlp_bias", false), error_code::unsupported_configuration, file,
            ": mlp_bias = true is not supported");

    c.vocab_size = detail::config_int(j, file, "vocab_size", std::nullopt);
    c.hidden_size = detail::config_int(j, file, "hidden_size", std::nullopt);
    c.num_layers = detail::config_int(j, file, "num_hidden_layers", std::nullopt);
    c.num_query_heads = detail::config_int(j, file, "num_attention_heads", std::nullopt);
    c.num_kv_heads = detail::config_int(j, file, "num_key_value_heads", c.num_query_heads);
    require(c.num_query_heads > 0, error_code::format_error, file, ": num_attention_heads must be positive");
    c.head_dim = detail::config_int(j, file, "head_dim", c.hidden_size / c.num_query_heads);
    c.intermediate_size = detail::config_int(j, file, "intermediate_size", std::nullopt);
    c.rms_norm_eps = static_cast<float>(detail::config_number(j, file, "rms_norm_eps", 1e-6));
    c.rope_theta = detail::config_number(j, file, "rope_theta", 10000.0);
    c.tie_word_embeddings = detail::config_bool(j, file, "tie_word_embeddings", false);
    c.max_position_embeddings = detail::config_int(j, file, "max_position_embeddings", 0);
    // Qwen2 always has q/k/v biases and no o_proj bias; Llama's attention_bias puts one on all four.
    c.attention_bias = c.model_type == "qwen2" ? true : detail::config_bool(j, file, "attention_bias", false);
    c.output_bias = c.model_type == "qwen2" ? false : c.attention_bias;

    if (const nlohmann::json* s = detail::config_field(j, "rope_scaling")) {
        require(s->is_object(), error_code::format_error, file, ": rope_scaling is not an object");
        const nlohmann::json* kind = detail::config_field(*s, "rope_type");
        if (!kind) kind = detail::config_field(*s, "type");
        std::string name = kind && kind->is_string() ? kind->get<std::string>() : std::string("(missing)");
        std::string sfile = file + " rope_scaling";
        if (name == "default") {
        } else if (name == "linear") {
            c.scaling.type = rope_scaling::kind::linear;
            c.scaling.factor = detail::config_number(*s, sfile, "factor", 1.0);
        } else if (name == "llama3") {
            c.scaling.type = rope_scaling::kind::llama3;
            c.scaling.factor = detail::config_number(*s, sfile, "factor", 8.0);
            c.scaling.low_freq_factor = detail::config_number(*s, sfile, "low_freq_factor", 1.0);
            c.scaling.high_freq_factor = detail::config_number(*s, sfile, "high_freq_factor", 4.0);
            c.scaling.original_max_position_embeddings =
                detail::config_int(*s, sfile, "original_max_position_embeddings", 8192);
            require(c.scaling.high_freq_factor > c.scaling.low_freq_factor, error_code::format_error, file,
                    ": rope_scaling.high_freq_factor must exceed low_freq_factor");
        } else {
            throw_error(error_code::unsupported_configuration, file, ": rope_scaling.rope_type = '", name,
                        "' is not supported (supported: default, linear, llama3)");
        }
        require(c.scaling.factor > 0.0, error_code::format_error, file, ": rope_scaling.factor must be positive");
    }
    // Mistral always honours sliding_window; Qwen2 only when use_sliding_window is set.
    bool windowed = c.model_type == "mistral" ||
                    (c.model_type == "qwen2" && detail::config_bool(j, file, "use_sliding_window", false));
    if (windowed) out.sliding_window = detail::config_int(j, file, "sliding_window", 0);
    try {
        c.validate();
    } catch (const error& e) {
        throw_error(error_code::format_error, file, ": ", e.what());
    }
    return out;
}

/// A checkpoint folder's config.json.
inline checkpoint_config read_model_config(const std::string& directory) {
    std::string path = (std::filesystem::path(directory) / "config.json").string();
    return parse_model_config(detail::read_json_file(path), path);
}

/// The safetensors files of a folder and which one holds each tensor.
class checkpoint_files {
public:
    explicit checkpoint_files(const std::string& directory) {
        namespace fs = std::filesystem;
        fs::path dir(directory);
        require(fs::is_directory(dir), error_code::io_error, directory, ": not a directory");
        fs::path index = dir / "model.safetensors.index.json";
        if (fs::exists(index)) {
            nlohmann::json j = detail::read_json_file(index.string());
            auto map = j.find("weight_map");
            require(j.is_object() && map != j.end() && map->is_object(), error_code::format_error, index.string(),
                    ": missing object 'weight_map'");
            for (auto it = map->begin(); it != map->end(); ++it) {
                require(it->is_string(), error_code::format_error, index.string(), ": weight_map entry for '", it.key(),
                        "' is not a file name");
                std::string name = it->get<std::string>();
                require(fs::path(name).filename().string() == name, error_code::format_error, index.string(),
                        ": weight_map entry for '", it.key(), "' names '", name, "' outside the folder");
                owner_[it.key()] = open((dir / name).string());
            }
        } else {
            std::vector<std::string> paths;
            for (const auto& entry : fs::directory_iterator(dir))
                if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
            require(!paths.empty(), error_code::not_found, directory, ": no *.safetensors files");
            std::sort(paths.begin(), paths.end());
            for (const auto& p : paths) {
                const safetensors_file* f = open(p);
                for (const auto& [name, entry] : f->header().tensors) {
                    (void)entry;
                    auto [it, inserted] = owner_.emplace(name, f);
                    require(inserted, error_code::format_error, "tensor '", name, "' appears in both ", it->second->path(),
                            " and ", p);
                }
            }
        }
    }

    bool contains(const std::string& name) const { return owner_.count(name) != 0; }

    /// The tensor as float with the expected shape; errors name the file and the tensor.
    std::vector<float> read(const std::string& name, const std::vector<std::uint64_t>& shape) const {
        auto it = owner_.find(name);
        require(it != owner_.end(), error_code::not_found, "tensor '", name, "' is in none of the checkpoint's files");
        require(it->second->contains(name), error_code::format_error, it->second->path(), ": tensor '", name,
                "' is missing (the index says it is here)");
        return it->second->read_floats(name, shape);
    }

private:
    const safetensors_file* open(const std::string& path) {
        auto it = files_.find(path);
        if (it == files_.end()) it = files_.emplace(path, std::make_unique<safetensors_file>(path)).first;
        return it->second.get();
    }

    std::map<std::string, std::unique_ptr<safetensors_file>> files_;
    std::map<std::string, const safetensors_file*> owner_;
};

/// All weights of a checkpoint folder, shapes checked against its config.
inline model_weights load_checkpoint(const std::string& directory, const checkpoint_config& config) {
    const model_config& c = config.model;
    checkpoint_files files(directory);
    using shape = std::vector<std::uint64_t>;
    auto u = [](int v) { return static_cast<std::uint64_t>(v); };
    model_weights w;
    w.config = c;
    w.embedding = files.read("model.embed_tokens.weight", shape{u(c.vocab_size), u(c.hidden_size)});
    for (int l = 0; l < c.num_layers; ++l) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        layer_weights layer;
        layer.attention_norm = files.read(p + "input_layernorm.weight", shape{u(c.hidden_size)});
        layer.wq = files.read(p + "self_attn.q_proj.weight", shape{u(c.q_width()), u(c.hidden_size)});
        layer.wk = files.read(p + "self_attn.k_proj.weight", shape{u(c.kv_width()), u(c.hidden_size)});
        layer.wv = files.read(p + "self_attn.v_proj.weight", shape{u(c.kv_width()), u(c.hidden_size)});
        layer.wo = files.read(p + "self_attn.o_proj.weight", shape{u(c.hidden_size), u(c.q_width())});
        if (c.attention_bias) {
            layer.bq = files.read(p + "self_attn.q_proj.bias", shape{u(c.q_width())});
            layer.bk = files.read(p + "self_attn.k_proj.bias", shape{u(c.kv_width())});
            layer.bv = files.read(p + "self_attn.v_proj.bias", shape{u(c.kv_width())});
        }
        if (c.output_bias) layer.bo = files.read(p + "self_attn.o_proj.bias", shape{u(c.hidden_size)});
        layer.mlp_norm = files.read(p + "post_attention_layernorm.weight", shape{u(c.hidden_size)});
        layer.w_gate = files.read(p + "mlp.gate_proj.weight", shape{u(c.intermediate_size), u(c.hidden_size)});
        layer.w_up = files.read(p + "mlp.up_proj.weight", shape{u(c.intermediate_size), u(c.hidden_size)});
        layer.w_down = files.read(p + "mlp.down_proj.weight", shape{u(c.hidden_size), u(c.intermediate_size)});
        w.layers.push_back(std::move(layer));
    }
    w.final_norm = files.read("model.norm.weight", shape{u(c.hidden_size)});
    if (!c.tie_word_embeddings) w.lm_head = files.read("lm_head.weight", shape{u(c.vocab_size), u(c.hidden_size)});
    return w;
}

}  // namespace kvcache::examples
