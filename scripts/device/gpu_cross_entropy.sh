#!/usr/bin/env bash
# cross_entropy and linear_cross_entropy on the GPU, from the repository root:
#   bash scripts/device/gpu_cross_entropy.sh OUTDIR [tests] [slow] [sanitize] [offgrid] [bench]
# (no stage named: tests and slow; name stages that fit a call's 10 minutes). tests: the three loss modules and torch's OpInfo samples, every
# test but the slow ones (TEST_ARGS adds pytest arguments, e.g. "-k inplace"); slow: the > 2^31-element
# cases; sanitize: memcheck and racecheck over the cross-entropy exercises; offgrid: one training step
# on odd, prime and "vocabulary + a few" lengths and seeded random shapes against F.cross_entropy,
# eager and CUDA-graph, bf16 and fp32 (OFFGRID_SEED, default a fresh one, printed); bench: `bench
# cross_entropy` rows merged into a copy of the committed h100 results (BENCH_ARGS: --shape, --dtype,
# --impls; Liger must be installed, as gpu_session.sh does from .whl/). Expected on an H100: tests
# ~1.5 min, slow ~1 min, sanitize ~2 min, offgrid ~4 min, bench ~1.5 min a row.
set -uo pipefail
source "$(dirname "$0")/stages.sh"
op_setup cross_entropy "${1:?usage: gpu_cross_entropy.sh OUTDIR [tests slow sanitize offgrid bench]}"
shift
MODULES="tests/test_cross_entropy.py tests/test_linear_cross_entropy.py tests/test_distributed_cross_entropy.py tests/test_opinfo.py"
for stage in ${*:-tests slow}; do
    stage_banner "$stage"
    case "$stage" in
        tests)
            # shellcheck disable=SC2086
            logged tests 300 25 python3 -m pytest $MODULES -q -p no:cacheprovider -n 16 -m "not slow" --durations=8 -ra \
                ${TEST_ARGS:-} ;;
        slow)
            # shellcheck disable=SC2086
            logged slow 150 8 python3 -m pytest $MODULES -q -p no:cacheprovider -m slow -ra ;;
        sanitize)
            sanitize_stage 300 cross_entropy ;;
        offgrid)
            seed=${OFFGRID_SEED:-$RANDOM}
            echo "random shapes from seed $seed (OFFGRID_SEED)"
            logged offgrid_bf16 170 45 python3 scripts/probes/probe_cross_entropy_off_grid.py --dtype bf16 --graph \
                --random 4 --seed "$seed" --max-gb 0.3
            logged offgrid_fp32 170 45 python3 scripts/probes/probe_cross_entropy_off_grid.py --dtype fp32 --graph \
                --random 4 --seed "$((seed + 1))" --max-gb 0.6 ;;
        bench)
            cp benchmarks/results/h100/cross_entropy.* "$OUT"/
            # shellcheck disable=SC2086
            logged bench 540 40 python3 -m onlinesoftmax bench cross_entropy --merge --out "$OUT" ${BENCH_ARGS:-} ;;
        *) echo "unknown stage $stage"; status=1 ;;
    esac
done
op_done
