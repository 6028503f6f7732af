# --kv-policy none changes nothing: the same ids and byte-identical logits as a run without it.
# -DLLAMA=exe -DMODEL=dir -DPROMPT=ids -DDIR=scratch folder
foreach(v plain none)
    set(_extra "")
    if(v STREQUAL "none")
        set(_extra --kv-policy none)
    endif()
    execute_process(COMMAND ${LLAMA} --model ${MODEL} --prompt-ids ${PROMPT} --max-new-tokens 24 --backend cpu
                            --threads 2 --dump-logits ${DIR}/policy_${v}.logits ${_extra}
                    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "06_llama (${v}) failed (${rc}): ${out}${err}")
    endif()
    string(REGEX MATCH "generated ids: [0-9 ]+" ${v}_ids "${out}")
endforeach()
if(NOT plain_ids STREQUAL none_ids OR plain_ids STREQUAL "")
    message(FATAL_ERROR "ids differ: '${plain_ids}' without --kv-policy, '${none_ids}' with --kv-policy none")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${DIR}/policy_plain.logits ${DIR}/policy_none.logits
                RESULT_VARIABLE same)
if(NOT same EQUAL 0)
    message(FATAL_ERROR "the logits of --kv-policy none differ from a run without it")
endif()
message(STATUS "--kv-policy none: ${none_ids}, logits byte-identical to a run without it")
