# Runs an example with --backend cuda where a GPU is:
#   cmake "-DCOMMAND=prog;arg;..." "-DEXPECT=regex" -P run_if_gpu.cmake
# Passes when the program exits 0 and its output matches EXPECT. When it reports
# "no CUDA device: <reason>" the test prints the reason and passes, unless
# nvidia-smi lists a GPU that CUDA_VISIBLE_DEVICES does not hide and the build
# has CUDA: then the example missed a device it should have used, and that fails.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
string(REGEX MATCH "no CUDA device: [^\n]*" missing "${all}")
if(missing)
    find_program(NVIDIA_SMI nvidia-smi)
    if(NVIDIA_SMI AND NOT DEFINED ENV{CUDA_VISIBLE_DEVICES} AND NOT all MATCHES "this build has no CUDA")
        execute_process(COMMAND ${NVIDIA_SMI} -L RESULT_VARIABLE smi_rc OUTPUT_VARIABLE smi_out ERROR_QUIET)
        if(smi_rc EQUAL 0 AND smi_out MATCHES "GPU [0-9]+:")
            message(FATAL_ERROR "nvidia-smi lists a GPU, but the example says: ${missing}")
        endif()
    endif()
    message("skipped, counted as passed: ${missing}")
    return()
endif()
message("${all}")
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the example exited with ${rc}")
endif()
if(NOT all MATCHES "${EXPECT}")
    message(FATAL_ERROR "the output does not match '${EXPECT}'")
endif()
