// A downstream program: uses kvcache only through the package's public target
// and the umbrella header, the way the README shows. KVCACHE_EXPECTED_VERSION
// is defined by the consumer project: kvcache's project(VERSION), as the test passes it.
#include <kvcache/kvcache.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
    using heads = kvcache::head_config<32, 8, 128>;
    static_assert(heads::group_size() == 4, "GQA group of Llama-3-8B");
    const kvcache::half h(1.5f);
    const float back = static_cast<float>(h);

    // A paged fp16 cache of two layers; a 20-token prompt, then one decode step.
    kvcache::paged_cache<kvcache::half, heads> cache(/*layers=*/2, /*pages=*/8, /*page_size=*/16);
    const auto sequence = cache.add_sequence();
    const int prompt = 20;
    std::vector<float> keys(prompt * heads::kv_heads() * heads::head_dim), values(keys.size());
    std::vector<float> queries(prompt * heads::query_heads() * heads::head_dim), outputs(queries.size());
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = std::sin(0.01f * i), values[i] = std::cos(0.02f * i);
    for (std::size_t i = 0; i < queries.size(); ++i) queries[i] = std::sin(0.03f * i);
    const kvcache::cpu_backend cpu;
    const auto plan = cache.plan({sequence}, {prompt});  // reserves the prompt in both layers
    double largest_difference = 0;
    for (int layer = 0; layer < 2; ++layer) {
        const auto view = plan.view(layer);
        cpu.append(kvcache::append_params(view, keys, values, plan.new_token_offsets()));
        const kvcache::prefill_params attend(view, queries, plan.new_token_offsets(), outputs);
        cpu.prefill(attend);
        const auto exact = kvcache::reference_backend{}.prefill_exact(attend);
        for (std::size_t i = 0; i < outputs.size(); ++i)
            largest_difference = std::fmax(largest_difference, std::fabs(outputs[i] - exact.outputs[i]));
    }
    const bool close = largest_difference < 1e-3;  // fp16 storage: rows are rounded, the sums are not
    // The generated header must carry the project version (and, installed, the package's: find_package asked EXACT).
    const bool same_version = std::strcmp(kvcache::version::string, KVCACHE_EXPECTED_VERSION) == 0;
    std::printf("kvcache %s consumer: group %d, half round trip %.2f, prefill %s the reference (%.1e)\n",
                kvcache::version::string, heads::group_size(), back, close ? "matches" : "DIFFERS FROM",
                largest_difference);
    if (!same_version)
        std::printf("kvcache/version.hpp says %s, the package %s\n", kvcache::version::string, KVCACHE_EXPECTED_VERSION);
    return back == 1.5f && close && same_version ? 0 : 1;
}
