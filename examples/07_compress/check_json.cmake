# Runs 07_compress with --json and checks the file: one result for the full
# cache and one per policy and budget, every metric the plot reads present,
# the full cache at 100% of its own bytes and every policy below it, every
# perplexity at least 1, and the full cache answering at least 90% of the
# recall queries (the shipped model does the task: 99.4% over the whole set in
# PyTorch; without it no policy's recall figure means anything).
# usage: cmake -DPROGRAM=<07_compress> -DMODEL=<dir> -DJSON=<out file> -P check_json.cmake
cmake_minimum_required(VERSION 3.19)  # string(JSON)
foreach(variable PROGRAM MODEL JSON)
    if(NOT DEFINED ${variable})
        message(FATAL_ERROR "usage: cmake -DPROGRAM=... -DMODEL=... -DJSON=... -P check_json.cmake")
    endif()
endforeach()
file(REMOVE "${JSON}")
execute_process(COMMAND "${PROGRAM}" --model "${MODEL}" --windows 1 --recall 4 --budgets 10,50
                        --policies streaming,snapkv --json "${JSON}"
                RESULT_VARIABLE status OUTPUT_QUIET)
if(NOT status EQUAL 0)
    message(FATAL_ERROR "07_compress --json exited with ${status}")
endif()
file(READ "${JSON}" text)

function(fail)
    string(JOIN "" why ${ARGN})
    message(NOTICE "07_compress JSON check: ${why} (${JSON})")
    message(FATAL_ERROR "07_compress JSON check failed")
endfunction()

string(JSON count ERROR_VARIABLE error LENGTH "${text}" results)
if(error)
    fail("no 'results' array")
endif()
if(NOT count EQUAL 5)  # the full cache + 2 budgets x 2 policies
    fail("${count} results, expected 5")
endif()
string(JSON full_perplexity GET "${text}" results 0 metrics perplexity)
string(JSON full_right GET "${text}" results 0 metrics recall_right)
string(JSON full_total GET "${text}" results 0 metrics recall_total)
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
    string(JSON benchmark GET "${text}" results ${i} benchmark)
    string(JSON policy GET "${text}" results ${i} params policy)
    if(NOT benchmark STREQUAL "compress_quality")
        fail("result ${i} is '${benchmark}', not compress_quality")
    endif()
    foreach(metric perplexity perplexity_vs_full kl_max kl_mean bytes_held bytes_vs_full ms_per_token recall_right
                   recall_total)
        string(JSON value ERROR_VARIABLE error GET "${text}" results ${i} metrics ${metric})
        if(error)
            fail("result ${i} (${policy}) has no metric '${metric}'")
        endif()
    endforeach()
    string(JSON perplexity GET "${text}" results ${i} metrics perplexity)
    string(JSON bytes GET "${text}" results ${i} metrics bytes_vs_full)
    string(REGEX REPLACE "^([0-9]+).*$" "\\1" whole "${perplexity}")  # CMake's math has no floats
    if(whole LESS 1)
        fail("result ${i} (${policy}) has perplexity ${perplexity} below 1")
    endif()
    if(i EQUAL 0)
        if(NOT policy STREQUAL "none" OR NOT bytes STREQUAL "1.0")
            fail("result 0 is '${policy}' at ${bytes} of the full bytes, expected the full cache at 1.0")
        endif()
        math(EXPR right_tenths "${full_right} * 10")
        math(EXPR needed_tenths "${full_total} * 9")
        if(full_total LESS 1 OR right_tenths LESS needed_tenths)
            fail("the full cache answered ${full_right} of ${full_total} recall queries, expected at least 90%")
        endif()
    else()
        if(NOT bytes MATCHES "^0\\.")
            fail("result ${i} (${policy}) held ${bytes} of the full cache's bytes, expected below 1")
        endif()
    endif()
endforeach()
message(STATUS "07_compress JSON: ${count} results, full-cache perplexity ${full_perplexity}, recall ${full_right}/${full_total}")
