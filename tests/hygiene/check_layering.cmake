# Fails when a header includes a header of a higher layer. The order is the
# one in docs/architecture.md: core < execution, layout < configuration, cache,
# kernels < backend < policy. (execution and layout are independent of each
# other; configuration sees only layouts; cache may not see execution or
# kernels; kernels may not see cache; policy, on top, needs only core and
# layouts: it ranks rows from scores and reads key rows through a view;
# transport, the UCX page transfer outside the umbrella, sees only core,
# layout and cache, and nothing of the library sees it.)
# Past the layers: the library never includes the model engine (engine/) or
# the examples, and the engine includes only the library and itself.
# Input: INCLUDE_DIR (the include/ folder), ENGINE_DIR (engine/, optional).
cmake_minimum_required(VERSION 3.25)
set(allowed_core core)
set(allowed_execution core execution)
set(allowed_layout core layout)
set(allowed_configuration core layout configuration)
set(allowed_cache core layout cache)
set(allowed_kernels core execution layout kernels)
set(allowed_backend core execution layout configuration cache kernels backend)
set(allowed_transport core layout cache transport)
set(allowed_policy core layout policy)

set(violations "")
foreach(layer core execution layout configuration cache kernels backend policy transport)
    file(GLOB_RECURSE headers ${INCLUDE_DIR}/kvcache/${layer}/*.hpp ${INCLUDE_DIR}/kvcache/${layer}/*.cuh)
    foreach(header IN LISTS headers)
        file(STRINGS ${header} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]kvcache/")
        foreach(line IN LISTS lines)
            string(REGEX MATCH "kvcache/([a-z_]+)" _ "${line}")
            set(target ${CMAKE_MATCH_1})
            if(target MATCHES "^(core|execution|layout|configuration|cache|kernels|backend|policy|transport)$" AND NOT target IN_LIST allowed_${layer})
                file(RELATIVE_PATH rel ${INCLUDE_DIR} ${header})
                string(APPEND violations "  ${rel} (layer ${layer}) includes ${line}\n")
            endif()
        endforeach()
    endforeach()
endforeach()
if(violations)
    message(FATAL_ERROR "kvcache layering broken, a lower layer includes a higher one:\n${violations}")
endif()
message(STATUS "kvcache layering: every header includes only its own or lower layers")

# The library (every header of include/kvcache) sees neither the engine nor the examples.
file(GLOB_RECURSE headers ${INCLUDE_DIR}/kvcache/*)
foreach(header IN LISTS headers)
    file(STRINGS ${header} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](kvcache_engine|engine|examples|common)/")
    foreach(line IN LISTS lines)
        file(RELATIVE_PATH rel ${INCLUDE_DIR} ${header})
        string(APPEND violations "  ${rel} (the library) includes ${line}\n")
    endforeach()
endforeach()
# The engine's own includes ("...") name the library or the engine, nothing else (not examples/common).
if(DEFINED ENGINE_DIR)
    file(GLOB_RECURSE sources ${ENGINE_DIR}/include/*.hpp ${ENGINE_DIR}/src/*.cpp)
    foreach(source IN LISTS sources)
        file(STRINGS ${source} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
        foreach(line IN LISTS lines)
            # (kvcache_engine_*_configurations.hpp: the list the engine's CUDA instantiations generate)
            if(NOT line MATCHES "\"(kvcache|kvcache_engine)/" AND NOT line MATCHES "\"kvcache_engine_[a-z_]+_configurations\\.hpp\"")
                file(RELATIVE_PATH rel ${ENGINE_DIR} ${source})
                string(APPEND violations "  engine/${rel} (the engine) includes ${line}\n")
            endif()
        endforeach()
    endforeach()
endif()
if(violations)
    message(FATAL_ERROR "kvcache layering broken, the library or the engine includes past its dependencies:\n${violations}")
endif()
message(STATUS "kvcache layering: the library includes neither engine/ nor examples/; the engine only the library")
