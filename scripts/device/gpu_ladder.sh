#!/usr/bin/env bash
# The work log's ladder on the GPU, from the repository root: bash scripts/device/gpu_ladder.sh OUTDIR [tests] [sanitize] [bench]
# (no stage named: all three). Expected on an H100: tests ~40 s, sanitize ~70 s (two runs, each
# mostly Python start-up and numba compiles), bench ~50 s (kernel 1 is 18 ms a call; the harness's
# do_bench is time-bounded, so it runs about a dozen times). Each stage has its own time limit.
set -uo pipefail
OUT=${1:?usage: gpu_ladder.sh OUTDIR [tests sanitize bench]}
shift
STAGES=${*:-tests sanitize bench}
mkdir -p "$OUT"
# Real CUDA here: the simulator is for CPU-only CI.
unset NUMBA_ENABLE_CUDASIM
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import onlinesoftmax" 2>/dev/null || python3 -m pip install -q -e . --no-deps --no-build-isolation
python3 -m pip list 2>/dev/null | grep -iE "^(numba|numba-cuda|cuda-bindings|llvmlite|torch|triton) " | tee "$OUT/ladder_versions.txt"
status=0
for stage in $STAGES; do
    echo "=== ladder $stage ($(date +%T)) ==="
    case "$stage" in
        tests)
            timeout 150 python3 -m pytest tests/test_ladder.py -q -p no:cacheprovider -n 0 --durations=8 -ra \
                > "$OUT/ladder_tests.log" 2>&1 || status=1
            tail -25 "$OUT/ladder_tests.log" ;;
        sanitize)
            for tool in memcheck racecheck; do
                # --report-api-errors no: cuda-bindings (under numba-cuda) probes driver entry points
                # with cuGetProcAddress, and each absent one is an API error, not a kernel's fault.
                timeout 120 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 \
                    python3 -m pytest -q -p no:cacheprovider -m sanitizer tests/test_sanitizer_exercises.py -k ladder \
                    > "$OUT/ladder_sanitizer_$tool.log" 2>&1
                rc=$?; [ $rc -eq 0 ] || status=1
                echo "compute-sanitizer $tool exit $rc"
                grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/ladder_sanitizer_$tool.log" | tail -6
            done ;;
        bench)
            timeout 240 python3 -m onlinesoftmax bench ladder --out "$OUT" --overwrite \
                > "$OUT/ladder_bench.log" 2>&1 || status=1
            tail -45 "$OUT/ladder_bench.log" ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
echo "=== done ($(date +%T)), status $status ==="
exit $status
