"""``onlinesoftmax bench ladder``: the seed work log's kernels (onlinesoftmax.ladder, numba-cuda) on
its (1024, 32768) fp32 matrix next to torch.softmax and onlinesoftmax.softmax, with the log's GTX
1050Ti figures beside them; seed 002's three-kernel design on a 16M-element vector; seed 000's CPU
loops on a smaller matrix.
"""

from __future__ import annotations

import statistics
import time

import torch

from . import harness
from .harness import Case, Implementation, Row

ROW_SHAPE = (1024, 32768)
VECTOR_LENGTH = 16 * 2**20
CPU_SHAPE = (64, 32768)  # the CPU loops take ~10 ms here; the GPU shape would take a second each
# The work log's (seed 003) kernel times on a GTX 1050Ti, ms, and a CUDA C port of the same kernels
# measured on an H100 (issue 6), for the numba steps to be checked against.
LOG_1050TI_MS = {"torch": 7.23, "1": 124.1, "2": 88.1, "3": 6.61, "4": 5.17}
CUDA_C_PORT_H100_MS = {"torch": 0.167, "1": 18.5, "2": 14.3, "3": 0.196, "4": 0.190}


def _matrix_case() -> Case:
    def make(gen):
        return ((torch.randn(ROW_SHAPE, generator=gen) * 2.0).cuda(),)

    return Case(f"{ROW_SHAPE[0]}x{ROW_SHAPE[1]}", torch.float32, "forward", 8 * ROW_SHAPE[0] * ROW_SHAPE[1], make,
                lambda inputs: torch.softmax(inputs[0].double(), -1))


def _vector_case() -> Case:
    def make(gen):
        return ((torch.randn(VECTOR_LENGTH, generator=gen) * 2.0).cuda(),)

    return Case(str(VECTOR_LENGTH), torch.float32, "forward", 8 * VECTOR_LENGTH, make,
                lambda inputs: torch.softmax(inputs[0].double(), -1))


def _step_key(impl: str) -> str:
    return impl.split()[0]


def matrix_implementations(ladder) -> list[Implementation]:
    import onlinesoftmax

    impls = [Implementation("torch", lambda x: torch.softmax(x, -1)),
             Implementation("onlinesoftmax", lambda x: onlinesoftmax.softmax(x, -1))]
    impls += [Implementation(name, fn) for name, fn, _ in ladder.ROW_STEPS]
    # The same block-per-row kernels built with __expf and approximate division: what nvcc's
    # -use_fast_math would give, to tell the exp's cost from the memory's.
    impls += [Implementation(f"{name} fastmath", lambda x, fn=fn: fn(x, fastmath=True))
              for name, fn, _ in ladder.ROW_STEPS[2:]]
    return impls


def vector_implementations(ladder) -> list[Implementation]:
    import onlinesoftmax

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return [
        Implementation("torch", lambda x: torch.softmax(x, -1)),
        Implementation("onlinesoftmax", lambda x: onlinesoftmax.softmax(x, -1)),
        # Seed 002's launch: one block per 256 elements, so 65536 partials for one block to merge.
        Implementation("5 three kernels, seed launch", ladder.softmax_vector_three_kernels),
        # The same kernels with a grid-stride loop over 4 blocks per SM: 528 partials to merge.
        Implementation("5 three kernels, 4 blocks/SM", lambda x: ladder.softmax_vector_three_kernels(
            x, partial_blocks=4 * sms)),
    ]


def cpu_rows(ladder, gen: torch.Generator, repeats: int = 5) -> list[Row]:
    """Seed 000's loops (numba.njit, one core) on CPU_SHAPE: median wall time after a compile call."""
    x = torch.randn(CPU_SHAPE, generator=gen) * 2.0
    ref = torch.softmax(x.double(), -1)
    rows = []
    for name, fn in (("cpu three loops", ladder.softmax_three_loops), ("cpu two loops", ladder.softmax_two_loops)):
        row = Row(f"{CPU_SHAPE[0]}x{CPU_SHAPE[1]} (CPU)", "float32", "forward", name)
        out = fn(x)
        row.rel_error = harness.relative_error(out, ref)
        row.status = "ok" if row.rel_error <= harness.tolerance(torch.float32) else "WRONG"
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(x)
            samples.append((time.perf_counter() - start) * 1e3)
        row.ms = statistics.median(samples)
        row.gbs = harness.gbs(8 * x.numel(), row.ms)
        rows.append(row)
    return rows


