"""One benchmark harness for every op: timing, L2-cold input rotation, byte counting, correctness
flags, and the outputs (terminal table, JSON, markdown, PNG).

A suite (see :mod:`onlinesoftmax.bench.softmax_suite`) supplies cases (shape, dtype, bytes, a
float64 reference) and implementations (name, callable or the reason it was skipped); the harness
runs every implementation on the same inputs in the same process.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import gc
import itertools
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
from typing import Callable, Optional

import torch

# At least this many bytes of distinct inputs are cycled through, so no timing is L2-resident
# (the H100's L2 is 50 MB).
ROTATION_BYTES = 400 * 10**6
COPY_BYTES = 1 << 30


@dataclasses.dataclass
class Implementation:
    name: str
    fn: Optional[Callable] = None  # called with the case's inputs (a tuple); returns the output
    skipped: str = ""  # why it cannot run here (missing package, unsupported shape, ...)
    # (output, inputs) -> the tensor compared with the case's reference, untimed; None: the output itself
    check: Optional[Callable] = None


@dataclasses.dataclass
class Case:
    label: str  # e.g. "1024x32768"
    dtype: torch.dtype
    direction: str  # "forward" | "backward"
    bytes_moved: int  # fewest bytes: each input read once, each output written once
    make_inputs: Callable[[torch.Generator], tuple]  # fresh random inputs on the device
    reference: Callable[[tuple], torch.Tensor]  # float64 result for one set of inputs
    flops: int = 0  # for compute-bound ops (attention): floating-point operations per call; 0 = not counted
    peak_memory: bool = False  # also record each implementation's peak memory above its inputs (peak_memory_mb)


@dataclasses.dataclass
class Row:
    case: str
    dtype: str
    direction: str
    impl: str
    ms: Optional[float] = None
    gbs: Optional[float] = None
    graph_ms: Optional[float] = None  # the same call replayed from a CUDA graph: no launch overhead
    pct_of_copy: Optional[float] = None
    speedup_vs_torch: Optional[float] = None
    rel_error: Optional[float] = None
    status: str = "ok"  # ok | WRONG | NaN | skipped: ... | error: ...
    tflops: Optional[float] = None  # only for cases that count FLOPs
    run_date: Optional[str] = None  # the date of the run that measured it (set when written)
    peak_mb: Optional[float] = None  # MiB one call allocated at its peak above what existed before it (Case.peak_memory)


def gbs(bytes_moved: int, ms: float) -> float:
    return bytes_moved / (ms * 1e-3) / 1e9


def device_generator(gen: torch.Generator, device) -> torch.Generator:
    """A generator on ``device`` seeded from ``gen`` (the run's seed): inputs drawn where they are
    used. Drawn on the CPU and copied, a gigabyte of logits took seconds a set, and the
    cross-entropy bench makes two sets for each of its three groups of implementations a row."""
    return torch.Generator(device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))


def rotation_count(bytes_per_set: int, rotation_bytes: int = ROTATION_BYTES) -> int:
    """How many input sets to cycle so that at least ``rotation_bytes`` are touched."""
    return max(2, math.ceil(rotation_bytes / max(bytes_per_set, 1)))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over the entries where the reference is finite; NaN if out has NaN there."""
    out, ref = out.double(), ref.double().to(out.device)
    finite = torch.isfinite(ref)
    if torch.isnan(out[finite]).any():
        return float("nan")
    return ((out[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-300)).item()


def tolerance(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}[dtype]


def time_ms(fn: Callable, input_sets: list, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds of ``fn(*inputs)`` over CUDA events, cycling through ``input_sets``."""
    import triton.testing

    cycle = itertools.cycle(input_sets)
    return triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=warmup_ms, rep=rep_ms, return_mode="median")


def back_to_back_ms(fn: Callable, input_sets: list, min_ms: float = 20.0, repeats: int = 5) -> float:
    """Median milliseconds per call of ``fn`` called back to back over ``input_sets``, between two
    CUDA events: what a loop of eager calls costs, the host's time per call included wherever it
    exceeds the GPU's (do_bench flushes the L2 before each call, and that flush hides the host).
    Python's garbage collector is held off while it times (see garbage_collector_held_off)."""
    with garbage_collector_held_off():
        for inputs in input_sets[:3]:
            fn(*inputs)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls = len(input_sets)
        start.record()
        for i in range(calls):
            fn(*input_sets[i])
        end.record()
        end.synchronize()
        calls = max(calls, int(calls * min_ms / max(start.elapsed_time(end), 1e-3)))
        samples = []
        for _ in range(repeats):
            start.record()
            for i in range(calls):
                fn(*input_sets[i % len(input_sets)])
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        return statistics.median(samples)


@contextlib.contextmanager
def garbage_collector_held_off():
    """Python's garbage collector off (after one collection) for the block: in a timed loop a
    collection lands on whichever call happens to be running."""
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def graph_time_ms(fn: Callable, input_sets: list, replays: int = 10) -> Optional[float]:
    """Median milliseconds per call of ``fn`` replayed from a CUDA graph (None if it cannot be captured).

    Decode loops in serving engines run under CUDA graphs, so this is the time such a user sees;
    the eager time adds the host's launch overhead. The graph holds one call per input set, so a
    replay cycles through all of them (at least ROTATION_BYTES): a call never finds its input in L2
    from the call before (triton.testing.do_bench_cudagraph repeats one input and would).
    """
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for inputs in input_sets[:2]:  # warm up: compile, allocate, outside the capture
                fn(*inputs)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for inputs in input_sets:
                    fn(*inputs)
            graph.replay()  # the first replay uploads the graph
            stream.synchronize()
            times = []
            for _ in range(replays):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                graph.replay()
                end.record(stream)
                end.synchronize()
                times.append(start.elapsed_time(end) / len(input_sets))
        torch.cuda.current_stream().wait_stream(stream)
        return statistics.median(times)
    except Exception:  # peers that synchronize or allocate in ways capture forbids
        torch.cuda.synchronize()
        return None


def peak_memory_mb(fn: Callable, inputs: tuple) -> float:
    """MiB that one untimed call of ``fn`` allocates at its peak above what was allocated before it
    (outputs and gradients it returns included; the inputs not)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*inputs)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak / 2**20


def plan_tables(assignments: list) -> dict:
    """{NAME: value} from "NAME=VALUE" strings whose values are Python literals: the tuning scripts'
    and probes' plan tables for override_plan."""
    return {name: ast.literal_eval(value) for name, value in (item.split("=", 1) for item in assignments)}


def copy_bandwidth_gbs(device="cuda", nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy, counting bytes read plus bytes written: the practical ceiling."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda s: dst.copy_(s), [(src,)])
    return gbs(2 * nbytes, ms)


def environment(command: str) -> dict:
    import triton

    env = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, sm_count=props.multi_processor_count,
                   memory_gb=round(props.total_memory / 2**30, 1))
        try:
            import subprocess
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=10).stdout.strip()
            env["driver"] = env["driver"].splitlines()[0] if env["driver"] else "unknown"  # a line a GPU
        except (OSError, subprocess.SubprocessError):
            env["driver"] = "unknown"
    else:
        env.update(device=f"CPU ({platform.processor() or platform.machine()})")
    return env


# ``bench --impls``: the implementations to run (None: all); see select_implementations.
SELECTED_IMPLS: Optional[frozenset] = None


def select_implementations(names: Optional[str]) -> None:
    """Run only the implementations named (comma-separated, as they appear in the results' impl
    column); the suites' other implementations are left out of the run, not reported as skipped,
    so that ``--merge`` keeps their rows from the results file."""
    global SELECTED_IMPLS
    SELECTED_IMPLS = frozenset(n.strip() for n in names.split(",") if n.strip()) if names else None


def run_case(case: Case, impls: list[Implementation], gen: torch.Generator, timed: bool = True,
             rotation_bytes: int = ROTATION_BYTES, progress: Callable[[str], None] = lambda s: None,
             graph_timing: bool = False, max_input_sets: Optional[int] = None, warmup_ms: int = 25,
             rep_ms: int = 100, back_to_back: bool = False, second_pass: bool = False) -> list[Row]:
    """Check every implementation against float64 on the first input set, then time it.

    ``max_input_sets`` caps the rotation (sweeps of many small cells: those stay in L2, as in use);
    ``back_to_back`` times eager calls in a loop (host included) instead of do_bench's flushed calls;
    ``second_pass`` times them again in the reverse order and keeps each one's faster time (eager
    calls of a few µs, the host's time, measured up to 2x apart from one run to the next)."""
    if SELECTED_IMPLS is not None:
        impls = [impl for impl in impls if impl.name in SELECTED_IMPLS]
        if not impls:
            return []
    sets = rotation_count(case.bytes_moved, rotation_bytes) if timed else 1
    if max_input_sets:
        sets = min(sets, max_input_sets)
    input_sets = [case.make_inputs(gen) for _ in range(sets)]
    ref = case.reference(input_sets[0])
    rows = []
    for impl in impls:
        progress(f"{case.direction} {case.label} {str(case.dtype)[6:]} {impl.name}")
        row = Row(case.label, str(case.dtype).replace("torch.", ""), case.direction, impl.name)
        rows.append(row)
        if impl.fn is None:
            row.status = f"skipped: {impl.skipped}"
            continue
        try:
            out = impl.fn(*input_sets[0])
            row.rel_error = relative_error(impl.check(out, input_sets[0]) if impl.check else out, ref)
            if math.isnan(row.rel_error):
                row.status = "NaN"
            elif row.rel_error > tolerance(case.dtype):
                row.status = "WRONG"
            del out
            if timed and case.peak_memory and torch.cuda.is_available():
                row.peak_mb = peak_memory_mb(impl.fn, input_sets[0])
            if timed:
                row.ms = (back_to_back_ms(impl.fn, input_sets) if back_to_back
                          else time_ms(impl.fn, input_sets, warmup_ms, rep_ms))
                row.gbs = gbs(case.bytes_moved, row.ms)
                if case.flops:
                    row.tflops = case.flops / (row.ms * 1e-3) / 1e12
                if graph_timing:
                    row.graph_ms = graph_time_ms(impl.fn, input_sets)
        except Exception as exc:  # a peer failing on a shape is a result to report, not a crash
            row.status = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    if timed and back_to_back and second_pass:
        for impl, row in reversed(list(zip(impls, rows))):
            if row.ms and row.status == "ok":
                row.ms = min(row.ms, back_to_back_ms(impl.fn, input_sets))
                row.gbs = gbs(case.bytes_moved, row.ms)
                if case.flops:
                    row.tflops = case.flops / (row.ms * 1e-3) / 1e12
    del input_sets, ref
    return rows


def report_case(label: str, measured: list) -> None:
    """One line a case as it finishes: a run cut short (a time-limited machine) still leaves in its
    log what it measured, where the results files are written only at the end."""
    print(f"{label}: " + ", ".join(f"{r.impl} {r.ms:.4f} ms" if r.ms else f"{r.impl} {r.status}" for r in measured),
          flush=True)


def finish_rows(rows: list[Row], copy_gbs: Optional[float]) -> None:
    """Fill % of copy bandwidth and speedup vs torch eager (the 'torch' row of the same case)."""
    for r in rows:
        if r.gbs and copy_gbs:
            r.pct_of_copy = 100.0 * r.gbs / copy_gbs
    _speedups_vs_torch(rows)


def _speedups_vs_torch(rows: list[Row]) -> None:
    torch_ms = {(r.case, r.dtype, r.direction): r.ms for r in rows if r.impl == "torch" and r.ms}
    for r in rows:
        base = torch_ms.get((r.case, r.dtype, r.direction))
        r.speedup_vs_torch = base / r.ms if r.ms and base else None


def _fmt(value, spec):
    return "" if value is None else format(value, spec)


TABLE_COLUMNS = ("direction", "dtype", "case", "impl", "ms", "GB/s", "% copy", "vs torch", "graph ms",
                 "rel err", "status")


def _counts_flops(rows: list[Row]) -> bool:
    return any(r.tflops is not None for r in rows)


def _counts_memory(rows: list[Row]) -> bool:
    return any(r.peak_mb is not None for r in rows)


def table_columns(rows: list[Row]) -> tuple:
    """TABLE_COLUMNS, with a TFLOP/s column after GB/s when the suite counts FLOPs and a peak MB
    column before the status when it measures memory."""
    columns = TABLE_COLUMNS
    if _counts_flops(rows):
        at = columns.index("GB/s") + 1
        columns = columns[:at] + ("TFLOP/s",) + columns[at:]
    if _counts_memory(rows):
        columns = columns[:-1] + ("peak MB",) + columns[-1:]
    return columns


def table_rows(rows: list[Row]) -> list[tuple]:
    flops, memory = _counts_flops(rows), _counts_memory(rows)
    return [(r.direction, r.dtype, r.case, r.impl, _fmt(r.ms, ".4f"), _fmt(r.gbs, ".0f"))
            + ((_fmt(r.tflops, ".1f"),) if flops else ())
            + (_fmt(r.pct_of_copy, ".1f"), _fmt(r.speedup_vs_torch, ".2f") + ("x" if r.speedup_vs_torch else ""),
               _fmt(r.graph_ms, ".4f"), _fmt(r.rel_error, ".1e"))
            + ((_fmt(r.peak_mb, ".0f"),) if memory else ()) + (r.status,)
            for r in rows]


def markdown(rows: list[Row], env: dict, copy_gbs: Optional[float], notes: str = "") -> str:
    lines = [f"Command: `{env['command']}`", "",
             f"Device: {env.get('device')} (driver {env.get('driver', 'n/a')}), torch {env['torch']}, "
             f"triton {env['triton']}, CUDA {env.get('cuda')}, {env['date']}.", ""]
    if copy_gbs:
        lines += [f"Device copy bandwidth measured in this run: {copy_gbs:.0f} GB/s (bytes read + written).", ""]
    if notes:
        lines += [notes, ""]
    columns = table_columns(rows)
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    return "\n".join(lines) + "\n"


def write_json(path, rows: list[Row], env: dict, copy_gbs: Optional[float], extra: Optional[dict] = None) -> None:
    payload = {"environment": env, "copy_gbs": copy_gbs, "rows": [dataclasses.asdict(r) for r in rows]}
    payload.update(extra or {})
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


def plot(path, rows: list[Row], copy_gbs: Optional[float], title: str) -> None:
    """GB/s (TFLOP/s for suites that count FLOPs) per case and implementation: one panel per (direction, dtype)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r.direction, r.dtype) for r in rows}, key=lambda p: (p[0] != "forward", p[1]))
    flops = _counts_flops(rows)
    # Implementations with no measured row (a peer not installed) get no bar slot; the colours stay
    # one per implementation across panels. Labels longer than a bar group's width are slanted.
    colours = {impl: f"C{i}" for i, impl in enumerate(dict.fromkeys(r.impl for r in rows))}
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 3.6 * len(panels)), squeeze=False)
    for ax, (direction, dtype) in zip(axes[:, 0], panels):
        sel = [r for r in rows if r.direction == direction and r.dtype == dtype]
        cases = list(dict.fromkeys(r.case for r in sel))
        impls = list(dict.fromkeys(r.impl for r in sel if r.status == "ok"))
        width = 0.8 / max(len(impls), 1)
        for i, impl in enumerate(impls):
            values = [next(((r.tflops if flops else r.gbs) or 0 for r in sel
                            if r.case == c and r.impl == impl and r.status == "ok"), 0)
                      for c in cases]
            ax.bar([j + i * width for j in range(len(cases))], values, width, label=impl, color=colours[impl])
        if copy_gbs and not flops:
            ax.axhline(copy_gbs, color="black", linestyle="--", linewidth=1, label=f"copy {copy_gbs:.0f} GB/s")
        slanted = max(map(len, cases), default=0) * len(cases) > 150
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, fontsize=8,
                      rotation=25 if slanted else 0, ha="right" if slanted else "center")
        ax.set_ylabel("TFLOP/s" if flops else "GB/s")
        ax.set_title(f"{title}: {direction}, {dtype}")
    axes[0, 0].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SHORT_NAMES = {"forward": "fwd", "backward": "bwd", "forward+backward": "fwd+bwd", "float32": "fp32",
               "bfloat16": "bf16", "float16": "fp16", "direction": "dir", "% copy": "%copy",
               "vs torch": "xtorch", "graph ms": "graph", "rel err": "err", "TFLOP/s": "TFLOPs"}


def print_table(rows: list[Row], title: str) -> None:
    """The rows as a table that stays readable in 100 columns: skipped implementations are named
    in one line each above it instead of taking rows (and width) of their own."""
    skipped = dict.fromkeys((r.impl, r.status[len("skipped: "):]) for r in rows if r.status.startswith("skipped"))
    for impl, reason in skipped:
        print(f"skipped {impl}: {reason}")
    rows = [r for r in rows if not r.status.startswith("skipped")]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is in the [bench] extra; plain text still says everything
        print(title)
        for cells in [table_columns(rows)] + table_rows(rows):
            print("  ".join(f"{c:>10s}" for c in cells))
        return
    from rich import box

    # No vertical rules, short names, no empty columns (graph times not taken, no torch row):
    # the table fits 100 characters; case and impl keep their width and the rest gives.
    columns, cells = table_columns(rows), table_rows(rows)
    keep = [i for i, col in enumerate(columns) if col in ("case", "impl", "status") or any(c[i] for c in cells)]
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1), pad_edge=False,
                  collapse_padding=True)
    for i in keep:
        col = columns[i]
        text = col in ("impl", "status", "case")  # may wrap; numbers and short names may not
        widest = max([len(c[i]) for c in cells] + [1])
        table.add_column(SHORT_NAMES.get(col, col), justify="left" if text else "right", no_wrap=not text,
                         overflow="fold", min_width=min(widest, 18) if col in ("case", "impl") else None)
    for row_cells, r in zip(cells, rows):
        style = "red" if r.status in ("WRONG", "NaN") or r.status.startswith("error") else None
        table.add_row(*(SHORT_NAMES.get(row_cells[i], row_cells[i]) for i in keep), style=style)
    Console(width=max(100, shutil.get_terminal_size((100, 24)).columns)).print(table)


def half_dtypes(args, what: str) -> list[torch.dtype]:
    """``--dtype`` for the suites of ops that run in fp16 and bf16 only (default bf16); names
    other dtypes that were asked for and are left out."""
    names = {"bf16": torch.bfloat16, "fp16": torch.float16}
    asked = (args.dtype or "bf16").split(",")
    dropped = [d for d in asked if d not in names]
    if dropped:
        print(f"{what} runs in fp16 and bf16; not benchmarking {', '.join(dropped)}")
    return [names[d] for d in asked if d in names] or [torch.bfloat16]


def directions(args, forward: str, backward: str) -> list[str]:
    """The directions a suite times: both, or one of them under ``--no-backward`` / ``--no-forward``."""
    return ([] if getattr(args, "no_forward", False) else [forward]) + ([] if args.no_backward else [backward])


def until_deadline(items: list, deadline_s: Optional[float], clock: Callable[[], float] = time.monotonic):
    """``items`` one by one until ``deadline_s`` seconds (None: no limit) have passed since the first
    was handed out; then says how many were left. A sweep run with ``--deadline`` a little under
    a time-limited machine's limit still writes its results for the cases it measured."""
    start = clock()
    for i, item in enumerate(items):
        if deadline_s is not None and clock() - start > deadline_s:
            print(f"past the --deadline of {deadline_s:g} s: {len(items) - i} of {len(items)} cases not measured",
                  flush=True)
            return
        yield item


def _progress_bar():
    try:
        from rich.progress import Progress
    except ImportError:  # rich is in the [bench] extra: without it, progress goes to stdout as lines
        return None
    return Progress(transient=True)


def run_cases(suite: str, cases: list[Case], impls: dict[str, list[Implementation]], gen: torch.Generator,
              graph_timing: bool = False) -> list[Row]:
    """Run every case against the implementations of its direction, with a progress bar."""
    rows: list[Row] = []
    progress = _progress_bar()
    if progress is None:
        for case in cases:
            rows += run_case(case, impls[case.direction], gen, graph_timing=graph_timing,
                             progress=lambda s: print(s, flush=True))
        return rows
    with progress:
        task = progress.add_task(f"bench {suite}", total=len(cases))
        for case in cases:
            rows += run_case(case, impls[case.direction], gen, graph_timing=graph_timing,
                             progress=lambda s: progress.update(task, description=s))
            progress.advance(task)
    return rows


def device_slug(name: str) -> str:
    """A results folder name for a device: ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``."""
    import re

    lowered = name.lower()
    known = re.search(r"\b(gb200|b200|h200|h100|h800|a100|a800|a10g?|l40s?|l4|v100|t4|rtx ?\d{4})\b", lowered)
    if known:
        return known.group(1).replace(" ", "")
    return re.sub(r"[^a-z0-9]+", "-", lowered).strip("-") or "device"


def results_dir(args) -> str:
    """``--out``, else ``benchmarks/results/<device>`` for the device this run measures."""
    if getattr(args, "out", None):
        return args.out
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return os.path.join("benchmarks", "results", device_slug(name))


def _stem(args, suite: str) -> str:
    return os.path.join(results_dir(args), suite)


def merge_with_previous(args, suite: str, rows: list[Row]) -> tuple[list[Row], list[dict]]:
    """With ``--merge``: this run's rows after the rows of the results already at the output path
    that this run did not measure (by direction, dtype, case and implementation: ``--impls`` runs
    some implementations and keeps the others' rows), ordered forward first, then by dtype and case
    as they first appear; and the records (command, date, copy bandwidth) of the earlier runs whose
    rows remain. Lets one grid be measured in several calls of a time-limited machine. Rows keep the
    figures of their own run (% of copy is against that run's copy)."""
    path = _stem(args, suite) + ".json"
    if not getattr(args, "merge", False) or not os.path.exists(path):
        return rows, []
    with open(path) as f:
        previous = json.load(f)
    measured = {(r.direction, r.dtype, r.case, r.impl) for r in rows}
    env = previous["environment"]
    kept = [Row(**r) for r in previous["rows"] if (r["direction"], r["dtype"], r["case"], r["impl"]) not in measured]
    runs = previous.get("earlier_runs", []) + [
        {"command": env["command"], "date": env["date"], "copy_gbs": previous.get("copy_gbs")}]
    if all(r.run_date for r in kept):  # (files written before rows carried their run keep every record)
        runs = [run for run in runs if run["date"] in {r.run_date for r in kept}]
    merged = kept + rows
    dtypes = list(dict.fromkeys(r.dtype for r in merged))
    cases = list(dict.fromkeys(r.case for r in merged))
    merged.sort(key=lambda r: (r.direction != "forward", dtypes.index(r.dtype), cases.index(r.case)))
    _speedups_vs_torch(merged)  # against the torch row now beside each (% of copy stays its run's)
    return merged, runs


def write_results(args, suite: str, rows: list[Row], copy_gbs: Optional[float], notes: str = "",
                  extra: Optional[dict] = None, earlier_runs: Optional[list] = None, table: bool = True,
                  bars: bool = True) -> str:
    """Print the table and write the results; returns the path stem.

    Every suite writes ``{results_dir}/{suite}.json|md|png`` (``benchmarks/results/h100/softmax.*``).
    """
    env = environment("onlinesoftmax " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    if table:
        print_table(rows, f"{suite} on {env['device']}" + (f" (copy {copy_gbs:.0f} GB/s)" if copy_gbs else ""))
    stem = _stem(args, suite)
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    for row in rows:
        row.run_date = row.run_date or env["date"]
    if earlier_runs:
        extra = dict(extra or {}, earlier_runs=earlier_runs)
        merged = "; ".join(f"`{run['command']}` ({run['date']}, copy {run['copy_gbs']:.0f} GB/s)"
                           if run.get("copy_gbs") else f"`{run['command']}` ({run['date']})" for run in earlier_runs)
        notes = f"Rows of cases this run did not measure come from earlier runs (--merge): {merged}." \
            + (f"\n\n{notes}" if notes else "")
    write_json(stem + ".json", rows, env, copy_gbs, {"seed": args.seed, **(extra or {})})
    with open(stem + ".md", "w") as f:
        f.write(f"# {suite} benchmark: {env['device']}\n\n" + markdown(rows, env, copy_gbs, notes))
    if bars:
        plot(stem + ".png", rows, copy_gbs, suite)
    if notes:
        print(notes)
    print(f"wrote {stem}.json, {stem}.md" + (f", {stem}.png" if bars else ""))
    return stem


def exit_code(rows: list[Row], ours: str = "onlinesoftmax") -> int:
    """1 when a row of ours is wrong, NaN or failed; else 0 (the exit-code rule of every suite)."""
    bad = [r for r in rows if r.impl.startswith(ours) and (r.status in ("WRONG", "NaN") or r.status.startswith("error"))]
    for r in bad:
        print(f"FAILED: {r.direction} {r.case} {r.dtype} {r.impl}: {r.status}")
    return 1 if bad else 0


def heat_maps(path: str, panels: list, title: str = "") -> Optional[str]:
    """One PNG of side-by-side heat maps, each ``(title, row_labels, col_labels, values)`` with
    ``values[(row, col)]`` a speedup (ours over a peer), coloured around 1.0 and printed per cell.
    Panels without cells (a run cut by --deadline before an op or peer was measured) are left out;
    with none left, no file is written and None is returned."""
    panels = [panel for panel in panels if panel[1] and panel[2]]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.0, 0.6 * max(len(p[2]) for p in panels) + 3) * len(panels),
                                                      max(4.0, 0.35 * max(len(p[1]) for p in panels) + 2)),
                             squeeze=False)
    for ax, (panel_title, row_labels, col_labels, values) in zip(axes[0], panels):
        grid = [[values.get((r, c), float("nan")) for c in col_labels] for r in row_labels]
        image = ax.imshow(grid, cmap="RdYlGn", norm=TwoSlopeNorm(1.0, 0.25, 4.0), aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(col_labels)), [str(c) for c in col_labels], rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(row_labels)), [str(r) for r in row_labels], fontsize=7)
        ax.set_title(panel_title, fontsize=9)
        fig.colorbar(image, ax=ax)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

