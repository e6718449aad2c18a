"""``onlinesoftmax bench sweep``: softmax and log_softmax over a broad grid of shapes (and, with
``--random N``, N seeded random shapes), forward and backward, ours against torch eager and
torch.compile, in eager timings (what a user's call costs, host included) and CUDA-graph replays.

The grid is not the bench's: rows from 1 to 16384, row lengths under 1000 to over 1M, with odd,
prime and "vocabulary + a few" lengths (4097, 32001, 50257, 65537, 100003, 128257, 151937, 262147),
so that no fixed list can be tuned to. Eager timings are calls back to back (a loop of eager
calls between two CUDA events: the host's time included wherever it exceeds the GPU's); the
backward is timed as users get it, autograd's backward of the op's output (``torch.autograd.grad``).

Writes ``sweep.json`` (every cell), ``sweep.md`` (the summary, worst cells first) and one heat map
a dtype and direction (``sweep-<dtype>-<direction>.png``: ours over torch eager per cell, colour
centred on 1.0).
"""

from __future__ import annotations

import math
import random

import torch

from . import harness
from .harness import Case, Implementation
from .shapes import sweep_shapes_asked

ROWS = (1, 4, 32, 256, 2048, 16384)
COLS = (1000, 4097, 32001, 50257, 65537, 100003, 128257, 151937, 262147, 1048579)
QUICK_ROWS = (1, 32, 2048)
QUICK_COLS = (1000, 50257, 128257, 262147)
# Cells past this many elements are left out (time and memory: 2**27 bf16 elements are 256 MB).
MAX_ELEMENTS = 2 ** 27
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPS = ("softmax", "log_softmax")
# Distinct input sets cycled per cell: at most this many (tiny inputs stay in L2, as they do in use).
MAX_INPUT_SETS = 16


def random_shapes(n: int, seed: int) -> list[tuple[int, int]]:
    """N seeded shapes: rows and lengths log-uniform (every scale as likely as any other), at most
    MAX_ELEMENTS each."""
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < n:
        r = int(math.exp(rng.uniform(0, math.log(16384))))
        c = int(math.exp(rng.uniform(math.log(100), math.log(2 ** 20))))
        if r * c <= MAX_ELEMENTS:
            shapes.append((r, c))
    return shapes


def grid(quick: bool, n_random: int, seed: int) -> list[tuple[int, int]]:
    rows, cols = (QUICK_ROWS, QUICK_COLS) if quick else (ROWS, COLS)
    return [(r, c) for r in rows for c in cols if r * c <= MAX_ELEMENTS] + random_shapes(n_random, seed)


def _case(op: str, direction: str, shape, dtype) -> Case:
    rows, cols = shape
    ref_fn = torch.log_softmax if op == "log_softmax" else torch.softmax

    def make(gen):
        drawn = harness.device_generator(gen, "cuda")
        x = (torch.randn(shape, generator=drawn, device="cuda") * 2.0).to(dtype)
        if direction == "forward":
            return (x,)
        dy = torch.randn(shape, generator=drawn, device="cuda").to(dtype)
        return (x.requires_grad_(), dy)

    def reference(inputs):
        x = inputs[0].detach().double().requires_grad_(direction == "backward")
        y = ref_fn(x, -1)
        if direction == "forward":
            return y
        return torch.autograd.grad(y, x, inputs[1].double())[0]

    elem = dtype.itemsize
    moved = rows * cols * elem * (2 if direction == "forward" else 3)
    return Case(f"{op} {rows}x{cols}", dtype, direction, moved, make, reference)


def _implementations(op: str, direction: str, graphs: dict) -> list[Implementation]:
    """The peers of one (op, direction); ``graphs`` holds the backward's outputs and autograd graphs
    for the case being timed (the caller empties it between cases: each graph holds its inputs)."""
    import onlinesoftmax
    from .softmax_suite import _compiled

    ours = onlinesoftmax.log_softmax if op == "log_softmax" else onlinesoftmax.softmax
    theirs = torch.log_softmax if op == "log_softmax" else torch.softmax
    compiled = _compiled(lambda x: theirs(x, -1))
    if direction == "forward":
        return [Implementation("torch", lambda x: theirs(x, -1)),
                Implementation("torch.compile", compiled),
                Implementation("onlinesoftmax", lambda x: ours(x, -1))]

    def backward_of(fn, name):
        # The output and its graph are made once per input set, untimed; each timed call is
        # autograd's backward of it, as a training step runs it.
        def call(x, dy):
            key = (name, x.data_ptr())
            if key not in graphs:
                graphs[key] = fn(x)
            return torch.autograd.grad(graphs[key], x, dy, retain_graph=True)[0]
        return call

    return [Implementation("torch", backward_of(lambda x: theirs(x, -1), "torch")),
            Implementation("torch.compile", backward_of(compiled, "compile")),
            Implementation("onlinesoftmax", backward_of(lambda x: ours(x, -1), "ours"))]


def _ratios(rows: list[harness.Row]) -> list[dict]:
    """Per cell: ours against torch eager and torch.compile, eager and under graphs."""
    cells = {}
    for r in rows:
        cells.setdefault((r.direction, r.dtype, r.case), {})[r.impl] = r
    out = []
    for (direction, dtype, case), impls in cells.items():
        ours, eager, comp = impls.get("onlinesoftmax"), impls.get("torch"), impls.get("torch.compile")
        if not (ours and ours.ms and eager and eager.ms):
            continue
        op, shape = case.split(" ")
        cell = dict(direction=direction, dtype=dtype, op=op, shape=shape, ours_ms=ours.ms, torch_ms=eager.ms,
                    vs_torch=eager.ms / ours.ms, status=ours.status,
                    vs_compile=comp.ms / ours.ms if comp and comp.ms else None,
                    graph_vs_torch=(eager.graph_ms / ours.graph_ms) if eager.graph_ms and ours.graph_ms else None,
                    ours_gbs=ours.gbs)
        out.append(cell)
    return out


