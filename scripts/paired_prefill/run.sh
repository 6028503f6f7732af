#!/usr/bin/env bash
# Paired timing: the CPU prefill (or, with "decode", the CPU decode) of a
# base commit's headers and of the working tree's, linked into one program
# and called alternately on one cache, so a loaded machine slows both alike
# and the per-pair ratio stays meaningful. Prefill: batch 1, paged fp32 and
# fp16, 32q/8kv/d128, 512 query tokens after a 1024-token prefix. Decode:
# batch 1, contiguous fp16 and int8, GQA 32/8 and MHA 8/8, d128, 4K and 16K keys,
# against the streaming read probed in the same program. The base unit
# renames the ISA namespace by macro, so the two units share no kernel symbol.
# ARCH_FLAGS (default -march=native) picks the target: ARCH_FLAGS= times the
# portable kernels a build without -march flags gets.
# usage: [ARCH_FLAGS=...] scripts/paired_prefill/run.sh BASE_COMMIT [PAIRS] [prefill|decode]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(mktemp -d)
main=main.cpp
[ "${3:-prefill}" = decode ] && main=main_decode.cpp
git -C "$root" archive "$1" include | tar -x -C "$out"
flags="-std=c++17 -O3 ${ARCH_FLAGS--march=native} -DNDEBUG -I$here"
g++ $flags -I"$out/include" -c "$here/base.cpp" -o "$out/base.o"
g++ $flags -I"$root/include" -c "$here/new.cpp" -o "$out/new.o"
g++ $flags -I"$root/include" -I"$root/bench" -c "$here/$main" -o "$out/main.o"
g++ "$out/base.o" "$out/new.o" "$out/main.o" -pthread -o "$out/paired"
"$out/paired" "${2:-15}"
