"""The eager route's model of torch's forward kernel against torch's own times in committed sweeps (CPU).

The eager route (ops/softmax/eager_route.py) sends an eager forward to torch's own kernel where its
model of that kernel says under plan.EAGER_HOST_US (our host time a call). A model that says less
than torch takes sends calls our kernels would win to torch (level with torch); one that says more
sends calls torch would win to ours. This reads the sweeps' torch rows (CUDA-graph replays: the
kernel's own time), plans each cell for a GPU of ``--sms`` SMs, and prints the model beside torch,
with the cells on the wrong side of the route's line.

    python scripts/probes/route_model_check.py [--results benchmarks/results/h200] [--sms 132] [--margin 2]
        [--long-row-gbs softmax=1200,log_softmax=2000]

``--margin`` (µs): a cell counts as misjudged when torch's time is that far past the line on the
other side from the model's. ``--long-row-gbs``: a long-row streaming rate by op in place of
plan.TORCH_LONG_ROW_GBS (a model by op, tried without changing the route).
"""

import argparse
import glob
import json
import os

import torch

from onlinesoftmax.ops.softmax import eager_route, plan

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", default="benchmarks/results/h200")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--margin", type=float, default=2.0)
    parser.add_argument("--long-row-gbs", default="", help="op=GB/s,... in place of plan.TORCH_LONG_ROW_GBS")
    args = parser.parse_args()
    long_row_gbs = {op: float(gbs) for op, gbs in (pair.split("=") for pair in args.long_row_gbs.split(",") if pair)}
    line = plan.EAGER_HOST_US["forward"]
    to_torch_wrongly, to_ours_wrongly = [], []
    cells = torch_forward_cells(args.results)
    for (dtype_name, op, rows, cols), torch_us in cells.items():
        dtype = DTYPES[dtype_name]
        chosen = plan.choose(op, rows, cols, dtype, torch.device("cuda"), sms=args.sms, interpreting=False,
                             misaligned_rows=(cols * dtype.itemsize) % 16 != 0)
        if chosen.strategy not in plan.TRITON_STRATEGIES:
            continue
        model_us = eager_route.torch_kernel_us(rows, cols, chosen.bytes_moved(), args.sms, long_row_gbs.get(op))
        host_us = line[chosen.launches]
        cell = f"{dtype_name} {op} {rows}x{cols}: model {model_us:.1f} us, torch {torch_us:.1f}, our host {host_us:.0f}"
        if model_us < host_us and torch_us > host_us + args.margin:
            to_torch_wrongly.append((torch_us - host_us, cell))
        elif model_us >= host_us and torch_us < host_us - args.margin:
            to_ours_wrongly.append((host_us - torch_us, cell))
    print(f"{len(cells)} forward cells of torch under {args.results}; our host line {line} us")
    print(f"given to torch's kernel, torch more than {args.margin} us past the line: {len(to_torch_wrongly)}")
    for _, cell in sorted(to_torch_wrongly, reverse=True):
        print("  " + cell)
    print(f"given to our kernels, torch more than {args.margin} us under the line: {len(to_ours_wrongly)}")
    for _, cell in sorted(to_ours_wrongly, reverse=True):
        print("  " + cell)


if __name__ == "__main__":
    main()
