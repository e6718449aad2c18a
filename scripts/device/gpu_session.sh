#!/usr/bin/env bash
# Device-machine driver (one call of the lent GPU runs one or more stages), from the repository root:
#   bash scripts/device/gpu_session.sh tests sanitize tune bench overhead topk:bench,paper attention:sweep ladder
# Stages: tests (whole suite, then the slow ones), sanitize (memcheck + racecheck over every softmax
# kernel), sweep / tune (strategy and constant sweeps for ops/softmax/plan.py), bench (the softmax bench with
# peers), overhead (host cost per call); OP[:STAGE,...] runs scripts/device/gpu_OP.sh for topk, attention
# ladder or cross_entropy. Peers' wheels, if carried in .whl/, are installed into /tmp/site first. Logs and
# results go to $OUT, bundled into one results.tgz at the end. SANITIZE_TIMEOUT (s, default 600) caps
# each compute-sanitizer tool in the sanitize stage; TUNE_ARGS go to scripts/tune/tune_softmax.py (say
# "--strategy split_row_on_chip --backward"); BENCH_ARGS go to the softmax bench; TEST_PATHS (default tests) limit the tests stage; OVERHEAD_IMPORTS (modules, space-separated) has the
# overhead stage import them and re-time the top-k calls.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# Peers arrive as wheels (no registry there). Quack needs nvidia-cutlass-dsl's libs-base, libs-core
# (the cutlass Python package) and libs-cu13 (the torch there is cu130), whose 92 MB wheel is over
# the per-call transfer limit and comes split:
# the 'stash' stage keeps .peers1/ (wheels and the first part) on the machine, a following call
# carries .peers2/ (the rest) and the parts are joined before installing.
install_peers() {
    local dir=/root/peers
    mkdir -p "$dir"
    for d in .peers1 .peers2 .whl; do [ -d "$d" ] && cp "$d"/* "$dir"/ 2>/dev/null; done
    # A split wheel arrives as WHEEL.part_aa, WHEEL.part_ab (scripts/device/fetch_peers.sh): join each.
    for first in "$dir"/*.whl.part_aa; do
        [ -e "$first" ] || continue
        wheel=${first%.part_aa}
        cat "$wheel".part_* > "$wheel"
        python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).testzip()" "$wheel" \
            || { echo "joined wheel $wheel is incomplete"; rm "$wheel"; }
    done
    rm -f "$dir"/*.part_*
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$dir"/*.whl
}
if [ "${1:-}" = "stash" ]; then
    mkdir -p /root/peers && cp .peers1/* /root/peers/ && echo "stashed $(ls /root/peers | wc -l) files"; shift
else
    install_peers 2>&1 | tail -3
fi
export PYTHONPATH="$PYTHONPATH:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
python3 -c "import liger_kernel; print('liger importable')" 2>&1 | tail -1
python3 -c "import quack.softmax; print('quack importable')" 2>&1 | tail -3
python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2  # the console script
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
status=0
for stage in "$@"; do
    echo "=== $stage ==="
    case "$stage" in
        tests)
            timeout 420 python3 -m pytest ${TEST_PATHS:-tests} -q -p no:cacheprovider -n 8 -m "not slow" --durations=15 -ra 2>&1 | tee "$OUT/gpu_tests.log" | tail -45 || status=1
            timeout 150 python3 -m pytest ${TEST_PATHS:-tests} -q -p no:cacheprovider -m slow -ra 2>&1 | tee "$OUT/gpu_tests_slow.log" | tail -8 || status=1 ;;
        sanitize)
            for tool in memcheck racecheck; do
                timeout "${SANITIZE_TIMEOUT:-600}" compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m sanitizer tests/test_sanitizer_exercises.py -k softmax > "$OUT/sanitizer_$tool.log" 2>&1
                echo "compute-sanitizer $tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitizer_$tool.log" | tail -3
            done ;;
        sweep)
            python3 scripts/tune/sweep_strategies.py --out "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log" ;;
        bench)
            # Written under /root/bench, which outlives the call on a warm machine, so that a later
            # call can add rows with BENCH_ARGS="--dtype bf16 --merge" (one call may not fit the grid).
            timeout 570 python3 -m onlinesoftmax bench softmax --out /root/bench --overwrite ${BENCH_ARGS:-} 2>&1 \
                | grep -v -E "warn|Online softmax|split the reduction|important use case|softmax\.$|^$" | tee "$OUT/bench.log" | tail -60
            cp /root/bench/softmax.* "$OUT"/ ;;
        tune)
            timeout 400 python3 scripts/tune/tune_softmax.py ${TUNE_ARGS:-} --out "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log" | grep -v "^  [A-Z]" ;;
        overhead)
            python3 scripts/probes/launch_overhead.py ${OVERHEAD_IMPORTS:+--import $OVERHEAD_IMPORTS} > "$OUT/launch_overhead.log" 2>&1
            grep -E "us issued|imported|hooks" "$OUT/launch_overhead.log" ;;
        topk*|attention*|ladder*|cross_entropy*)  # op[:stage,stage...], e.g. topk:bench,paper
            op=${stage%%:*}; sub=""; [ "$op" != "$stage" ] && sub=${stage#*:}
            timeout 560 bash "scripts/device/gpu_$op.sh" "$OUT" ${sub//,/ } > "$OUT/gpu_$op.log" 2>&1; echo "gpu_$op exit $?"
            tail -40 "$OUT/gpu_$op.log" ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
# The device tool brings back a limited number of files: bundle them into one archive.
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/")
exit $status
