#!/usr/bin/env bash
# The test command (README, CI): bash scripts/test.sh [pytest arguments]
# On a GPU machine the tests run the compiled kernels on CUDA tensors. Without a GPU it sets
# TRITON_INTERPRET=1 (unless already set), so the same Triton kernels run through Triton's
# interpreter on CPU tensors, and says so; anything skipped is listed with its reason at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import pytest" 2>/dev/null; then
    echo "scripts/test.sh: pytest is not installed; run: pip install -e \".[test]\"" >&2
    exit 2
fi
gpu=$(python -c "import torch; print(torch.cuda.is_available())")
if [ "$gpu" != "True" ] && [ -z "${TRITON_INTERPRET:-}" ]; then
    export TRITON_INTERPRET=1
    echo "scripts/test.sh: no CUDA GPU: TRITON_INTERPRET=1, the Triton kernels run through the interpreter on CPU tensors"
fi
workers=()
if python -c "import xdist" 2>/dev/null; then
    # worksteal: a worker that runs out of tests takes pending ones from the other's queue, so a
    # long interpreter test late in one queue does not leave the other core idle.
    workers=(-n "${TEST_WORKERS:-auto}" --dist worksteal)
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
python -m pytest -q -ra -p no:cacheprovider "${workers[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
skipped=$(tail -n 3 "$log" | grep -oE "[0-9]+ skipped" | tail -n 1 | cut -d" " -f1)
if [ -n "$skipped" ] && [ "$skipped" != "0" ]; then
    echo
    echo "!!! ${skipped} tests SKIPPED: each reason is listed in the short test summary above."
    if [ "$gpu" != "True" ] && [ "${TRITON_INTERPRET:-}" = "1" ]; then
        echo "!!! No CUDA GPU: the Triton kernels ran through the interpreter; tests that need a GPU were skipped."
    elif [ "$gpu" != "True" ]; then
        echo "!!! No CUDA GPU and TRITON_INTERPRET=${TRITON_INTERPRET}: the Triton kernels did NOT run."
    fi
fi
exit "$status"
