# Finds nvcc and CCCL (CUB, Thrust) for kvcache's own CUDA targets.
# Sets KVCACHE_HAS_CUDA in the caller's scope; never fails when CUDA is absent.
include(CheckLanguage)

macro(kvcache_enable_cuda)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
        if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
            set(CMAKE_CUDA_ARCHITECTURES ${KVCACHE_CUDA_ARCHITECTURES})
        endif()
        if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND CMAKE_CXX_COMPILER)
            set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
        endif()
        enable_language(CUDA)
        find_package(CUDAToolkit REQUIRED)
        # CMake 3.25's FindCUDAToolkit has no CCCL target; the toolkit ships one.
        find_package(CCCL CONFIG REQUIRED
            HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake/cccl" "${CUDAToolkit_TARGET_DIR}/lib64/cmake/cccl")
        set(KVCACHE_HAS_CUDA ON)
        message(STATUS "kvcache: CUDA ${CMAKE_CUDA_COMPILER_VERSION} found; CUDA targets for ${CMAKE_CUDA_ARCHITECTURES}")
    else()
        message(STATUS "kvcache: no CUDA compiler found; building host targets only")
    endif()
endmacro()
