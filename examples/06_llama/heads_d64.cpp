// Head shapes with head_dim 64.
#include "supported_heads.hpp"

namespace llama_example {

using kvcache::head_config;

std::vector<head_entry> heads_d64() {
    return {
        entry_for<head_config<9, 3, 64>>("SmolLM/SmolLM2-135M"),
        entry_for<head_config<15, 5, 64>>("SmolLM/SmolLM2-360M"),
        entry_for<head_config<32, 32, 64>>("SmolLM/SmolLM2-1.7B"),
        entry_for<head_config<32, 4, 64>>("TinyLlama-1.1B"),
        entry_for<head_config<14, 2, 64>>("Qwen2/Qwen2.5-0.5B"),
        entry_for<head_config<32, 8, 64>>("Llama-3.2-1B"),
    };
}

}  // namespace llama_example
