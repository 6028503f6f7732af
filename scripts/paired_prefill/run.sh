#!/usr/bin/env bash
# Paired prefill timing: the CPU prefill of a base commit's headers and of the
# working tree's, linked into one program and called alternately on one cache
# (batch 1, paged fp32 and fp16, 32q/8kv/d128, 512 query tokens after a
# 1024-token prefix), so a loaded machine slows both alike and the per-pair
# ratio stays meaningful. The base unit renames the ISA namespace by macro,
# so the two units share no kernel symbol.
# usage: scripts/paired_prefill/run.sh BASE_COMMIT [PAIRS]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(mktemp -d)
git -C "$root" archive "$1" include | tar -x -C "$out"
flags="-std=c++17 -O3 -march=native -DNDEBUG -I$here"
g++ $flags -I"$out/include" -c "$here/base.cpp" -o "$out/base.o"
g++ $flags -I"$root/include" -c "$here/new.cpp" -o "$out/new.o"
g++ $flags -I"$root/include" -I"$root/bench" -c "$here/main.cpp" -o "$out/main.o"
g++ "$out/base.o" "$out/new.o" "$out/main.o" -pthread -o "$out/paired_prefill"
"$out/paired_prefill" "${2:-15}"
