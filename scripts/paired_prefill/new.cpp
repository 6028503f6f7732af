// Compiled against the branch's headers.
#include "unit_body.hpp"
void prefill_new(const bench_view_f32& v, const std::vector<float>& q, const std::vector<int>& o, std::vector<float>& out) { run(v, q, o, out); }
void prefill_new(const bench_view_f16& v, const std::vector<float>& q, const std::vector<int>& o, std::vector<float>& out) { run(v, q, o, out); }
void decode_new(const decode_view_gqa& v, const std::vector<float>& q, std::vector<float>& out) { run_decode(v, q, out); }
void decode_new(const decode_view_mha& v, const std::vector<float>& q, std::vector<float>& out) { run_decode(v, q, out); }
void decode_new(const decode_view_gqa_int8& v, const std::vector<float>& q, std::vector<float>& out) { run_decode(v, q, out); }
void decode_new(const decode_view_mha_int8& v, const std::vector<float>& q, std::vector<float>& out) { run_decode(v, q, out); }
