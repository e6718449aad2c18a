#!/usr/bin/env bash
# Sharded ops on a 2-GPU machine, from the repository root: bash scripts/device/gpu_distributed.sh OUTDIR [tests] [example] [bench]
# (no stage named: all three). NCCL with NVLink multicast off. Expected: tests ~1.5-2.5 min (world 2 on
# NCCL; world 3 is skipped with a reason on 2 GPUs), example ~20 s, bench ~1 min; under 4 min in all.
set -uo pipefail
OUT=${1:?usage: gpu_distributed.sh OUTDIR [tests example bench]}
shift
STAGES=${*:-tests example bench}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import onlinesoftmax" 2>/dev/null || python3 -m pip install -q -e . --no-deps --no-build-isolation
nvidia-smi -L | tee "$OUT/distributed_gpus.txt"
status=0
for stage in $STAGES; do
    echo "=== distributed $stage ($(date +%T)) ==="
    case "$stage" in
        tests)
            timeout 170 python3 -m pytest tests/test_distributed.py -q -p no:cacheprovider -rs --durations=6 \
                > "$OUT/distributed_tests.log" 2>&1 || status=1
            tail -25 "$OUT/distributed_tests.log" ;;
        example)
            timeout 60 torchrun --nproc-per-node 2 examples/distributed_softmax.py \
                > "$OUT/distributed_example.log" 2>&1 || status=1
            grep "rank" "$OUT/distributed_example.log" | tail -4 ;;
        bench)
            timeout 120 torchrun --nproc-per-node 2 -m onlinesoftmax bench distributed --dtype bf16 \
                --out "$OUT" --overwrite > "$OUT/distributed_bench.log" 2>&1 || status=1
            tail -40 "$OUT/distributed_bench.log" ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
echo "=== done ($(date +%T)), status $status ==="
exit $status
