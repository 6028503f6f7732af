// Head shapes of the tiny checkpoints the tests write.
#include "supported_heads.hpp"

namespace llama_example {

using kvcache::head_config;

std::vector<head_entry> heads_small() {
    return {
        entry_for<head_config<4, 2, 16>>("the tests' tiny checkpoint"),
    };
}

}  // namespace llama_example
