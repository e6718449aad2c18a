#!/usr/bin/env bash
# The work log's ladder on the GPU, from the repository root: bash scripts/device/gpu_ladder.sh OUTDIR [tests] [sanitize] [bench]
# (no stage named: all three). Expected on an H100: tests ~40 s, sanitize ~70 s (two runs, each
# mostly Python start-up and numba compiles), bench ~50 s (kernel 1 is 18 ms a call; the harness's
# do_bench is time-bounded, so it runs about a dozen times). Each stage has its own time limit.
set -uo pipefail
# Real CUDA here: the simulator is for CPU-only CI.
unset NUMBA_ENABLE_CUDASIM
source "$(dirname "$0")/stages.sh"
op_setup ladder "${1:?usage: gpu_ladder.sh OUTDIR [tests sanitize bench]}"
shift
python3 -m pip list 2>/dev/null | grep -iE "^(numba|numba-cuda|cuda-bindings|llvmlite|torch|triton) " | tee "$OUT/ladder_versions.txt"
for stage in ${*:-tests sanitize bench}; do
    stage_banner "$stage"
    case "$stage" in
        tests)
            logged tests 150 25 python3 -m pytest tests/test_ladder.py -q -p no:cacheprovider -n 0 --durations=8 -ra ;;
        sanitize)
            # --report-api-errors no: cuda-bindings (under numba-cuda) probes driver entry points
            # with cuGetProcAddress, and each absent one is an API error, not a kernel's fault.
            sanitize_stage 120 ladder --report-api-errors no ;;
        bench)
            logged bench 240 45 python3 -m onlinesoftmax bench ladder --out "$OUT" --overwrite ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
op_done
