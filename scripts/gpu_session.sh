#!/usr/bin/env bash
# Device-machine driver (one call of the lent GPU runs one or more stages):
#   bash scripts/gpu_session.sh tests sanitize sweep bench
# Peers' wheels, if carried in .whl/, are installed into /tmp/site first. Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
status=0
for stage in "$@"; do
    echo "=== $stage ==="
    case "$stage" in
        tests)
            python3 -m pytest tests -q -p no:cacheprovider -n 8 -m "not slow" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25 || status=1
            python3 -m pytest tests -q -p no:cacheprovider -m slow 2>&1 | tee "$OUT/gpu_tests_slow.log" | tail -8 || status=1 ;;
        sanitize)
            for tool in memcheck racecheck; do
                compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/exercise_kernels.py > "$OUT/sanitizer_$tool.log" 2>&1
                echo "compute-sanitizer $tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|failures" "$OUT/sanitizer_$tool.log" | tail -3
            done ;;
        sweep)
            python3 scripts/sweep_strategies.py --out "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log" ;;
        bench)
            python3 -m onlinesoftmax bench softmax --out "$OUT" --name h100 2>&1 | tee "$OUT/bench.log" | tail -60 ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
exit $status
