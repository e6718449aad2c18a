#!/usr/bin/env bash
# softmax_topk on the GPU, from the repository root: bash scripts/device/gpu_topk.sh OUTDIR [tests] [sanitize] [bench] [paper] [sweep] [lanes]
# (no stage named: the first four; sweep is the tuning sweep of scripts/tune/sweep_topk.py; lanes times
# the lane selections, keeping one or two, each with either second read (the chunk, or the suspect
# lanes only: plan.TopkPlan.second_read), on the grid's k <= 64 cases at blocks of 512 and 1024).
# Expected on an H100 (cold Triton cache; compiles dominate): tests ~2.5 min, sanitize ~1.5 min (both
# tools), bench ~2 min, paper ~0.5 min, lanes ~4 min; each stage has its own time limit.
set -uo pipefail
source "$(dirname "$0")/stages.sh"
op_setup topk "${1:?usage: gpu_topk.sh OUTDIR [tests sanitize bench paper]}"
shift
for stage in ${*:-tests sanitize bench paper}; do
    stage_banner "$stage"
    case "$stage" in
        tests)
            logged tests 300 25 python3 -m pytest tests/test_topk.py -q -p no:cacheprovider -n 0 --durations=8 ;;
        sanitize)
            sanitize_stage 170 topk ;;
        bench)
            logged bench 300 60 python3 -m onlinesoftmax bench topk --out "$OUT" --overwrite ;;
        paper)
            logged paper 120 30 python3 -m onlinesoftmax bench topk_paper --out "$OUT" --overwrite ;;
        sweep)
            logged sweep 420 1000 python3 scripts/tune/sweep_topk.py --quick --out "$OUT/sweep_topk.json" ;;
        lanes)
            logged sweep_lanes 300 1000 python3 scripts/tune/sweep_topk.py --dtypes fp32,bf16 --configs 512x4,1024x4 \
                --schemes lane_best,lane_best2,lane_best_lanes,lane_best2_lanes \
                --cases 1024x25000x5,256x151936x5,4096x4096x8,64x128256x50,256x151936x64 --out "$OUT/sweep_topk_lanes.json" ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
op_done
