// Writes the tests' tiny checkpoint (config.json + model.safetensors, mixed
// F32/F16/BF16) of a model type (llama, qwen2, mistral with sliding_window 8)
// into the folder given, for the 06_llama smoke tests.
#include <cstdio>
#include <exception>
#include <string>

#include "checkpoint_writer.hpp"

int main(int argc, char** argv) {
    std::string type = argc == 3 ? argv[2] : "llama";
    if (argc < 2 || argc > 3 || (type != "llama" && type != "qwen2" && type != "mistral")) {
        std::fprintf(stderr, "usage: model_write_tiny_checkpoint DIR [llama|qwen2|mistral]\n");
        return 2;
    }
    try {
        using namespace kvcache::examples;
        auto weights = make_random_weights(testing::tiny_config(type), 42);
        testing::write_checkpoint(argv[1], weights, {"F32", "BF16", "F16"}, 1,
                                  type == "mistral" ? "\"sliding_window\": 8,\n  " : "");
        std::printf("tiny checkpoint written to %s\n", argv[1]);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "model_write_tiny_checkpoint: %s\n", e.what());
        return 1;
    }
    return 0;
}
