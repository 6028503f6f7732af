// Must not compile: a head dimension that is not a multiple of 8.
#include "kvcache/core/heads.hpp"
int main() { return kvcache::head_config<8, 8, 60>::head_dim; }
