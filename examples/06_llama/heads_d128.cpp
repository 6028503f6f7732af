// Head shapes with head_dim 128.
#include "supported_heads.hpp"

namespace llama_example {

using kvcache::head_config;

std::vector<head_entry> heads_d128() {
    return {
        entry_for<head_config<12, 2, 128>>("Qwen2/Qwen2.5-1.5B"),
        entry_for<head_config<16, 2, 128>>("Qwen2.5-3B"),
        entry_for<head_config<24, 8, 128>>("Llama-3.2-3B"),
        entry_for<head_config<28, 4, 128>>("Qwen2/Qwen2.5-7B"),
        entry_for<head_config<32, 8, 128>>("Llama-3/3.1-8B, Mistral-7B"),
        entry_for<head_config<32, 32, 128>>("Llama-2-7B"),
    };
}

}  // namespace llama_example
