#!/usr/bin/env bash
# scripts/gpu-check's budget and skip logic without a GPU (KVCACHE_GPU_CHECK_DRY=1:
# every step sleeps instead of running). Three cases: no nvidia-smi outside the
# dry mode exits 2 saying so; an ample budget passes every step with one log
# each and ends on the summary; a tiny one skips the late steps and fails.
set -uo pipefail
script="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/gpu-check"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# 1. Outside the dry mode, a missing nvidia-smi is reported, with exit 2.
text=$(KVCACHE_GPU_CHECK_NVIDIA_SMI=kvcache-no-such-nvidia-smi bash "$script" --out "$work/none" 2>&1)
rc=$?
((rc == 2)) || fail "no nvidia-smi: exit $rc, expected 2"
grep -q "no usable NVIDIA GPU" <<< "$text" || fail "no nvidia-smi: the message does not say so: $text"

# 2. Ample budget: every step passes, each with its log, the summary printed last.
text=$(KVCACHE_GPU_CHECK_DRY=1 KVCACHE_GPU_CHECK_SECONDS=120 bash "$script" --out "$work/ample" 2>&1)
rc=$?
((rc == 0)) || fail "ample budget: exit $rc, expected 0: $text"
passes=$(grep -c '| PASS ' <<< "$text")
((passes == 9)) || fail "ample budget: $passes steps passed, expected 9"
logs=$(find "$work/ample" -name '*.log' | wc -l)
((logs == 9)) || fail "ample budget: $logs step logs in --out, expected 9"
summary_line=$(grep -n "===== gpu-check summary" <<< "$text" | cut -d: -f1)
last_pass=$(grep -n '| PASS ' <<< "$text" | tail -1 | cut -d: -f1)
[[ -n $summary_line && -n $last_pass ]] && ((last_pass > summary_line)) || fail "ample budget: the summary table is not last"
grep -q "^peers: torch SDPA, FlashInfer (bench/peers) *| \(SKIPPED (torch not importable)\|PASS\)" <<< "$text" ||
    fail "ample budget: no peers row in the summary"

# 3. A 5-second budget with 2-second steps: the late steps are skipped, the check fails.
text=$(KVCACHE_GPU_CHECK_DRY=1 KVCACHE_GPU_CHECK_SECONDS=5 KVCACHE_GPU_CHECK_MIN_STEP=1 KVCACHE_GPU_CHECK_DRY_STEP=2 \
    KVCACHE_GPU_CHECK_OUT="$work/tiny" bash "$script" 2>&1)
rc=$?
((rc == 1)) || fail "tiny budget: exit $rc, expected 1"
grep -q "^kvcache_bench --backend cuda --quick *| SKIPPED (budget spent)" <<< "$text" ||
    fail "tiny budget: the bench step was not skipped: $text"
grep -q "^configure (sm_90, CUDA bench on) *| PASS" <<< "$text" || fail "tiny budget: the first step did not run"
[[ -d $work/tiny ]] || fail "tiny budget: KVCACHE_GPU_CHECK_OUT was not used"

((failures == 0)) && echo "gpu-check dry test: all cases as expected"
exit $((failures > 0))
