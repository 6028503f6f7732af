// Writes safetensors files and tiny Llama checkpoints from test code, byte by
// byte, independently of the reader under test.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvcache/core/half.hpp"
#include "kvcache_engine/model_weights.hpp"

namespace kvcache::examples::testing {

/// One tensor to write: its float values are encoded in `dtype` (F32, F16 or BF16).
struct tensor_to_write {
    std::string name;
    std::string dtype;
    std::vector<std::uint64_t> shape;
    std::vector<float> values;
};

/// The value a float becomes once stored as dtype and read back (BF16 truncates to nearest even).
inline float stored_value(const std::string& dtype, float v) {
    if (dtype == "F16") return static_cast<float>(kvcache::half(v));
    if (dtype == "BF16") {
        std::uint32_t bits;
        std::memcpy(&bits, &v, 4);
        bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
        std::memcpy(&v, &bits, 4);
    }
    return v;
}

inline void put_le(std::vector<unsigned char>& out, std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

/// The bytes of a safetensors file holding the tensors in order.
inline std::vector<unsigned char> safetensors_bytes(const std::vector<tensor_to_write>& tensors) {
    std::vector<unsigned char> data;
    std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
    for (const auto& t : tensors) {
        std::size_t begin = data.size();
        for (float v : t.values) {
            std::uint32_t bits;
            std::memcpy(&bits, &v, 4);
            if (t.dtype == "F32") put_le(data, bits, 4);
            else if (t.dtype == "F16") put_le(data, kvcache::half(v).bits, 2);
            else {
                float r = stored_value("BF16", v);
                std::memcpy(&bits, &r, 4);
                put_le(data, bits >> 16, 2);
            }
        }
        header += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
        for (std::size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
        header += "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
    }
    header += "}";
    std::vector<unsigned char> file;
    put_le(file, header.size(), 8);
    file.insert(file.end(), header.begin(), header.end());
    file.insert(file.end(), data.begin(), data.end());
    return file;
}

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
}

/// config.json for a model_config, in Hugging Face's field names; `extra` adds fields ("\"a\": 1,\n").
/// With `rope_parameters` (the object's fields but rope_theta: "\"rope_type\": \"default\""), the
/// rotary settings are written as transformers 5 does: rope_parameters, no top-level rope_theta.
inline std::string config_json(const model_config& c, const std::string& extra = "", const std::string& rope_parameters = "") {
    auto s = [](const auto& v) { return std::to_string(v); };
    return "{\n  " + extra + "\"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"" + c.model_type +
           "\",\n  \"vocab_size\": " + s(c.vocab_size) + ",\n  \"hidden_size\": " + s(c.hidden_size) +
           ",\n  \"num_hidden_layers\": " + s(c.num_layers) + ",\n  \"num_attention_heads\": " + s(c.num_query_heads) +
           ",\n  \"num_key_value_heads\": " + s(c.num_kv_heads) + ",\n  \"head_dim\": " + s(c.head_dim) +
           ",\n  \"intermediate_size\": " + s(c.intermediate_size) + ",\n  \"rms_norm_eps\": 1e-05,\n  " +
           (rope_parameters.empty() ? "\"rope_theta\": " + s(c.rope_theta)
                                    : "\"rope_parameters\": {" + rope_parameters + ", \"rope_theta\": " + s(c.rope_theta) + "}") +
           ",\n  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": " +
           (c.tie_word_embeddings ? "true" : "false") + ",\n  \"attention_bias\": " +
           (c.model_type != "qwen2" && c.attention_bias ? "true" : "false") + ",\n  \"torch_dtype\": \"float32\"\n}\n";
}

/// The tensors of a model in Hugging Face names; `dtype_of(index)` picks each tensor's dtype.
inline std::vector<tensor_to_write> checkpoint_tensors(const model_weights& w, const std::vector<std::string>& dtypes) {
    const model_config& c = w.config;
    std::vector<tensor_to_write> out;
    auto u = [](int v) { return static_cast<std::uint64_t>(v); };
    auto add = [&](std::string name, std::vector<std::uint64_t> shape, const std::vector<float>& values) {
        out.push_back({std::move(name), dtypes[out.size() % dtypes.size()], std::move(shape), values});
    };
    add("model.embed_tokens.weight", {u(c.vocab_size), u(c.hidden_size)}, w.embedding);
    for (int l = 0; l < c.num_layers; ++l) {
        const layer_weights& L = w.layers[l];
        std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", {u(c.hidden_size)}, L.attention_norm);
        add(p + "self_attn.q_proj.weight", {u(c.q_width()), u(c.hidden_size)}, L.wq);
        add(p + "self_attn.k_proj.weight", {u(c.kv_width()), u(c.hidden_size)}, L.wk);
        add(p + "self_attn.v_proj.weight", {u(c.kv_width()), u(c.hidden_size)}, L.wv);
        add(p + "self_attn.o_proj.weight", {u(c.hidden_size), u(c.q_width())}, L.wo);
        if (c.attention_bias) {
            add(p + "self_attn.q_proj.bias", {u(c.q_width())}, L.bq);
            add(p + "self_attn.k_proj.bias", {u(c.kv_width())}, L.bk);
            add(p + "self_attn.v_proj.bias", {u(c.kv_width())}, L.bv);
        }
        if (c.output_bias) add(p + "self_attn.o_proj.bias", {u(c.hidden_size)}, L.bo);
        add(p + "post_attention_layernorm.weight", {u(c.hidden_size)}, L.mlp_norm);
        add(p + "mlp.gate_proj.weight", {u(c.intermediate_size), u(c.hidden_size)}, L.w_gate);
        add(p + "mlp.up_proj.weight", {u(c.intermediate_size), u(c.hidden_size)}, L.w_up);
        add(p + "mlp.down_proj.weight", {u(c.hidden_size), u(c.intermediate_size)}, L.w_down);
        if (!c.cache_scales.empty()) {  // fp8 cache scales as vLLM's checkpoints ship them: 0-d tensors
            add(p + "self_attn.k_scale", {}, {c.cache_scales[l].key});
            add(p + "self_attn.v_scale", {}, {c.cache_scales[l].value});
        }
    }
    add("model.norm.weight", {u(c.hidden_size)}, w.final_norm);
    if (!c.tie_word_embeddings) add("lm_head.weight", {u(c.vocab_size), u(c.hidden_size)}, w.lm_head);
    return out;
}

/// The tiny model the checkpoint tests write: 2 layers, 4 query / 2 KV heads of 16, a few hundred KB.
inline model_config tiny_config(const std::string& model_type = "llama") {
    model_config c;
    c.model_type = model_type;
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.num_layers = 2;
    c.num_query_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 128;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0;
    c.attention_bias = model_type == "qwen2" || model_type == "llama_bias";
    c.output_bias = model_type == "llama_bias";
    if (model_type == "llama_bias") c.model_type = "llama";
    return c;
}

/// Writes config.json (config_json's `extra` and `rope_parameters`) and the weights as one file, or
/// as `shards` files with an index.
inline void write_checkpoint(const std::string& dir, const model_weights& w, const std::vector<std::string>& dtypes,
                             int shards = 1, const std::string& extra_config = "", const std::string& rope_parameters = "") {
    std::filesystem::create_directories(dir);
    write_text(dir + "/config.json", config_json(w.config, extra_config, rope_parameters));
    auto tensors = checkpoint_tensors(w, dtypes);
    if (shards == 1) {
        write_bytes(dir + "/model.safetensors", safetensors_bytes(tensors));
        return;
    }
    std::string index = "{\"metadata\":{},\"weight_map\":{";
    for (int s = 0; s < shards; ++s) {
        std::vector<tensor_to_write> part;
        std::string file = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
        for (std::size_t i = s; i < tensors.size(); i += shards) {
            part.push_back(tensors[i]);
            index += std::string(index.back() == '{' ? "" : ",") + "\"" + tensors[i].name + "\":\"" + file + "\"";
        }
        write_bytes(dir + "/" + file, safetensors_bytes(part));
    }
    write_text(dir + "/model.safetensors.index.json", index + "}}");
}

}  // namespace kvcache::examples::testing
