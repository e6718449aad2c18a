#!/usr/bin/env bash
# softmax_topk on the GPU, from the repository root: bash scripts/device/gpu_topk.sh OUTDIR [tests] [sanitize] [bench] [paper] [sweep] [lanes]
# (no stage named: the first four; sweep is the tuning sweep of scripts/tune/sweep_topk.py; lanes times
# the lane selections, keeping one or two, each with either second read (the chunk, or the suspect
# lanes only: plan.TopkPlan.second_read), on the grid's k <= 64 cases at blocks of 512 and 1024).
# Expected on an H100 (cold Triton cache; compiles dominate): tests ~2.5 min, sanitize ~1.5 min (both
# tools), bench ~2 min, paper ~0.5 min, lanes ~4 min; each stage has its own time limit.
set -uo pipefail
OUT=${1:?usage: gpu_topk.sh OUTDIR [tests sanitize bench paper]}
shift
STAGES=${*:-tests sanitize bench paper}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import onlinesoftmax" 2>/dev/null || python3 -m pip install -q -e . --no-deps --no-build-isolation
status=0
for stage in $STAGES; do
    echo "=== topk $stage ($(date +%T)) ==="
    case "$stage" in
        tests)
            timeout 300 python3 -m pytest tests/test_topk.py -q -p no:cacheprovider -n 0 --durations=8 \
                > "$OUT/topk_tests.log" 2>&1 || status=1
            tail -25 "$OUT/topk_tests.log" ;;
        sanitize)
            for tool in memcheck racecheck; do
                timeout 170 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m sanitizer tests/test_sanitizer_exercises.py -k topk \
                    > "$OUT/topk_sanitizer_$tool.log" 2>&1
                rc=$?; [ $rc -eq 0 ] || status=1
                echo "compute-sanitizer $tool exit $rc"
                grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/topk_sanitizer_$tool.log" | tail -4
            done ;;
        bench)
            timeout 300 python3 -m onlinesoftmax bench topk --out "$OUT" --overwrite \
                > "$OUT/topk_bench.log" 2>&1 || status=1
            tail -60 "$OUT/topk_bench.log" ;;
        paper)
            timeout 120 python3 -m onlinesoftmax bench topk_paper --out "$OUT" --overwrite \
                > "$OUT/topk_paper.log" 2>&1 || status=1
            tail -30 "$OUT/topk_paper.log" ;;
        sweep)
            timeout 420 python3 scripts/tune/sweep_topk.py --quick --out "$OUT/sweep_topk.json" > "$OUT/sweep_topk.log" 2>&1 || status=1
            cat "$OUT/sweep_topk.log" ;;
        lanes)
            timeout 300 python3 scripts/tune/sweep_topk.py --dtypes fp32,bf16 --configs 512x4,1024x4 --schemes lane_best,lane_best2,lane_best_lanes,lane_best2_lanes \
                --cases 1024x25000x5,256x151936x5,4096x4096x8,64x128256x50,256x151936x64 --out "$OUT/sweep_topk_lanes.json" \
                > "$OUT/sweep_topk_lanes.log" 2>&1 || status=1
            cat "$OUT/sweep_topk_lanes.log" ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
echo "=== done ($(date +%T)), status $status ==="
exit $status
