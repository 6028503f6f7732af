// Paired decode timing: the base commit's CPU decode and the branch's,
// alternated call by call (order swapped every pair) on the same fp16
// contiguous cache (batch 1, D = 128; GQA 32/8 and MHA 8/8; fp16, then int8), 2 threads, with
// the streaming read (2 threads, 2 GiB) probed before each shape: a call
// reads 64 MiB of K/V at 16K, over this machine's 32 MiB LLC, and the other
// unit's call in between evicts it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "harness/bandwidth.hpp"
#include "support/filled_cache.hpp"
#include "units.hpp"
namespace {
struct stats { double median, min, max; };
stats of(std::vector<double> x) { std::sort(x.begin(), x.end()); return {x[x.size() / 2], x.front(), x.back()}; }
template <class Heads, class View>
void pair_case(const char* name, int context, int pairs) {
    using namespace kvcache;
    auto filled = bench::make_contiguous<typename View::element_type, Heads>(1, context);
    const View view = filled.view();
    const std::size_t q_size = std::size_t(Heads::query_heads()) * Heads::head_dim;
    const std::vector<float> q = bench::random_floats(q_size, 7);
    std::vector<float> out_base(q_size), out_new(q_size);
    const double bytes = double(filled.kv_bytes()) + 2.0 * q_size * sizeof(float);
    const double read = bench::measure_read_bandwidth(std::size_t(2) << 30, 2, 5).gbytes_per_s;
    auto timed = [&](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    decode_base(view, q, out_base); decode_new(view, q, out_new);  // warm-up
    std::vector<double> fb, fn, ratio;
    for (int i = 0; i < pairs; ++i) {
        double tb, tn;
        if (i % 2 == 0) { tb = timed([&] { decode_base(view, q, out_base); }); tn = timed([&] { decode_new(view, q, out_new); }); }
        else { tn = timed([&] { decode_new(view, q, out_new); }); tb = timed([&] { decode_base(view, q, out_base); }); }
        fb.push_back(bytes / tb / 1e9 / read); fn.push_back(bytes / tn / 1e9 / read); ratio.push_back(tb / tn);
    }
    double diff = 0;
    for (std::size_t i = 0; i < q_size; ++i) diff = std::max(diff, double(std::fabs(out_base[i] - out_new[i])));
    const stats b = of(fb), n = of(fn), r = of(ratio);
    std::printf("| %s | %d | %.1f | %.2f [%.2f, %.2f] | %.2f [%.2f, %.2f] | %.2f [%.2f, %.2f] | %d | %.1e |\n", name, context,
                read, b.median, b.min, b.max, n.median, n.min, n.max, r.median, r.min, r.max, pairs, diff);
}
}  // namespace
int main(int argc, char** argv) {
    const int pairs = argc > 1 ? std::atoi(argv[1]) : 15;
    std::printf("| heads (contiguous, batch 1; fp16 unless named) | context | read GB/s | base fraction of read [min, max] | branch fraction [min, max] | speed-up per pair | pairs | max abs diff |\n|---|---|---|---|---|---|---|---|\n");
    for (int context : {4096, 16384}) {
        pair_case<kvcache::head_config<32, 8, 128>, decode_view_gqa>("GQA 32/8", context, pairs);
        pair_case<kvcache::head_config<8, 8, 128>, decode_view_mha>("MHA 8/8", context, pairs);
        pair_case<kvcache::head_config<32, 8, 128>, decode_view_gqa_int8>("GQA 32/8 int8", context, pairs);
        pair_case<kvcache::head_config<8, 8, 128>, decode_view_mha_int8>("MHA 8/8 int8", context, pairs);
    }
}
