// Must not compile: a head dimension above the 1024 the README states as the limit.
#include "kvcache/core/heads.hpp"
int main() { return kvcache::head_config<8, 8, 1032>::head_dim; }
