#!/usr/bin/env bash
# The test command (README, CI). On a GPU machine it runs the compiled kernels; with
# TRITON_INTERPRET=1 on a CPU machine, the same kernels through Triton's interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
workers=()
if python -c "import xdist" 2>/dev/null; then
    workers=(-n "${TEST_WORKERS:-auto}")
fi
exec python -m pytest -q -p no:cacheprovider "${workers[@]}" "$@"
