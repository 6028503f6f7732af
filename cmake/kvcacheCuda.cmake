# Finds nvcc and CCCL (CUB, Thrust). kvcache_enable_cuda() is for kvcache's
# own CUDA targets: it sets KVCACHE_HAS_CUDA in the caller's scope and never
# fails when CUDA is absent. kvcache_find_cuda_libraries() is what
# kvcache_add_cuda_instantiations() needs in any project that enabled CUDA,
# kvcache's own or a downstream one (this file is installed with the package).
include_guard(GLOBAL)
include(CheckLanguage)

# Makes CUDA::cudart and CCCL::CCCL, unless they exist already in this directory.
macro(kvcache_find_cuda_libraries)
    if(NOT TARGET CUDA::cudart)
        find_package(CUDAToolkit REQUIRED)
    endif()
    if(NOT TARGET CCCL::CCCL)
        # CMake 3.25's FindCUDAToolkit has no CCCL target; the toolkit ships one.
        find_package(CCCL CONFIG REQUIRED
            HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake/cccl" "${CUDAToolkit_TARGET_DIR}/lib64/cmake/cccl")
    endif()
endmacro()

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
        kvcache_find_cuda_libraries()
        set(KVCACHE_HAS_CUDA ON)
        message(STATUS "kvcache: CUDA ${CMAKE_CUDA_COMPILER_VERSION} found; CUDA targets for ${CMAKE_CUDA_ARCHITECTURES}")
    else()
        message(STATUS "kvcache: no CUDA compiler found; building host targets only")
    endif()
endmacro()
