# Sourced by the gpu_OP.sh stage scripts: their set-up and the stages they share. Each stage writes
# its log as $OUT/${OP}_NAME.log, prints its tail, and sets status=1 if it fails or runs out of time.
#   source scripts/device/stages.sh; op_setup OP OUTDIR
#   for stage in $STAGES; do stage_banner "$stage"; case ... esac; done; op_done

op_setup() {  # OP OUTDIR: the results folder, the package importable from src/, status 0
    OP=$1 OUT=$2
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "import onlinesoftmax" 2>/dev/null || python3 -m pip install -q -e . --no-deps --no-build-isolation
    status=0
}

stage_banner() { echo "=== $OP $1 ($(date +%T)) ==="; }

logged() {  # NAME LIMIT_S TAIL_LINES COMMAND...: COMMAND into $OUT/${OP}_NAME.log
    local name=$1 limit=$2 lines=$3
    shift 3
    timeout "$limit" "$@" > "$OUT/${OP}_$name.log" 2>&1 || status=1
    tail -"$lines" "$OUT/${OP}_$name.log"
}

sanitize_stage() {  # LIMIT_S FILTER [compute-sanitizer options]: memcheck, then racecheck, over the
    # sanitizer exercises whose names match FILTER (tests/test_sanitizer_exercises.py -k FILTER)
    local limit=$1 filter=$2 tool rc
    shift 2
    for tool in memcheck racecheck; do
        timeout "$limit" compute-sanitizer --tool $tool "$@" --error-exitcode 9 \
            python3 -m pytest -q -p no:cacheprovider -m sanitizer tests/test_sanitizer_exercises.py -k "$filter" \
            > "$OUT/${OP}_sanitizer_$tool.log" 2>&1
        rc=$?
        [ $rc -eq 0 ] || status=1
        echo "compute-sanitizer $tool exit $rc"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/${OP}_sanitizer_$tool.log" | tail -6
    done
}

op_done() {
    echo "=== done ($(date +%T)), status $status ==="
    exit $status
}
