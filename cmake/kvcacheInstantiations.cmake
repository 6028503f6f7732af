# Explicit instantiation of kvcache's CUDA backend, one nvcc translation unit
# per configuration so builds parallelise and a user compiles only what they run.
#
#   kvcache_add_cuda_instantiations(<target>
#       CONFIGURATIONS <layout>:<element>:<query heads>:<kv heads>:<head dim> ...)
#
# layout: contiguous | paged | sliding_window; element: fp32 | fp16 | bf16 |
# fp8_e4m3 | fp8_e5m2 | int8 | int4 (fp8, int8 and int4 caches are instantiated for
# half queries and rows), or KEY+VALUE for keys and values stored in two of
# those types (kvcache::kv_elements, e.g. paged:int8+int4:32:8:128; queries
# and rows are the key type's activation, kvcache::default_activation); a head
# count may be "dynamic" (kvcache::dynamic: one TU serves every count of that
# head dimension, e.g. paged:fp16:dynamic:dynamic:128). Makes the
# static library <target> (link it and include kvcache/backend/cuda.hpp from
# plain C++) and a header <target>_configurations.hpp on its include path
# defining kvcache::compiled::<target> (a type_list for kvcache::dispatch).
#
# Lists shipped with kvcache:
#   KVCACHE_CUDA_TEST_CONFIGURATIONS   what kvcache's GPU tests run (37 TUs:
#                                      fp32 and fp16 in full, bf16 on three,
#                                      fp8 on two, K/V pairs on two);
#                                      equals kvcache::test_configurations
#   KVCACHE_CUDA_PRESET_CONFIGURATIONS every layout and type for the model
#                                      presets (36 TUs); equals kvcache::preset_configurations
#
# The same file serves kvcache's own build (from cmake/) and a downstream
# project (installed beside kvcacheConfig.cmake, which includes it): the
# templates are read from the folder this file is in, wherever that is
# (CMAKE_CURRENT_FUNCTION_LIST_DIR, so a call from any directory finds them).
# The calling project must have enabled CUDA; the CUDA toolkit and CCCL are
# found on the first call.
include("${CMAKE_CURRENT_LIST_DIR}/kvcacheCuda.cmake")

function(_kvcache_product out elements heads_list)
    set(result "")
    foreach(layout contiguous paged sliding_window)
        foreach(element ${elements})
            foreach(heads ${heads_list})
                list(APPEND result "${layout}:${element}:${heads}")
            endforeach()
        endforeach()
    endforeach()
    set(${out} "${result}" PARENT_SCOPE)
endfunction()

_kvcache_product(KVCACHE_CUDA_TEST_CONFIGURATIONS "fp32;fp16" "4:4:32;8:2:64;4:1:32;5:1:56;dynamic:dynamic:32")
# bf16 shares every code path with fp16 but its conversions, so three TUs (one per layout) cover it.
list(APPEND KVCACHE_CUDA_TEST_CONFIGURATIONS "contiguous:bf16:dynamic:dynamic:32" "paged:bf16:8:2:64"
     "sliding_window:bf16:4:1:32")
# fp8 differs from fp16 in the tile load's widening, the append's narrowing and the scales: two TUs
# (one per encoding; compiled and dynamic counts) cover those, CI building every TU on two cores.
list(APPEND KVCACHE_CUDA_TEST_CONFIGURATIONS "paged:fp8_e4m3:8:2:64" "sliding_window:fp8_e5m2:dynamic:dynamic:32")
# K/V pairs differ in having each side's loads, scales and append of its own type: two TUs.
list(APPEND KVCACHE_CUDA_TEST_CONFIGURATIONS "paged:fp16+int4:8:2:64" "contiguous:int8+int4:dynamic:dynamic:32")
_kvcache_product(KVCACHE_CUDA_PRESET_CONFIGURATIONS "fp32;fp16;bf16" "32:8:128;32:32:128;28:4:128;8:2:64")

# The C++ type of one element name (fp32 ... int4), or FATAL_ERROR naming `configuration`.
function(_kvcache_element_type out element configuration)
    if(element STREQUAL "fp32")
        set(type "float")
    elseif(element STREQUAL "fp16")
        set(type "kvcache::half")
    elseif(element STREQUAL "bf16")
        set(type "kvcache::bfloat16")
    elseif(element STREQUAL "fp8_e4m3")
        set(type "kvcache::float8_e4m3")
    elseif(element STREQUAL "fp8_e5m2")
        set(type "kvcache::float8_e5m2")
    elseif(element STREQUAL "int8")
        set(type "kvcache::qint8")
    elseif(element STREQUAL "int4")
        set(type "kvcache::qint4")
    else()
        message(FATAL_ERROR "kvcache: element '${element}' in '${configuration}' is not fp32, fp16, bf16, "
                            "fp8_e4m3, fp8_e5m2, int8 or int4 (or KEY+VALUE of two of them)")
    endif()
    set(${out} "${type}" PARENT_SCOPE)
endfunction()

