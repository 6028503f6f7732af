// Writes the tests' tiny Llama checkpoint (config.json + model.safetensors,
// mixed F32/F16/BF16) into the folder given, for the 06_llama smoke tests.
#include <cstdio>
#include <exception>

#include "checkpoint_writer.hpp"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: model_write_tiny_checkpoint DIR\n");
        return 2;
    }
    try {
        using namespace kvcache::examples;
        auto weights = make_random_weights(testing::tiny_config(), 42);
        testing::write_checkpoint(argv[1], weights, {"F32", "BF16", "F16"});
        std::printf("tiny checkpoint written to %s\n", argv[1]);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "model_write_tiny_checkpoint: %s\n", e.what());
        return 1;
    }
    return 0;
}
