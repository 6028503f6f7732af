// Which vector instructions the CPU backend is compiled for, decided once
// from the compiler's -m/-march macros, and the name of the inline namespace
// that holds every CPU-backend entity whose code depends on that choice.
//
// Why: float8 is an __m256 in an AVX2 build and a float[8] otherwise. Two
// translation units built with different flags would otherwise define the
// same names differently (an ODR violation the linker resolves silently, by
// keeping one copy of each template, maybe one with instructions the other
// unit's target lacks). With the namespace in every mangled name, each unit
// links to the code it was compiled for.
#pragma once

// The decision: avx512 implies AVX2, FMA and F16C (as -mavx512f does in g++
// and clang); every #if in the backend tests these macros, never the
// compiler's own, so the namespace name and the code cannot disagree.
// avx512_vnni adds the 16-bit integer dot products (vpdpwssd, with AVX512BW's
// byte widening) that score int8 keys; it is a namespace of its own because
// its code differs from avx512's.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX2__) && \
    defined(__FMA__) && defined(__F16C__)
#define KVCACHE_CPU_ISA_NAMESPACE avx512_vnni
#define KVCACHE_CPU_AVX512 1
#define KVCACHE_CPU_AVX512_VNNI 1
#define KVCACHE_CPU_AVX2_FMA 1
#define KVCACHE_CPU_F16C 1
#elif defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVCACHE_CPU_ISA_NAMESPACE avx512
#define KVCACHE_CPU_AVX512 1
#define KVCACHE_CPU_AVX512_VNNI 0
#define KVCACHE_CPU_AVX2_FMA 1
#define KVCACHE_CPU_F16C 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVCACHE_CPU_ISA_NAMESPACE avx2_fma_f16c
#define KVCACHE_CPU_AVX512 0
#define KVCACHE_CPU_AVX512_VNNI 0
#define KVCACHE_CPU_AVX2_FMA 1
#define KVCACHE_CPU_F16C 1
#elif defined(__AVX2__) && defined(__FMA__)
#define KVCACHE_CPU_ISA_NAMESPACE avx2_fma
#define KVCACHE_CPU_AVX512 0
#define KVCACHE_CPU_AVX512_VNNI 0
#define KVCACHE_CPU_AVX2_FMA 1
#define KVCACHE_CPU_F16C 0
#else
#define KVCACHE_CPU_ISA_NAMESPACE generic
#define KVCACHE_CPU_AVX512 0
#define KVCACHE_CPU_AVX512_VNNI 0
#define KVCACHE_CPU_AVX2_FMA 0
#define KVCACHE_CPU_F16C 0
#endif

#define KVCACHE_CPU_ISA_STRINGIFY_(x) #x
#define KVCACHE_CPU_ISA_STRINGIFY(x) KVCACHE_CPU_ISA_STRINGIFY_(x)

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// The instruction set this translation unit's CPU kernels use ("avx512_vnni",
/// "avx512", "avx2_fma_f16c", "avx2_fma" or "generic"), the name of their namespace.
inline constexpr const char* isa_name = KVCACHE_CPU_ISA_STRINGIFY(KVCACHE_CPU_ISA_NAMESPACE);

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
