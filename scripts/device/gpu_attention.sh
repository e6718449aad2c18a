#!/usr/bin/env bash
# Attention on the GPU, from the repository root: bash scripts/device/gpu_attention.sh OUTDIR [tests] [sanitize] [sweep] [bench]
# [fullsweep:D:DTYPE] (no stage named: the first four). Expected on an H100: tests ~2.5 min, sanitize ~1 min, sweep ~3 min,
# bench ~4-6 min (FlexAttention compiles once per case); each stage has its own time limit.
set -uo pipefail
source "$(dirname "$0")/stages.sh"
op_setup attention "${1:?usage: gpu_attention.sh OUTDIR [tests sanitize sweep bench]}"
shift
for stage in ${*:-tests sanitize sweep bench}; do
    stage_banner "$stage"
    case "$stage" in
        tests)
            logged tests 170 25 python3 -m pytest tests/test_attention.py -q -p no:cacheprovider -n 4 --durations=8 ;;
        sanitize)
            sanitize_stage 120 attention ;;
        sweep)
            logged sweep 240 30 python3 scripts/tune/sweep_attention.py ;;
        bench)
            logged bench 420 45 python3 -m onlinesoftmax bench attention --dtype bf16 --out "$OUT" --overwrite ;;
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
            logged "fullsweep_${dim}_${dtype}" 540 12 python3 -m onlinesoftmax bench attention --sweep --dtype "$dtype" \
                --merge --out "$OUT" --deadline 420 $shapes ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
op_done
