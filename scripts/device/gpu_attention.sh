#!/usr/bin/env bash
# Attention on the GPU, from the repository root: bash scripts/device/gpu_attention.sh OUTDIR [tests] [sanitize] [sweep] [bench]
# [fullsweep:D:DTYPE] (no stage named: the first four). Expected on an H100: tests ~2.5 min, sanitize ~1 min, sweep ~3 min,
# bench ~4-6 min (FlexAttention compiles once per case); each stage has its own time limit.
set -uo pipefail
OUT=${1:?usage: gpu_attention.sh OUTDIR [tests sanitize sweep bench]}
shift
STAGES=${*:-tests sanitize sweep bench}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import onlinesoftmax" 2>/dev/null || python3 -m pip install -q -e . --no-deps --no-build-isolation
status=0
for stage in $STAGES; do
    echo "=== attention $stage ($(date +%T)) ==="
    case "$stage" in
        tests)
            timeout 170 python3 -m pytest tests/test_attention.py -q -p no:cacheprovider -n 4 --durations=8 \
                > "$OUT/attention_tests.log" 2>&1 || status=1
            tail -25 "$OUT/attention_tests.log" ;;
        sanitize)
            for tool in memcheck racecheck; do
                timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m sanitizer tests/test_sanitizer_exercises.py -k attention \
                    > "$OUT/attention_sanitizer_$tool.log" 2>&1
                rc=$?; [ $rc -eq 0 ] || status=1
                echo "compute-sanitizer $tool exit $rc"
                grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/attention_sanitizer_$tool.log" | tail -4
            done ;;
        sweep)
            timeout 240 python3 scripts/tune/sweep_attention.py > "$OUT/attention_sweep.log" 2>&1 || status=1
            tail -30 "$OUT/attention_sweep.log" ;;
        bench)
            timeout 420 python3 -m onlinesoftmax bench attention --dtype bf16 --out "$OUT" --overwrite \
                > "$OUT/attention_bench.log" 2>&1 || status=1
            tail -45 "$OUT/attention_bench.log" ;;
        fullsweep:*)
            # One part of the full sweep (bench attention --sweep without --quick: FlexAttention too), one
            # head dim and dtype a call, merged into $OUT/attention_sweep.json: fullsweep:D:DTYPE, e.g.
            # fullsweep:80:bf16. Copy the committed attention_sweep.json into $OUT first to extend it.
            IFS=: read -r _ dim dtype <<< "$stage"
            shapes=$(python3 -c "from onlinesoftmax.bench.attention_suite import sweep_shapes
print(' '.join('--shape ' + 'x'.join(map(str, s)) for s in sweep_shapes(False) if s[4] == $dim))")
            # --deadline: a part cut by the machine's time limit would write nothing; this one stops
            # starting cases in time to write the ones it measured.
            # shellcheck disable=SC2086
            timeout 540 python3 -m onlinesoftmax bench attention --sweep --dtype "$dtype" --merge --out "$OUT" \
                --deadline 420 $shapes \
                > "$OUT/attention_fullsweep_${dim}_${dtype}.log" 2>&1 || status=1
            tail -12 "$OUT/attention_fullsweep_${dim}_${dtype}.log" ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
echo "=== done ($(date +%T)), status $status ==="
exit $status
