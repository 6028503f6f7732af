// Must not compile: a K/V pair of one type is that type's cache (paged_cache<kvcache::qint8, ...>).
#include "kvcache/core/kv_elements.hpp"
int main() { return int(sizeof(kvcache::kv_elements<kvcache::qint8, kvcache::qint8>)); }
