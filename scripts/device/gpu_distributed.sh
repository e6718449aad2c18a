#!/usr/bin/env bash
# Sharded ops on a 2-GPU machine, from the repository root: bash scripts/device/gpu_distributed.sh OUTDIR [tests] [example] [bench]
# (no stage named: all three). NCCL with NVLink multicast off. Expected: tests ~1 min (world 2 on
# NCCL, world 3 on gloo over the two GPUs), example ~20 s, bench ~1 min; under 4 min in all.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source "$(dirname "$0")/stages.sh"
op_setup distributed "${1:?usage: gpu_distributed.sh OUTDIR [tests example bench]}"
shift
nvidia-smi -L | tee "$OUT/distributed_gpus.txt"
for stage in ${*:-tests example bench}; do
    stage_banner "$stage"
    case "$stage" in
        tests)
            logged tests 170 25 python3 -m pytest tests/test_distributed.py tests/test_distributed_cross_entropy.py -q \
                -p no:cacheprovider -n 3 -rs --durations=6 ;;
        example)
            timeout 60 torchrun --nproc-per-node 2 examples/distributed_softmax.py \
                > "$OUT/distributed_example.log" 2>&1 || status=1
            grep "rank" "$OUT/distributed_example.log" | tail -4 ;;
        bench)
            logged bench 120 40 torchrun --nproc-per-node 2 -m onlinesoftmax bench distributed --dtype bf16 \
                --out "$OUT" --overwrite ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
op_done
