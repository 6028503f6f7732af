// Compiled against the base headers; main's kernels under another namespace name, so they share no symbol with the branch's.
#define avx2_fma_f16c avx2_fma_f16c_base
#define avx512 avx512_base
#define avx512_vnni avx512_vnni_base
#define avx2_fma avx2_fma_base
#define generic generic_base
#include "unit_body.hpp"
void prefill_base(const bench_view_f32& v, const std::vector<float>& q, const std::vector<int>& o, std::vector<float>& out) { run(v, q, o, out); }
void prefill_base(const bench_view_f16& v, const std::vector<float>& q, const std::vector<int>& o, std::vector<float>& out) { run(v, q, o, out); }
void decode_base(const decode_view_gqa& v, const std::vector<float>& q, std::vector<float>& out) { run_decode(v, q, out); }
void decode_base(const decode_view_mha& v, const std::vector<float>& q, std::vector<float>& out) { run_decode(v, q, out); }
void decode_base(const decode_view_gqa_int8& v, const std::vector<float>& q, std::vector<float>& out) { run_decode(v, q, out); }
void decode_base(const decode_view_mha_int8& v, const std::vector<float>& q, std::vector<float>& out) { run_decode(v, q, out); }
