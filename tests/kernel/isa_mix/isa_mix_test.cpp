// Two translation units call the CPU decode on the same view type, one built
// with -mavx2 -mfma and one without any AVX, and are linked into this
// program. What it checks:
//  - each unit's kernels were compiled for its own ISA (cpu::detail::isa_name
//    is "generic" in one and not in the other), and the decode entry point
//    each unit instantiated is a different function (without the ISA-keyed
//    inline namespace, both would be one symbol and the linker would keep one
//    of the two bodies for both units);
//  - both units' results match the double-precision reference (the AVX2
//    unit only where the CPU running the test has AVX2 and FMA).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "isa_unit.hpp"
#include "support/attention_harness.hpp"
#include "support/layout_factories.hpp"

using namespace kvcache;
using namespace kvcache_test;

TEST_CASE("units built for different ISAs link without sharing CPU kernels, and both match the reference") {
    context_case c{"mixed", {300, 45}, 0, 0, 16, {1, 1}, {}};
    auto cache = contiguous_factory::make<half, isa_mix::heads>(c, 1);
    const auto view = cache->view();
    fill_cache(view, 2);
    const auto queries = random_rows<float>(2 * isa_mix::heads::query_heads() * isa_mix::heads::head_dim, 3.0f, 3);
    for (int splits : {1, 3}) {
        attention_options options;
        options.kv_splits = splits;
        decode_params call(view, queries, span<float>());
        call.options = options;
        const auto expected = reference_backend{}.decode_exact(call);
        const std::string what = "kv_splits " + std::to_string(splits);
        const isa_mix::unit_result generic = isa_mix::decode_generic(view, queries, options);
        CHECK(generic.isa == "generic");
        compare(generic.outputs, generic.lse, expected, "generic unit, " + what);
        // The AVX2 unit's code may only run where the CPU has AVX2 and FMA;
        // its name and entry point are checked everywhere.
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            const isa_mix::unit_result avx2 = isa_mix::decode_avx2(view, queries, options);
            CHECK(avx2.isa != "generic");
            const bool distinct_entries = avx2.entry != generic.entry;
            CHECK(distinct_entries);
            compare(avx2.outputs, avx2.lse, expected, "avx2 unit (" + avx2.isa + "), " + what);
        } else {
            MESSAGE("this CPU has no AVX2+FMA: the -mavx2 -mfma unit was linked but not run");
        }
    }
}