function(kvcache_add_cuda_instantiations target)
    cmake_parse_arguments(ARG "" "" "CONFIGURATIONS" ${ARGN})
    if(NOT ARG_CONFIGURATIONS)
        message(FATAL_ERROR "kvcache_add_cuda_instantiations(${target}): no CONFIGURATIONS given")
    endif()
    set(templates "${CMAKE_CURRENT_FUNCTION_LIST_DIR}")  # this file's folder: cmake/ or the installed package
    get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
    if(NOT "CUDA" IN_LIST languages)
        message(FATAL_ERROR "kvcache_add_cuda_instantiations(${target}) compiles .cu files: enable CUDA first "
                            "(project(... LANGUAGES CXX CUDA) or enable_language(CUDA))")
    endif()
    foreach(template kvcache_instantiation.cu.in kvcache_merge_instantiation.cu.in kvcache_configurations.hpp.in)
        if(NOT EXISTS "${templates}/${template}")
            message(FATAL_ERROR "kvcache_add_cuda_instantiations: ${template} is missing beside "
                                "${templates}/kvcacheInstantiations.cmake (an incomplete install?)")
        endif()
    endforeach()
    kvcache_find_cuda_libraries()
    set(dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_instantiations")
    string(MAKE_C_IDENTIFIER "${target}" KVCACHE_LIST_NAME)
    set(KVCACHE_TARGET "${target}")
    set(sources "")
    set(types "")
    foreach(KVCACHE_CONFIGURATION IN LISTS ARG_CONFIGURATIONS)
        string(REPLACE ":" ";" parts "${KVCACHE_CONFIGURATION}")
        list(LENGTH parts count)
        if(NOT count EQUAL 5)
            message(FATAL_ERROR "kvcache: configuration '${KVCACHE_CONFIGURATION}' is not layout:element:q:kv:dim")
        endif()
        list(GET parts 0 layout)
        list(GET parts 1 element)
        list(GET parts 2 q)
        list(GET parts 3 kv)
        list(GET parts 4 dim)
        if(NOT layout MATCHES "^(contiguous|paged|sliding_window)$")
            message(FATAL_ERROR "kvcache: layout '${layout}' in '${KVCACHE_CONFIGURATION}' is not contiguous, paged or sliding_window")
        endif()
        # KEY+VALUE: keys and values stored in two types (kvcache::kv_elements).
        string(REPLACE "+" ";" sides "${element}")
        list(LENGTH sides side_count)
        if(side_count EQUAL 2)
            list(GET sides 0 key_element)
            list(GET sides 1 value_element)
            if(key_element STREQUAL value_element)
                message(FATAL_ERROR "kvcache: element '${element}' in '${KVCACHE_CONFIGURATION}' names one type twice "
                                    "(write ${key_element})")
            endif()
            _kvcache_element_type(key_type "${key_element}" "${KVCACHE_CONFIGURATION}")
            _kvcache_element_type(value_type "${value_element}" "${KVCACHE_CONFIGURATION}")
            set(type "kvcache::kv_elements<${key_type}, ${value_type}>")
        elseif(side_count EQUAL 1)
            _kvcache_element_type(type "${element}" "${KVCACHE_CONFIGURATION}")
        else()
            message(FATAL_ERROR "kvcache: element '${element}' in '${KVCACHE_CONFIGURATION}' is not one type or KEY+VALUE")
        endif()
        string(REPLACE "+" "_" element_file "${element}")
        # A head count may be "dynamic": one instantiation then serves every count (kvcache::dynamic).
        set(q_arg "${q}")
        set(kv_arg "${kv}")
        if(q STREQUAL "dynamic")
            set(q_arg "kvcache::dynamic")
        endif()
        if(kv STREQUAL "dynamic")
            set(kv_arg "kvcache::dynamic")
        endif()
        if(NOT q_arg MATCHES "^([1-9][0-9]*|kvcache::dynamic)$" OR NOT kv_arg MATCHES "^([1-9][0-9]*|kvcache::dynamic)$"
           OR NOT dim MATCHES "^[1-9][0-9]*$")
            message(FATAL_ERROR "kvcache: heads in '${KVCACHE_CONFIGURATION}' are not <count|dynamic>:<count|dynamic>:<dim>")
        endif()
        set(heads "kvcache::head_config<${q_arg}, ${kv_arg}, ${dim}>")
        set(KVCACHE_VIEW "kvcache::${layout}_view<${type}, ${heads}>")
        set(file "${dir}/${layout}_${element_file}_${q}_${kv}_${dim}.cu")
        configure_file("${templates}/kvcache_instantiation.cu.in" "${file}" @ONLY)
        list(APPEND sources "${file}")
        list(APPEND types "kvcache::configuration<kvcache::${layout}_layout, ${type}, ${heads}>")
    endforeach()
    configure_file("${templates}/kvcache_merge_instantiation.cu.in" "${dir}/merge_states.cu" @ONLY)
    list(APPEND sources "${dir}/merge_states.cu")
    list(JOIN types ",\n    " KVCACHE_CONFIGURATION_TYPES)
    configure_file("${templates}/kvcache_configurations.hpp.in"
                   "${dir}/include/${target}_configurations.hpp" @ONLY)

    add_library(${target} STATIC ${sources})
    target_link_libraries(${target} PUBLIC kvcache::kvcache CUDA::cudart PRIVATE CCCL::CCCL)
    target_include_directories(${target} PUBLIC "${dir}/include")
    # C++17 in the nvcc TUs even where the package config ran before CUDA was enabled.
    target_compile_features(${target} PRIVATE cuda_std_17)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES native)
    endif()
endfunction()
