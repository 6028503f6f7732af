// The paired harness's entry points (base and branch): prefill over the
// bench's paged views, decode over contiguous views (GQA 32/8 and MHA 8/8).
#pragma once
#include <vector>
#include "kvcache/layout/contiguous_view.hpp"
#include "kvcache/layout/paged_view.hpp"
#include "kvcache/core/half.hpp"
#include "kvcache/core/int8.hpp"
using bench_view_f32 = kvcache::paged_view<float, kvcache::head_config<32, 8, 128>>;
using bench_view_f16 = kvcache::paged_view<kvcache::half, kvcache::head_config<32, 8, 128>>;
using decode_view_gqa = kvcache::contiguous_view<kvcache::half, kvcache::head_config<32, 8, 128>>;
using decode_view_mha = kvcache::contiguous_view<kvcache::half, kvcache::head_config<8, 8, 128>>;
using decode_view_gqa_int8 = kvcache::contiguous_view<kvcache::qint8, kvcache::head_config<32, 8, 128>>;
using decode_view_mha_int8 = kvcache::contiguous_view<kvcache::qint8, kvcache::head_config<8, 8, 128>>;
void prefill_base(const bench_view_f32&, const std::vector<float>&, const std::vector<int>&, std::vector<float>&);
void prefill_base(const bench_view_f16&, const std::vector<float>&, const std::vector<int>&, std::vector<float>&);
void prefill_new(const bench_view_f32&, const std::vector<float>&, const std::vector<int>&, std::vector<float>&);
void prefill_new(const bench_view_f16&, const std::vector<float>&, const std::vector<int>&, std::vector<float>&);
void decode_base(const decode_view_gqa&, const std::vector<float>&, std::vector<float>&);
void decode_base(const decode_view_mha&, const std::vector<float>&, std::vector<float>&);
void decode_new(const decode_view_gqa&, const std::vector<float>&, std::vector<float>&);
void decode_new(const decode_view_mha&, const std::vector<float>&, std::vector<float>&);
void decode_base(const decode_view_gqa_int8&, const std::vector<float>&, std::vector<float>&);
void decode_base(const decode_view_mha_int8&, const std::vector<float>&, std::vector<float>&);
void decode_new(const decode_view_gqa_int8&, const std::vector<float>&, std::vector<float>&);
void decode_new(const decode_view_mha_int8&, const std::vector<float>&, std::vector<float>&);
