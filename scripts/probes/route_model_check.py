"""The eager route's model of torch's forward kernel against torch's own times in committed sweeps (CPU).

The eager route (ops/softmax/eager_route.py) sends an eager forward to torch's own kernel where its
model of that kernel says under plan.EAGER_HOST_US (our host time a call). A model that says less
than torch takes sends calls our kernels would win to torch (level with torch); one that says more
sends calls torch would win to ours. This reads the sweeps' torch rows (CUDA-graph replays: the
kernel's own time), plans each cell for a GPU of ``--sms`` SMs, and prints the model beside torch,
with the cells on the wrong side of the route's line.

    python scripts/probes/route_model_check.py [--results benchmarks/results/h200] [--sms 132] [--margin 2]
        [--long-row-gbs softmax=1200,log_softmax=2000] [--by-route] [--fit]

``--by-route``: instead, ours over torch in the sweeps' eager timings, cell by cell, summed up by
which kernel the route runs (torch's own: both columns time the same kernel and, in the backward,
the same autograd node; ours) and by direction: what the route's lookup costs, and how far apart
two timings of one computation land on that machine.

``--fit``: instead, the misjudged cells under each set of the model's constants of a grid (FIT_GRID).

``--margin`` (µs): a cell counts as misjudged when torch's time is that far past the line on the
other side from the model's. ``--long-row-gbs``: a long-row streaming rate by op in place of
plan.TORCH_LONG_ROW_GBS (a model by op, tried without changing the route).
"""

import argparse
import glob
import itertools
import json
import math
import os

import torch

import onlinesoftmax
from onlinesoftmax.ops.softmax import eager_route, plan
from onlinesoftmax.ops.softmax import launch as softmax_launch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_forward_cells(results: str) -> dict:
    """{(dtype, op, rows, cols): torch's CUDA-graph µs} over every sweep.json under ``results``."""
    cells = {}
    for path in sorted(glob.glob(os.path.join(results, "**", "sweep.json"), recursive=True)):
        with open(path) as f:
            rows = json.load(f)["rows"]
        for row in rows:
            if row["direction"] != "forward" or row["impl"] != "torch" or not row.get("graph_ms"):
                continue
            op, shape = row["case"].split()
            if op == "logsumexp":  # the route never takes its forward (plan.EAGER_ROUTE_FORWARD_OFF)
                continue
            rows_, cols = (int(v) for v in shape.split("x"))
            cells[(row["dtype"], op, rows_, cols)] = row["graph_ms"] * 1e3
    return cells


def plan_of(op: str, rows: int, cols: int, dtype: torch.dtype, sms: int) -> plan.Plan:
    """The plan of a contiguous (rows, cols) call, with the launcher's own reading of its rows (in
    16-byte granules or not: softmax_launch._row_granule)."""
    return softmax_launch.contiguous_plan(op, rows, cols, dtype, torch.device("cuda"), sms=sms, interpreting=False)


def eager_ratios_by_route(results: str, sms: int) -> None:
    """Torch's eager time over ours at every sweep cell, by direction and by the route's kernel."""
    groups = {}
    for path in sorted(glob.glob(os.path.join(results, "**", "sweep.json"), recursive=True)):
        with open(path) as f:
            rows = json.load(f)["rows"]
        by_cell = {(r["case"], r["dtype"], r["direction"], r["impl"]): r for r in rows}
        for (case, dtype_name, direction, impl), row in by_cell.items():
            theirs = by_cell.get((case, dtype_name, direction, "torch"))
            if impl != "onlinesoftmax" or not row.get("ms") or not theirs or not theirs.get("ms"):
                continue
            op, shape = case.split()
            rows_, cols = (int(v) for v in shape.split("x"))
            chosen = plan_of(op, rows_, cols, DTYPES[dtype_name], sms)
            routed = eager_route.eager_torch(chosen, direction == "backward", sms=sms)
            key = (direction, "torch's kernel (routed)" if routed else "our kernels")
            groups.setdefault(key, []).append(theirs["ms"] / row["ms"])
    print(f"torch eager / ours eager over the sweeps under {results} ({sms} SMs)")
    for (direction, kernel), ratios in sorted(groups.items()):
        ratios.sort()
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        tenth, median, ninetieth = (ratios[int(q * (len(ratios) - 1))] for q in (0.1, 0.5, 0.9))
        print(f"  {direction:8s} {kernel:24s} {len(ratios):4d} cells: geometric mean {mean:.3f}, "
              f"10th / 50th / 90th percentile {tenth:.2f} / {median:.2f} / {ninetieth:.2f}, "
              f"range {ratios[0]:.2f}-{ratios[-1]:.2f}")


