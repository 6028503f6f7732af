# install(), export() and the CMake package files of kvcache::kvcache and
# kvcache::emulator, with the CUDA instantiation helper a downstream project
# calls after find_package(kvcache).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The emulator's headers are installed by its file set, the rest of the tree
# here; each header is installed once, by the target it belongs to.
set(_kvcache_emulator_exclude "")
foreach(_header IN LISTS KVCACHE_EMULATOR_HEADERS KVCACHE_UCX_HEADERS)
    string(REGEX REPLACE "([.+])" "\\\\\\1" _pattern "${_header}")
    list(APPEND _kvcache_emulator_exclude REGEX "/${_pattern}$" EXCLUDE)
endforeach()
install(TARGETS kvcache kvcache_emulator EXPORT kvcacheTargets FILE_SET HEADERS)
install(DIRECTORY include/kvcache DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" ${_kvcache_emulator_exclude})
install(FILES "${PROJECT_BINARY_DIR}/include/kvcache/version.hpp" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/kvcache")
install(EXPORT kvcacheTargets NAMESPACE kvcache:: DESTINATION "${KVCACHE_INSTALL_CMAKEDIR}")
# kvcache::ucx in an export set of its own: kvcacheConfig.cmake loads it only
# where the consumer finds UCX, so a consumer without UCX still finds kvcache.
if(KVCACHE_HAS_UCX)
    install(TARGETS kvcache_ucx EXPORT kvcacheUcxTargets FILE_SET HEADERS)
    install(EXPORT kvcacheUcxTargets NAMESPACE kvcache:: DESTINATION "${KVCACHE_INSTALL_CMAKEDIR}")
    export(EXPORT kvcacheUcxTargets NAMESPACE kvcache:: FILE "${PROJECT_BINARY_DIR}/kvcacheUcxTargets.cmake")
endif()

# kvcache_add_cuda_instantiations() and what it reads: it finds its templates
# beside itself, so they travel together (the build tree gets copies too, for
# the package config exported there).
set(_kvcache_cuda_helpers
    kvcacheInstantiations.cmake
    kvcacheCuda.cmake
    kvcache_instantiation.cu.in
    kvcache_merge_instantiation.cu.in
    kvcache_configurations.hpp.in)
foreach(_file IN LISTS _kvcache_cuda_helpers)
    configure_file("${PROJECT_SOURCE_DIR}/cmake/${_file}" "${PROJECT_BINARY_DIR}/${_file}" COPYONLY)
    install(FILES "${PROJECT_SOURCE_DIR}/cmake/${_file}" DESTINATION "${KVCACHE_INSTALL_CMAKEDIR}")
endforeach()

configure_package_config_file(
    "${PROJECT_SOURCE_DIR}/cmake/kvcacheConfig.cmake.in"
    "${PROJECT_BINARY_DIR}/kvcacheConfig.cmake"
    INSTALL_DESTINATION "${KVCACHE_INSTALL_CMAKEDIR}")
write_basic_package_version_file(
    "${PROJECT_BINARY_DIR}/kvcacheConfigVersion.cmake"
    VERSION ${PROJECT_VERSION}
    COMPATIBILITY SameMajorVersion
    ARCH_INDEPENDENT)
install(FILES
    "${PROJECT_BINARY_DIR}/kvcacheConfig.cmake"
    "${PROJECT_BINARY_DIR}/kvcacheConfigVersion.cmake"
    DESTINATION "${KVCACHE_INSTALL_CMAKEDIR}")

# Lets a consumer use the build tree directly: find_package(kvcache) with kvcache_DIR=<build>.
export(EXPORT kvcacheTargets NAMESPACE kvcache:: FILE "${PROJECT_BINARY_DIR}/kvcacheTargets.cmake")
