// Paired timing: main's prefill and the branch's, alternated call by call
// (order swapped every pair) on the same cache, 2 threads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "support/filled_cache.hpp"
#include "units.hpp"
struct stats { double median, min, max; };
stats of(std::vector<double> x) { std::sort(x.begin(), x.end()); return {x[x.size() / 2], x.front(), x.back()}; }
template <class Element>
void pair_case(const char* name, int pairs) {
    using namespace kvcache;
    constexpr int prefix = 1024, chunk = 512;
    auto filled = bench::make_paged<Element>(1, prefix + chunk);
    const auto view = filled.view();
    const std::vector<float> q = bench::random_floats(std::size_t(chunk) * 32 * 128, 3);
    const std::vector<int> offsets = {0, chunk};
    std::vector<float> out_base(q.size()), out_new(q.size());
    const double keys_seen = double(chunk) * prefix + double(chunk) * (chunk + 1) / 2.0;
    const double flops = 4.0 * 32 * 128 * keys_seen;
    auto timed = [&](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    prefill_base(view, q, offsets, out_base); prefill_new(view, q, offsets, out_new);  // warm-up
    std::vector<double> gb, gn, ratio;
    for (int i = 0; i < pairs; ++i) {
        double tb, tn;
        if (i % 2 == 0) { tb = timed([&] { prefill_base(view, q, offsets, out_base); }); tn = timed([&] { prefill_new(view, q, offsets, out_new); }); }
        else { tn = timed([&] { prefill_new(view, q, offsets, out_new); }); tb = timed([&] { prefill_base(view, q, offsets, out_base); }); }
        gb.push_back(flops / tb / 1e9); gn.push_back(flops / tn / 1e9); ratio.push_back(tb / tn);
    }
    double diff = 0;
    for (std::size_t i = 0; i < q.size(); ++i) diff = std::max(diff, double(std::fabs(out_base[i] - out_new[i])));
    const stats b = of(gb), n = of(gn), r = of(ratio);
    std::printf("| %s | %.1f [%.1f, %.1f] | %.1f [%.1f, %.1f] | %.2f [%.2f, %.2f] | %d | %.1e |\n", name, b.median, b.min, b.max,
                n.median, n.min, n.max, r.median, r.min, r.max, pairs, diff);
}
int main(int argc, char** argv) {
    const int pairs = argc > 1 ? std::atoi(argv[1]) : 15;
    std::printf("| K/V | main GFLOP/s median [min, max] | branch GFLOP/s median [min, max] | speed-up per pair | pairs | max abs diff |\n|---|---|---|---|---|---|\n");
    pair_case<float>("fp32", pairs);
    pair_case<kvcache::half>("fp16", pairs);
}
