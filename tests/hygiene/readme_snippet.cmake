# Writes the first ```cpp block of README.md to OUTPUT: the README's usage
# snippet is then built and run as a test, so it cannot drift from the API.
file(READ ${README} readme)
string(FIND "${readme}" "```cpp\n" start)
if(start EQUAL -1)
    message(FATAL_ERROR "${README} has no ```cpp block")
endif()
math(EXPR start "${start} + 7")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "```" stop)
string(SUBSTRING "${rest}" 0 ${stop} snippet)
file(CONFIGURE OUTPUT ${OUTPUT} CONTENT "${snippet}" @ONLY)
