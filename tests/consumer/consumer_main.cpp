// A downstream program: uses kvcache only through the package's public target.
#include <kvcache/kvcache.hpp>

#include <cstdio>

int main() {
    using heads = kvcache::head_config<32, 8, 128>;
    static_assert(heads::group_size == 4, "GQA group of Llama-3-8B");
    const kvcache::half h(1.5f);
    kvcache::host_buffer<kvcache::half> rows(heads::kv_heads * heads::head_dim);
    rows[0] = h;
    const float back = static_cast<float>(rows[0]);
    std::printf("kvcache %d.%d consumer: group %d, half round trip %.2f\n", kvcache::version::major,
                kvcache::version::minor, heads::group_size, back);
    return back == 1.5f ? 0 : 1;
}
