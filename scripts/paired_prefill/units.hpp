// The paired harness's two prefill entry points (base and branch) over the bench's paged views.
#pragma once
#include <vector>
#include "kvcache/layout/paged_view.hpp"
#include "kvcache/core/half.hpp"
using bench_view_f32 = kvcache::paged_view<float, kvcache::head_config<32, 8, 128>>;
using bench_view_f16 = kvcache::paged_view<kvcache::half, kvcache::head_config<32, 8, 128>>;
void prefill_base(const bench_view_f32&, const std::vector<float>&, const std::vector<int>&, std::vector<float>&);
void prefill_base(const bench_view_f16&, const std::vector<float>&, const std::vector<int>&, std::vector<float>&);
void prefill_new(const bench_view_f32&, const std::vector<float>&, const std::vector<int>&, std::vector<float>&);
void prefill_new(const bench_view_f16&, const std::vector<float>&, const std::vector<int>&, std::vector<float>&);
