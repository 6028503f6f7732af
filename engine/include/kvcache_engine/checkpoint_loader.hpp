// Loading a Hugging Face Llama-family checkpoint folder: config.json for the
// architecture, *.safetensors (sharded through model.safetensors.index.json
// when present) for the weights, converted to float once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

#include "kvcache_engine/model_weights.hpp"
#include "kvcache_engine/safetensors.hpp"

namespace kvcache::examples {

/// The model types the loader runs, for messages and docs.
inline const char* supported_model_types() noexcept { return "llama, mistral, qwen2"; }

/// What a checkpoint's config says beyond the architecture.
struct checkpoint_config {
    model_config model;
    int sliding_window = 0;  ///< the windowed layers attend only to this many recent tokens; 0: no layer is windowed
    std::vector<std::string> layer_types;  ///< config field layer_types, one per layer; empty when absent
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

// Shortest decimal text that reads back as the same double, for messages ("500000", not "5e+05").
inline std::string number_text(double v) {
    char buffer[32];
    if (v == std::floor(v) && std::fabs(v) < 1e15) {
        std::snprintf(buffer, sizeof buffer, "%.0f", v);
        return buffer;
    }
    for (int precision = 1; precision <= 17; ++precision) {
        std::snprintf(buffer, sizeof buffer, "%.*g", precision, v);
        if (std::strtod(buffer, nullptr) == v) break;
    }
    return buffer;
}

// Rotary settings as one of the config's forms states them, with the field names for messages.
struct rope_reading {
    std::string where;        // "rope_parameters." or "rope_scaling." (or a layer type's entry)
    std::string theta_field;  // empty: this form states no theta
    double theta = 10000.0;
    bool has_scaling = false;  // false: this form states nothing about scaling
    std::string type = "default";
    rope_scaling scaling;
};

// The type and scaling fields of a rope_scaling or rope_parameters object.
inline void read_rope_scaling(const nlohmann::json& s, const std::string& file, const std::string& where,
                              const char* missing_type, int max_positions, rope_reading& r) {
    require(s.is_object(), error_code::format_error, file, ": ", where.substr(0, where.size() - 1), " = ", s.dump(),
            " is not an object");
    r.has_scaling = true;
    const nlohmann::json* kind = config_field(s, "rope_type");
    if (!kind) kind = config_field(s, "type");
    r.type = kind && kind->is_string() ? kind->get<std::string>() : std::string(missing_type);
    const std::string sfile = file + " " + where.substr(0, where.size() - 1);
    rope_scaling& c = r.scaling;
    if (r.type == "default") {
    } else if (r.type == "linear") {
        c.type = rope_scaling::kind::linear;
        c.factor = config_number(s, sfile, "factor", 1.0);
    } else if (r.type == "llama3") {
        c.type = rope_scaling::kind::llama3;
        c.factor = config_number(s, sfile, "factor", 8.0);
        c.low_freq_factor = config_number(s, sfile, "low_freq_factor", 1.0);
        c.high_freq_factor = config_number(s, sfile, "high_freq_factor", 4.0);
        // transformers fills a missing pre-training length from max_position_embeddings.
        c.original_max_position_embeddings = config_int(
            s, sfile, "original_max_position_embeddings",
            max_positions > 0 ? std::optional<int>(max_positions) : std::nullopt);
        require(c.high_freq_factor > c.low_freq_factor, error_code::format_error, file, ": ", where,
                "high_freq_factor must exceed low_freq_factor");
    } else {
        throw_error(error_code::unsupported_configuration, file, ": ", where, "rope_type = '", r.type,
                    "' is not supported (supported: default, linear, llama3)");
    }
    require(c.factor > 0.0, error_code::format_error, file, ": ", where, "factor must be positive");
    const double partial = config_number(s, sfile, "partial_rotary_factor", 1.0);
    require(partial == 1.0, error_code::unsupported_configuration, file, ": ", where, "partial_rotary_factor = ",
            number_text(partial), " is not supported (only 1)");
}

// Refuses two readings that would rotate differently, naming both fields and values.
inline void require_same_rope(const rope_reading& a, const rope_reading& b, const std::string& file) {
    auto differ = [&](const std::string& field, const std::string& va, const std::string& vb) {
        throw_error(error_code::format_error, file, ": ", a.where, field, " = ", va, " disagrees with ", b.where, field, " = ", vb,
                    "; a config stating both must give the same rotary embedding");
    };
    if (!a.theta_field.empty() && !b.theta_field.empty() && a.theta != b.theta)
        throw_error(error_code::format_error, file, ": ", a.theta_field, " = ", number_text(a.theta), " disagrees with ",
                    b.theta_field, " = ", number_text(b.theta), "; a config stating both must give the same rotary embedding");
    if (!a.has_scaling || !b.has_scaling) return;
    if (a.scaling.type != b.scaling.type) differ("rope_type", "'" + a.type + "'", "'" + b.type + "'");
    const rope_scaling &x = a.scaling, &y = b.scaling;
    if (x.type == rope_scaling::kind::none) return;
    if (x.factor != y.factor) differ("factor", number_text(x.factor), number_text(y.factor));
    if (x.type != rope_scaling::kind::llama3) return;
    if (x.low_freq_factor != y.low_freq_factor)
        differ("low_freq_factor", number_text(x.low_freq_factor), number_text(y.low_freq_factor));
    if (x.high_freq_factor != y.high_freq_factor)
        differ("high_freq_factor", number_text(x.high_freq_factor), number_text(y.high_freq_factor));
    if (x.original_max_position_embeddings != y.original_max_position_embeddings)
        differ("original_max_position_embeddings", std::to_string(x.original_max_position_embeddings),
               std::to_string(y.original_max_position_embeddings));
}

// One flat rope_parameters object (transformers 5): theta and scaling together.
inline rope_reading read_rope_parameters(const nlohmann::json& p, const std::string& file, const std::string& where,
                                         int max_positions) {
    rope_reading r;
    r.where = where;
    read_rope_scaling(p, file, where, "default", max_positions, r);
    if (config_field(p, "rope_theta")) {
        r.theta_field = where + "rope_theta";
        r.theta = config_number(p, file + " " + where.substr(0, where.size() - 1), "rope_theta", 10000.0);
    }
    return r;
}

// Rotary settings from either form of config.json: transformers 4's top-level rope_theta and
// rope_scaling, or transformers 5's rope_parameters (flat, or keyed by layer type). Both may be
// present; then they must agree, as a reader taking either one would otherwise run another model.
inline void read_rope(const nlohmann::json& j, const std::string& file, model_config& c) {
    rope_reading old_form;
    old_form.where = "rope_scaling.";
    if (config_field(j, "rope_theta")) {
        old_form.theta_field = "rope_theta";
        old_form.theta = config_number(j, file, "rope_theta", 10000.0);
    }
    if (const nlohmann::json* s = config_field(j, "rope_scaling"))
        read_rope_scaling(*s, file, "rope_scaling.", "(missing)", c.max_position_embeddings, old_form);
    rope_reading chosen = old_form;
    if (const nlohmann::json* p = config_field(j, "rope_parameters")) {
        require(p->is_object(), error_code::format_error, file, ": rope_parameters = ", p->dump(), " is not an object");
        // Keyed by layer type when every entry is an object (a flat one holds numbers and a type name).
        bool keyed = !p->empty();
        for (const auto& entry : p->items()) keyed = keyed && entry.value().is_object();
        if (keyed) {
            std::optional<rope_reading> first;
            for (const auto& entry : p->items()) {
                rope_reading r = read_rope_parameters(entry.value(), file, "rope_parameters." + entry.key() + ".",
                                                      c.max_position_embeddings);
                if (r.theta_field.empty()) {  // transformers fills an entry's missing theta from the top level
                    r.theta = old_form.theta;
                    r.theta_field = old_form.theta_field.empty() ? "the default rope_theta" : "rope_theta";
                }
                // kvcache rotates every layer alike, so the layer types must share one rotation.
                if (first) require_same_rope(*first, r, file);
                else first = r;
            }
            chosen = *first;
        } else {
            chosen = read_rope_parameters(*p, file, "rope_parameters.", c.max_position_embeddings);
        }
        require_same_rope(old_form, chosen, file);
        if (chosen.theta_field.empty()) {
            chosen.theta_field = old_form.theta_field;
            chosen.theta = old_form.theta;
        }
    }
    c.rope_theta = chosen.theta;
    c.scaling = chosen.scaling;
}

// Config field layer_types: one "full_attention" or "sliding_attention" per layer.
inline std::vector<std::string> read_layer_types(const nlohmann::json& j, const std::string& file, int layers) {
    std::vector<std::string> out;
    const nlohmann::json* v = config_field(j, "layer_types");
    if (!v) return out;
    require(v->is_array(), error_code::format_error, file, ": layer_types = ", v->dump(), " is not a list");
    require(v->size() == static_cast<std::size_t>(layers), error_code::format_error, file, ": layer_types has ",
            v->size(), " entries but num_hidden_layers = ", layers);
    for (std::size_t i = 0; i < v->size(); ++i) {
        const nlohmann::json& t = (*v)[i];
        const bool known = t.is_string() && (t.get<std::string>() == "full_attention" ||
                                             t.get<std::string>() == "sliding_attention");
        require(known, error_code::unsupported_configuration, file, ": layer_types[", i, "] = ", t.dump(),
                " is not supported (supported: \"full_attention\", \"sliding_attention\")");
        out.push_back(t.get<std::string>());
    }
    return out;
}

// Which layers attend through a sliding window, as transformers decides it. Mistral windows every
// layer when sliding_window is set. Qwen2 windows only with use_sliding_window, and then the
// layers layer_types marks "sliding_attention"; without layer_types (configs older than it), the
// layers from max_window_layers on.
inline void read_layer_windows(const nlohmann::json& j, const std::string& file, checkpoint_config& out) {
    model_config& c = out.model;
    const std::vector<std::string>& types = out.layer_types;
    const std::size_t layers = static_cast<std::size_t>(c.num_layers);
    std::vector<int> window(layers, 0);
    int size = 0;
    if (c.model_type == "mistral") {
        size = config_int(j, file, "sliding_window", 0);
        // transformers' Mistral ignores layer_types; a list saying otherwise leaves the intent unclear.
        for (std::size_t i = 0; i < types.size(); ++i)
            require((types[i] == "sliding_attention") == (size > 0), error_code::unsupported_configuration, file,
                    ": layer_types[", i, "] = \"", types[i], "\" but model_type mistral ",
                    size > 0 ? "windows every layer (sliding_window = " + std::to_string(size) + ")"
                             : std::string("windows no layer (no sliding_window)"),
                    " whatever layer_types says; refusing rather than guessing which was meant");
        if (size > 0) std::fill(window.begin(), window.end(), size);
    } else if (c.model_type == "qwen2") {
        const bool use = config_bool(j, file, "use_sliding_window", false);
        if (use) size = config_int(j, file, "sliding_window", 0);
        if (!types.empty()) {
            for (std::size_t i = 0; i < layers; ++i) {
                if (types[i] != "sliding_attention") continue;
                require(size > 0, error_code::unsupported_configuration, file, ": layer_types[", i,
                        "] = \"sliding_attention\" but ",
                        use ? std::string("sliding_window is not set") : std::string("use_sliding_window is false"),
                        ", so the layer has no window");
                window[i] = size;
            }
        } else if (size > 0) {
            const int first = config_int(j, file, "max_window_layers", 28);  // transformers' default
            for (std::size_t i = static_cast<std::size_t>(std::min(first, c.num_layers)); i < layers; ++i)
                window[i] = size;
        }
    } else {
        for (std::size_t i = 0; i < types.size(); ++i)
            require(types[i] == "full_attention", error_code::unsupported_configuration, file, ": layer_types[", i,
                    "] = \"", types[i], "\" is not supported for model_type ", c.model_type,
                    " (only full_attention)");
    }
    const bool any = std::any_of(window.begin(), window.end(), [](int w) { return w > 0; });
    out.sliding_window = any ? size : 0;
    if (any) c.layer_window = std::move(window);
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
    c.tie_word_embeddings = detail::config_bool(j, file, "tie_word_embeddings", false);
    c.max_position_embeddings = detail::config_int(j, file, "max_position_embeddings", 0);
    // Qwen2 always has q/k/v biases and no o_proj bias; Llama's attention_bias puts one on all four.
    c.attention_bias = c.model_type == "qwen2" ? true : detail::config_bool(j, file, "attention_bias", false);
    c.output_bias = c.model_type == "qwen2" ? false : c.attention_bias;

    detail::read_rope(j, file, c);
    out.layer_types = detail::read_layer_types(j, file, c.num_layers);
    detail::read_layer_windows(j, file, out);
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

    /// A one-value tensor (shape [] or [1], as fp8 checkpoints store k_scale and v_scale) as a float.
    float read_scalar(const std::string& name) const {
        auto it = owner_.find(name);
        require(it != owner_.end(), error_code::not_found, "tensor '", name, "' is in none of the checkpoint's files");
        const auto entry = it->second->header().tensors.find(name);
        require(entry != it->second->header().tensors.end(), error_code::format_error, it->second->path(), ": tensor '",
                name, "' is missing (the index says it is here)");
        require(entry->second.elements() == 1, error_code::format_error, it->second->path(), ": tensor '", name,
                "' holds ", entry->second.elements(), " values; a per-layer scale holds 1");
        return it->second->read_floats(name, entry->second.shape)[0];
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
    // fp8 cache scales, per layer, where the checkpoint ships them (vLLM's self_attn.k_scale and
    // v_scale); a layer without them keeps 1 and 1. set_scales checks each is positive and finite.
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
        const bool has_key = files.contains(p + "k_scale"), has_value = files.contains(p + "v_scale");
        if (!has_key && !has_value) continue;
        w.config.cache_scales.resize(static_cast<std::size_t>(c.num_layers));
        if (has_key) w.config.cache_scales[l].key = files.read_scalar(p + "k_scale");
        if (has_value) w.config.cache_scales[l].value = files.read_scalar(p + "v_scale");
    }
    w.final_norm = files.read("model.norm.weight", shape{u(c.hidden_size)});
    if (!c.tie_word_embeddings) w.lm_head = files.read("lm_head.weight", shape{u(c.vocab_size), u(c.hidden_size)});
    return w;
}

}  // namespace kvcache::examples
