"""Time every strategy forced on every shape of the standard grid (tuning data for ops/softmax/plan.py).

    python scripts/tune/sweep_strategies.py [--out sweep.json] [--shapes 256x151936,1x1048576] [--log]
        [--dtypes fp32,bf16] [--table NAME=VALUE ...]

--log times log_softmax (forward and backward) instead of softmax. --table runs everything under
another value of a table of ops/softmax/plan.py (a Python literal), through override_plan.

Each timing is the median of triton.testing.do_bench over input buffers rotated so that at least
400 MB are cycled (no L2-resident numbers); GB/s counts each input read once and each output
written once, and is set against a device copy measured in the same run.
"""

import argparse
import json

import torch

import onlinesoftmax
from onlinesoftmax._device import next_power_of_2
from onlinesoftmax.bench.harness import copy_bandwidth_gbs, plan_tables, rotation_count, time_ms
from onlinesoftmax.bench.softmax_suite import GRID
from onlinesoftmax.ops.softmax.launch import launch_backward

CASES = [("row_on_chip", "auto"), ("split_row_on_chip", "auto"), ("looped", "online"), ("looped", "safe"),
         ("split_row", "online"), ("split_row", "safe")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--shapes", default=None, help="comma-separated ROWSxCOLS instead of the standard grid")
    parser.add_argument("--log", action="store_true", help="log_softmax instead of softmax")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--table", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    tables = plan_tables(args.table)
    with onlinesoftmax.override_plan("softmax", **tables):
        sweep(args)


def sweep(args):
    dtypes = [{"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[d] for d in args.dtypes.split(",")]
    torch_op, ours_op = (torch.log_softmax, onlinesoftmax.log_softmax) if args.log else (torch.softmax, onlinesoftmax.softmax)
    grid = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")] if args.shapes else GRID
    copy = copy_bandwidth_gbs()
    print(f"copy bandwidth: {copy:.0f} GB/s")
    results = []
    for dtype in dtypes:
        for rows, cols in grid:
            nbytes = 2 * rows * cols * dtype.itemsize
            xs = [(torch.randn(rows, cols, device="cuda", dtype=dtype),) for _ in range(rotation_count(nbytes))]
            line = [f"{str(dtype)[6:]:8s} {rows:6d}x{cols:<9d}"]
            candidates = [("torch", lambda x: torch_op(x, -1))]
            for strategy, algorithm in CASES:
                if strategy == "row_on_chip" and next_power_of_2(cols) > 65536:
                    continue
                candidates.append((f"{strategy}/{algorithm}",
                                   lambda x, s=strategy, a=algorithm: ours_op(x, -1, algorithm=a, strategy=s)))
            candidates.append(("auto", lambda x: ours_op(x, -1)))
            for name, fn in candidates:
                try:
                    ms = time_ms(fn, xs)
                except Exception as exc:  # a row too long for registers fails to compile: report it
                    line.append(f"{name}=ERR({type(exc).__name__})")
                    continue
                gbs = nbytes / ms / 1e6
                results.append(dict(dtype=str(dtype), rows=rows, cols=cols, impl=name, ms=ms, gbs=gbs, copy_gbs=copy))
                line.append(f"{name}={gbs:.0f}")
            print(" ".join(line), flush=True)
            del xs
            # backward: (y, dy) -> dx with each strategy forced
            sets = [(torch_op(torch.randn(rows, cols, device="cuda"), -1).to(dtype),
                     torch.randn(rows, cols, device="cuda", dtype=dtype)) for _ in range(rotation_count(3 * nbytes // 2))]
            line = [f"  bwd {str(dtype)[6:]:8s} {rows:6d}x{cols:<9d}"]
            torch_backward = torch._log_softmax_backward_data if args.log else torch._softmax_backward_data
            bwd = [("torch", lambda y, dy: torch_backward(dy, y, -1, y.dtype))]
            for strategy in ("row_on_chip", "split_row_on_chip", "looped", "split_row", None):
                if strategy == "row_on_chip" and next_power_of_2(cols) > 32768:
                    continue
                bwd.append((str(strategy), lambda y, dy, s=strategy: launch_backward(y, dy, 1, args.log, strategy=s)))
            for name, fn in bwd:
                try:
                    ms = time_ms(fn, sets)
                except Exception as exc:
                    line.append(f"{name}=ERR({type(exc).__name__})")
                    continue
                results.append(dict(dtype=str(dtype), rows=rows, cols=cols, impl="bwd:" + name, ms=ms,
                                    gbs=1.5 * nbytes / ms / 1e6, copy_gbs=copy))
                line.append(f"{name}={1.5 * nbytes / ms / 1e6:.0f}")
            print(" ".join(line), flush=True)
            del sets
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
