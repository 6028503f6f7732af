// Must not compile: 30 query heads cannot be split across 8 KV heads.
#include "kvcache/core/heads.hpp"
int main() { return kvcache::head_config<30, 8, 128>::group_size(); }