def _geomean(values) -> float:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary_markdown(cells: list[dict]) -> str:
    lines = []
    for direction in ("forward", "backward"):
        sel = [c for c in cells if c["direction"] == direction]
        if not sel:
            continue
        below = [c for c in sel if c["vs_torch"] < 1.0]
        below_compile = [c for c in sel if c["vs_compile"] is not None and c["vs_compile"] < 0.9]
        graph = _geomean(c['graph_vs_torch'] for c in sel)
        graph_text = (f"{graph:.2f}x torch under CUDA graphs" if graph == graph else
                      "no CUDA-graph timings" + (" (autograd's backward is timed eagerly only)"
                                                 if direction == "backward" else ""))
        compiled = _geomean(c['vs_compile'] for c in sel)
        # (--impls without torch.compile: no column to average or count against)
        compile_text, below_compile_text = (
            (f"{compiled:.2f}x torch.compile", f", {len(below_compile)} below 0.9x torch.compile")
            if compiled == compiled else ("torch.compile not run", ""))
        lines.append(f"- {direction}: {len(sel)} cells; geometric mean {_geomean(c['vs_torch'] for c in sel):.2f}x "
                     f"torch eager, {compile_text}, {graph_text}; "
                     f"{len(below)} cells below 1.0x torch eager{below_compile_text}")
    lines += ["", "Worst cells first (eager, ours over torch eager):", "",
              "| direction | dtype | op | shape | ours ms | torch ms | vs torch | vs compile | graph vs torch | status |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: c["vs_torch"])[:40]:
        lines.append(f"| {c['direction']} | {c['dtype']} | {c['op']} | {c['shape']} | {c['ours_ms']:.4f} | "
                     f"{c['torch_ms']:.4f} | {c['vs_torch']:.2f}x | "
                     + (f"{c['vs_compile']:.2f}x" if c["vs_compile"] else "-") + " | "
                     + (f"{c['graph_vs_torch']:.2f}x" if c["graph_vs_torch"] else "-") + f" | {c['status']} |")
    return "\n".join(lines)


def heat_maps(stem: str, cells: list[dict]) -> list[str]:
    """One PNG a dtype and direction: rows x row length, ours over torch eager, softmax and log_softmax side by side."""
    paths = []
    for dtype in dict.fromkeys(c["dtype"] for c in cells):
        for direction in ("forward", "backward"):
            sel = [c for c in cells if c["dtype"] == dtype and c["direction"] == direction]
            if not sel:
                continue
            panels = []
            for op in OPS:
                mine = {tuple(int(v) for v in c["shape"].split("x")): c["vs_torch"] for c in sel if c["op"] == op}
                rows = sorted({r for r, _ in mine})
                cols = sorted({k for _, k in mine})
                panels.append((f"{op} {direction} {dtype}: speedup over torch eager (rows x row length)",
                               rows, cols, mine))
            path = harness.heat_maps(f"{stem}-{dtype}-{direction}.png", panels)
            if path:
                paths.append(path)
    return paths


def run(args) -> int:
    dtypes = [DTYPES[d] for d in (args.dtype or "fp32,bf16,fp16").split(",")]
    shapes = sweep_shapes_asked(args, 2, random_shapes, grid)
    directions = harness.directions(args, "forward", "backward")
    gen = torch.Generator().manual_seed(args.seed)
    print(f"seed {args.seed}; {len(shapes)} shapes x {len(dtypes)} dtypes x {len(OPS)} ops x {len(directions)} "
          "directions; measuring device copy bandwidth ...", flush=True)
    copy_gbs = harness.copy_bandwidth_gbs()
    rows: list[harness.Row] = []
    graphs: dict = {}
    impls = {(op, d): _implementations(op, d, graphs) for op in OPS for d in directions}
    todo = [(direction, dtype, op, shape) for direction in directions for dtype in dtypes for op in OPS
            for shape in shapes]
    for direction, dtype, op, shape in harness.until_deadline(todo, getattr(args, "deadline", None)):
        case = _case(op, direction, shape, dtype)
        # autograd's backward is not captured into a CUDA graph (every implementation's attempt
        # failed, between one implementation's eager timing and the next's): the backward is timed
        # eagerly only.
        rows += harness.run_case(case, impls[op, direction], gen,
                                 graph_timing=not args.no_graph and direction == "forward",
                                 max_input_sets=MAX_INPUT_SETS, back_to_back=True, second_pass=True)
        graphs.clear()  # kept across cases, they held every earlier case's inputs (a full sweep ran out of memory)
        if shape == shapes[-1]:
            print(f"{direction} {dtype} {op}: {len(shapes)} shapes done", flush=True)
    harness.finish_rows(rows, copy_gbs)
    write(args, rows, copy_gbs)
    return harness.exit_code(rows)


def write(args, rows: list[harness.Row], copy_gbs) -> str:
    """Write this run's cells (with ``--merge``, beside the earlier runs' cells it did not measure:
    a full sweep takes longer than one call of a time-limited machine) and the heat maps."""
    rows, earlier_runs = harness.merge_with_previous(args, "sweep", rows)
    cells = _ratios(rows)
    shapes = [list(shape) for shape in dict.fromkeys(tuple(int(v) for v in c["shape"].split("x")) for c in cells)]
    stem = harness.write_results(args, "sweep", rows, copy_gbs, summary_markdown(cells),
                                 {"cells": cells, "shapes": shapes}, earlier_runs, table=False, bars=False)
    for path in heat_maps(stem, cells):
        print(f"wrote {path}")
    return stem
