// Writes the tests' tiny checkpoint (config.json + model.safetensors, mixed
// F32/F16/BF16) of a model type (llama, qwen2, mistral with sliding_window 8,
// llama3: Llama with llama3 rope scaling that matters at these sizes, tied
// embeddings and attention biases; llama3_rope_parameters: the same model with
// its config as transformers 5 writes it; qwen2_mixed: 3 layers, layer_types
// windowing layers 0 and 2 to 4 tokens; qwen2_max_window_layers: 3 layers, the
// last windowed through max_window_layers, no layer_types; llama_fp8_scales:
// the llama model with per-layer fp8 cache scales, self_attn.k_scale and
// v_scale) into the folder given, for the 06_llama smoke tests.
#include <cstdio>
#include <exception>
#include <string>

#include "checkpoint_writer.hpp"

int main(int argc, char** argv) {
    std::string type = argc == 3 ? argv[2] : "llama";
    const bool llama3 = type == "llama3" || type == "llama3_rope_parameters";
    const bool qwen2_windowed = type == "qwen2_mixed" || type == "qwen2_max_window_layers";
    const bool odd_heads = type == "odd_heads";
    const bool fp8_scales = type == "llama_fp8_scales";
    if (argc < 2 || argc > 3 ||
        (type != "llama" && type != "qwen2" && type != "mistral" && !llama3 && !qwen2_windowed && !odd_heads &&
         !fp8_scales)) {
        std::fprintf(stderr, "usage: model_write_tiny_checkpoint DIR [llama|qwen2|mistral|llama3|llama3_rope_parameters|"
                             "qwen2_mixed|qwen2_max_window_layers|odd_heads|llama_fp8_scales]\n");
        return 2;
    }
    try {
        using namespace kvcache::examples;
        model_config config =
            testing::tiny_config(llama3 ? "llama_bias" : qwen2_windowed ? "qwen2" : odd_heads || fp8_scales ? "llama" : type);
        if (odd_heads) {  // 6 query heads over 3 KV heads: a shape nothing compiles, run by dynamic head counts
            config.num_query_heads = 6;
            config.num_kv_heads = 3;
        }
        // Scales far from 1 and different per layer and for K and V (powers of two: exact in every dtype).
        if (fp8_scales) config.cache_scales = {{0.125f, 0.0625f}, {0.25f, 0.03125f}};
        std::string extra, rope_parameters;
        if (type == "mistral") extra = "\"sliding_window\": 8,\n  ";
        if (llama3) {
            config.tie_word_embeddings = true;
            config.rope_theta = 500000.0;
            // original_max_position_embeddings 16 puts the head's wavelengths in all three bands.
            const std::string scaling = "\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                                        "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16";
            if (type == "llama3") extra = "\"rope_scaling\": {" + scaling + "},\n  ";
            else rope_parameters = scaling;
        }
        if (qwen2_windowed) {
            config.num_layers = 3;
            extra = "\"use_sliding_window\": true,\n  \"sliding_window\": 4,\n  ";
            // layer_types decides over max_window_layers, which alone would window layers 1 and 2.
            if (type == "qwen2_mixed")
                extra += "\"max_window_layers\": 1,\n  \"layer_types\": [\"sliding_attention\", \"full_attention\", "
                         "\"sliding_attention\"],\n  ";
            else
                extra += "\"max_window_layers\": 2,\n  ";
        }
        auto weights = make_random_weights(config, 42);
        testing::write_checkpoint(argv[1], weights, {"F32", "BF16", "F16"}, 1, extra, rope_parameters);
        std::printf("tiny checkpoint written to %s\n", argv[1]);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "model_write_tiny_checkpoint: %s\n", e.what());
        return 1;
    }
    return 0;
}