def misjudged(cells: dict, sms: int, margin: float, long_row_gbs: dict) -> tuple[list, list]:
    """(given to torch's kernel wrongly, given to ours wrongly): (distance past the line, cell text)."""
    line = plan.EAGER_HOST_US["forward"]
    to_torch_wrongly, to_ours_wrongly = [], []
    for (dtype_name, op, rows, cols), torch_us in cells.items():
        chosen = plan_of(op, rows, cols, DTYPES[dtype_name], sms)
        if chosen.strategy not in plan.TRITON_STRATEGIES:
            continue
        model_us = eager_route.torch_kernel_us(rows, cols, chosen.bytes_moved(), sms, long_row_gbs.get(op))
        host_us = line[chosen.launches]
        cell = f"{dtype_name} {op} {rows}x{cols}: model {model_us:.1f} us, torch {torch_us:.1f}, our host {host_us:.0f}"
        if model_us < host_us and torch_us > host_us + margin:
            to_torch_wrongly.append((torch_us - host_us, cell))
        elif model_us >= host_us and torch_us < host_us - margin:
            to_ours_wrongly.append((host_us - torch_us, cell))
    return to_torch_wrongly, to_ours_wrongly


# --fit: the model's constants over a grid, each fit's misjudged cells counted (a cell given to ours
# wrongly counts three times: it loses to torch, where one given to torch wrongly ties).
FIT_GRID = {"TORCH_ROWS_PER_SM": (2, 3, 4), "TORCH_ROW_US": (2.0, 3.0, 4.0),
            "TORCH_ROW_NS_PER_ELEMENT": (0.2, 0.3, 0.4), "TORCH_LONG_ROW_GBS": (1500.0, 2000.0),
            "TORCH_STREAM_GBS": (2000.0, 2800.0)}


def fit(cells: dict, sms: int, margin: float) -> None:
    fits = []
    for values in itertools.product(*FIT_GRID.values()):
        tables = dict(zip(FIT_GRID, values))
        with onlinesoftmax.override_plan("softmax", **tables):
            to_torch, to_ours = misjudged(cells, sms, margin, {})
        fits.append((len(to_torch) + 3 * len(to_ours), len(to_torch), len(to_ours), tables))
    fits.sort(key=lambda f: f[0])
    print(f"{len(fits)} fits over {len(cells)} cells; the best five (given to torch / to ours wrongly):")
    for _, to_torch, to_ours, tables in fits[:5]:
        print(f"  {to_torch} / {to_ours}: {tables}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", default="benchmarks/results/h200")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--margin", type=float, default=2.0)
    parser.add_argument("--long-row-gbs", default="", help="op=GB/s,... in place of plan.TORCH_LONG_ROW_GBS")
    parser.add_argument("--by-route", action="store_true", help="eager ratios by the route's kernel instead")
    parser.add_argument("--fit", action="store_true", help="the misjudged cells over a grid of the model's constants")
    args = parser.parse_args()
    if args.by_route:
        eager_ratios_by_route(args.results, args.sms)
        return
    long_row_gbs = {op: float(gbs) for op, gbs in (pair.split("=") for pair in args.long_row_gbs.split(",") if pair)}
    line = plan.EAGER_HOST_US["forward"]
    cells = torch_forward_cells(args.results)
    if args.fit:
        fit(cells, args.sms, args.margin)
        return
    to_torch_wrongly, to_ours_wrongly = misjudged(cells, args.sms, args.margin, long_row_gbs)
    print(f"{len(cells)} forward cells of torch under {args.results}; our host line {line} us")
    print(f"given to torch's kernel, torch more than {args.margin} us past the line: {len(to_torch_wrongly)}")
    for _, cell in sorted(to_torch_wrongly, reverse=True):
        print("  " + cell)
    print(f"given to our kernels, torch more than {args.margin} us under the line: {len(to_ours_wrongly)}")
    for _, cell in sorted(to_ours_wrongly, reverse=True):
        print("  " + cell)


if __name__ == "__main__":
    main()
