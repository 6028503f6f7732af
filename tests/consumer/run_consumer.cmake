# Drives one consumer test inside ctest: (optionally) installs kvcache into a
# fresh prefix, configures and builds the consumer project, runs its programs.
# Inputs: MODE (find_package|subdirectory), KVCACHE_BUILD_DIR, KVCACHE_SOURCE_DIR,
# KVCACHE_VERSION, WORK_DIR, GENERATOR, WITH_CUDA, CUDA_COMPILER (with WITH_CUDA),
# COMPILER_LAUNCHER (ccache or empty: the consumer's compiles are cached like kvcache's own).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run_step)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT status EQUAL 0)
        # The test's FAIL_REGULAR_EXPRESSION matches this sentence.
        message(FATAL_ERROR "kvcache consumer step failed (${status}): ${ARGN}\n${out}\n${err}")
    endif()
    message(STATUS "${out}")
endfunction()

set(consumer_dir ${KVCACHE_SOURCE_DIR}/tests/consumer/${MODE}_project)
set(configure_args -DKVCACHE_VERSION=${KVCACHE_VERSION})
if(COMPILER_LAUNCHER)
    list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${COMPILER_LAUNCHER})
endif()
if(MODE STREQUAL "find_package")
    set(prefix ${WORK_DIR}/prefix)
    run_step(${CMAKE_COMMAND} --install ${KVCACHE_BUILD_DIR} --prefix ${prefix})
    if(NOT EXISTS ${prefix}/include/kvcache/kvcache.hpp)
        message(FATAL_ERROR "kvcache consumer step failed: install did not place kvcache/kvcache.hpp under ${prefix}/include")
    endif()
    list(APPEND configure_args -DCMAKE_PREFIX_PATH=${prefix} -DWITH_CUDA=${WITH_CUDA})
    if(WITH_CUDA)
        list(APPEND configure_args -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
        if(COMPILER_LAUNCHER)
            list(APPEND configure_args -DCMAKE_CUDA_COMPILER_LAUNCHER=${COMPILER_LAUNCHER})
        endif()
    endif()
else()
    list(APPEND configure_args -DKVCACHE_SOURCE_DIR=${KVCACHE_SOURCE_DIR})
endif()
run_step(${CMAKE_COMMAND} -S ${consumer_dir} -B ${WORK_DIR}/build -G ${GENERATOR} ${configure_args})
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step(${WORK_DIR}/build/consumer)
if(WITH_CUDA)
    run_step(${WORK_DIR}/build/consumer_cuda_backend)
endif()
