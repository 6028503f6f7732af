// The queries as a backend's decode scores them. The CPU backend's AVX-512
// VNNI builds score int8 keys, and int4 keys at head dims 64 and 128, with the
// queries rounded to 16-bit codes (backend/cpu/key_dots.hpp, quantise_query;
// int4 scores are exactly those of the rounded rows): a logit may move by up to half
// a code step times the key's 1-norm, about 1e-3 at the tests' sizes in the
// worst case, far past the kernels' 1e-5. So the reference of such a test is
// given the rounded queries: the comparison keeps measuring the kernel's own
// rounding at the usual bounds, and the codes are tested on their own
// (int8_cpu_test.cpp, "16-bit query codes"; int4_cpu_test.cpp, "int4 query
// codes"). The CPU specialisation lives here,
// beside the primary template, so no test unit can see one without the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvcache/backend/cpu.hpp"
#include "kvcache/backend/reference.hpp"
#include "kvcache/core/span.hpp"

namespace kvcache_test {

/// The queries Backend's decode scores against a cache of Element at head
/// dimension Dim, divided by the softmax scale again (so a reference call
/// given them sees the logits the backend computed); empty when it scores the
/// queries as given: every backend but the CPU one (below). The queries are
/// rows of Dim, `group` query heads a KV head (decode's [batch][query_heads]).
/// @tparam Backend a backend type
template <class Backend>
struct scored_queries {
    /// @tparam Element the cache's element type
    /// @tparam Dim head dimension
    /// @tparam Query the queries' element type
    template <class Element, int Dim, class Query>
    static std::vector<float> of(const std::vector<Query>&, float, int) {
        return {};
    }
};

/// The CPU backend: where its build scores int8 keys with 16-bit query codes
/// (cpu::detail::int8_key_dots_v), the queries rounded as its decode rounds
/// them: every row but the one of a one-row block (a group of row_block x k + 1
/// rows ends in one; MHA's groups are one row), which it scores in float.
/// Where it scores int4 keys so (int4_key_dots_v), every row.
template <>
struct scored_queries<kvcache::cpu_backend> {
    template <class Element, int Dim, class Query>
    static std::vector<float> of(const std::vector<Query>& queries, float softmax_scale, int group) {
        using kvcache::cpu::detail::int4_key_dots_v;
        using kvcache::cpu::detail::int8_key_dots_v;
        using key = kvcache::key_element_t<Element>;
        if constexpr (int8_key_dots_v<key, Dim> || int4_key_dots_v<key, Dim>) {
            std::vector<float> scored(queries.size());
            for (std::size_t row = 0; row + Dim <= queries.size(); row += Dim) {
                const int in_group = int(row / Dim % std::size_t(group));
                if (int8_key_dots_v<key, Dim> && group % kvcache::cpu::detail::row_block == 1 &&
                    in_group == group - 1) {  // a one-row block
                    for (int d = 0; d < Dim; ++d) scored[row + d] = kvcache::to_float(queries[row + d]);
                    continue;
                }
                float scaled[Dim];
                std::int16_t codes[Dim];
                float step = 0.0f;
                for (int d = 0; d < Dim; ++d) scaled[d] = kvcache::to_float(queries[row + d]) * softmax_scale;
                const bool coded = kvcache::cpu::detail::quantise_query<Dim>(scaled, codes, step);
                for (int d = 0; d < Dim; ++d)  // a row that is not finite is scored as given
                    scored[row + d] = coded ? float(double(codes[d]) * step / softmax_scale)
                                            : kvcache::to_float(queries[row + d]);
            }
            return scored;
        } else {
            (void)queries, (void)softmax_scale, (void)group;
            return {};
        }
    }
};

/// The reference's decode of `call`, on `scored` queries in place of the
/// call's when there are any (scored_queries::of): same view, options, lse
/// and scores asked, float outputs of its own.
/// @tparam Params a decode_params
template <class Params>
kvcache::reference::attention_result decode_as_scored(const Params& call, const std::vector<float>& scored) {
    const kvcache::reference_backend reference;
    if (scored.empty()) return reference.decode_exact(call);
    std::vector<float> outputs(call.outputs.size()), lse(call.lse.size()), scores(call.scores.size());
    kvcache::decode_params<decltype(call.view), float> on_scored(
        call.view, kvcache::span<const float>(scored.data(), scored.size()),
        kvcache::span<float>(outputs.data(), outputs.size()));
    on_scored.options = call.options;
    if (!lse.empty()) on_scored.lse = kvcache::span<float>(lse.data(), lse.size());
    if (!scores.empty()) on_scored.scores = kvcache::span<float>(scores.data(), scores.size());
    on_scored.score_stride = call.score_stride;
    return reference.decode_exact(on_scored);
}

}  // namespace kvcache_test