def ladder_summary(rows: list[Row], copy_gbs: float) -> list[dict]:
    """The matrix rows in ladder order with step-over-step speedups, next to the log and the CUDA C port."""
    matrix = [r for r in rows if r.case == f"{ROW_SHAPE[0]}x{ROW_SHAPE[1]}" and r.ms]
    out, previous = [], None
    for r in matrix:
        key = "torch" if r.impl == "torch" else _step_key(r.impl)
        is_step = key.isdigit() and not r.impl.endswith("fastmath")
        log_ms = LOG_1050TI_MS.get(key) if (is_step or key == "torch") else None
        port_ms = CUDA_C_PORT_H100_MS.get(key) if (is_step or key == "torch") else None
        entry = {"impl": r.impl, "ms": r.ms, "pct_of_copy": 100 * r.gbs / copy_gbs if copy_gbs else None,
                 "log_1050ti_ms": log_ms, "cuda_c_port_h100_ms": port_ms,
                 "vs_cuda_c_port": (port_ms / r.ms) if port_ms else None}
        if is_step:
            entry["speedup_over_previous_step"] = previous.ms / r.ms if previous else None
            prev_log = LOG_1050TI_MS.get(str(int(key) - 1))
            entry["log_speedup_over_previous_step"] = prev_log / log_ms if prev_log else None
            previous = r
        out.append(entry)
    return out


def summary_markdown(summary: list[dict]) -> str:
    lines = ["Ladder on the work log's 1024x32768 fp32 matrix (ms; step-over-step = previous step's ms / this "
             "step's ms; 'vs port' = CUDA C port ms / numba ms, above 1 means numba is faster):", "",
             "| impl | ms here | step-over-step | % copy | 1050Ti ms (log) | log step-over-step | CUDA C port H100 ms | vs port |",
             "|---|---|---|---|---|---|---|---|"]

    def fmt(value, spec):
        return "" if value is None else format(value, spec)

    for e in summary:
        lines.append(f"| {e['impl']} | {e['ms']:.4f} | {fmt(e.get('speedup_over_previous_step'), '.2f')} | "
                     f"{fmt(e['pct_of_copy'], '.1f')} | {fmt(e['log_1050ti_ms'], '.2f')} | "
                     f"{fmt(e.get('log_speedup_over_previous_step'), '.2f')} | {fmt(e['cuda_c_port_h100_ms'], '.3f')} | "
                     f"{fmt(e['vs_cuda_c_port'], '.2f')} |")
    return "\n".join(lines)


def run(args) -> int:
    """``onlinesoftmax bench ladder``: validate every step against float64, time it, write the results.

    The shapes and dtype are the work log's (fp32 only): --shape and --dtype do not apply."""
    if args.shape:
        print("bench ladder runs the work log's shapes only; --shape is ignored")
    try:
        from onlinesoftmax import ladder
    except ImportError as exc:
        print(exc)
        return 1
    gen = torch.Generator().manual_seed(args.seed)
    print(f"seed {args.seed}; measuring device copy bandwidth ...", flush=True)
    copy_gbs = harness.copy_bandwidth_gbs()
    graph = not args.no_graph
    rows = harness.run_cases("ladder", [_matrix_case()], {"forward": matrix_implementations(ladder)}, gen,
                             graph_timing=graph)
    rows += harness.run_cases("ladder", [_vector_case()], {"forward": vector_implementations(ladder)}, gen,
                              graph_timing=graph)
    harness.finish_rows(rows, copy_gbs)
    rows += cpu_rows(ladder, gen)
    summary = ladder_summary(rows, copy_gbs)
    harness.write_results(args, "ladder", rows, copy_gbs, summary_markdown(summary), {"ladder": summary})
    return harness.exit_code(rows)
