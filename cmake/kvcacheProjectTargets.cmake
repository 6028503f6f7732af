# Helpers for kvcache's own tests, examples and benchmarks. Nothing here is
# imposed on consumers: warnings and sanitizers are set per target.

find_program(KVCACHE_CCACHE ccache)
if(KVCACHE_CCACHE)
    foreach(_lang CXX CUDA)
        if(NOT CMAKE_${_lang}_COMPILER_LAUNCHER)
            set(CMAKE_${_lang}_COMPILER_LAUNCHER "${KVCACHE_CCACHE}")
        endif()
    endforeach()
endif()

# kvcache_project_options(<target>): warnings as errors, sanitizers when asked.
function(kvcache_project_options target)
    target_compile_options(${target} PRIVATE
        $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>
        $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra -Werror=all-warnings --expt-relaxed-constexpr>)
    if(KVCACHE_SANITIZE)
        target_compile_options(${target} PRIVATE
            $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all>)
        # GCC's sanitizer instrumentation defeats the self-initialisation
        # GCC's own AVX-512 headers use for _mm512_undefined_*(), so
        # -Wmaybe-uninitialized fires inside <immintrin.h> on -march=native
        # builds; the plain (unsanitized) builds keep the warning.
        target_compile_options(${target} PRIVATE
            $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>)
        # -O1, after the build type's -O3: what the sanitizers are documented
        # for, and the -O3 instrumented build of the emulated kernel test alone
        # took 919 s of compile (268 s at -O1), most of CI's sanitizer stage.
        target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O1>)
        target_link_options(${target} PRIVATE -fsanitize=address,undefined)
    endif()
endfunction()

# kvcache_cuda_options(<target>): what every kvcache CUDA target needs.
function(kvcache_cuda_options target)
    target_link_libraries(${target} PRIVATE CCCL::CCCL CUDA::cudart)
    set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
endfunction()

# kvcache_add_test(<name> SOURCES ... LABELS ... [LIBRARIES ...] [ARGS ...] [CUDA])
# One doctest executable registered with CTest under the given labels. CUDA
# marks a test that links .cu helpers (skipped from configuration without nvcc).
function(kvcache_add_test name)
    cmake_parse_arguments(ARG "CUDA" "TIMEOUT" "SOURCES;LABELS;LIBRARIES;ARGS" ${ARGN})
    if(ARG_CUDA AND NOT KVCACHE_HAS_CUDA)
        return()
    endif()
    add_executable(${name} ${ARG_SOURCES})
    target_link_libraries(${name} PRIVATE kvcache::kvcache kvcache_doctest_main ${ARG_LIBRARIES})
    kvcache_project_options(${name})
    if(ARG_CUDA)
        kvcache_cuda_options(${name})
    endif()
    add_test(NAME ${name} COMMAND ${name} ${ARG_ARGS})
    if(NOT ARG_TIMEOUT)
        set(ARG_TIMEOUT 600)
    endif()
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()
