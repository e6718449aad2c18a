"""row_on_chip with a tail tile on rows just past a power of two (GPU).

A row of 8200 elements held whole by row_on_chip takes a 16384-element tile, half of it idle; the
plan used to send such rows elsewhere (2-byte backward: looped, which reads dy twice; fp32
log_softmax forward: split_row_on_chip). With plan.ROW_ON_CHIP_TAIL_BELOW_FILL the row is held as a
full power-of-two head (8192) and a tail tile (16). This times, per shape and op, forward and backward
kernels (no autograd): torch, the plan without tails (ROW_ON_CHIP_TAIL_BELOW_FILL all 0), the
plan as it is, and the tail forced at each of --warps (any head, rows off 16-byte boundaries too),
in one process, after checking each against torch.

    python scripts/probes/probe_tailed_rows.py [--shape DTYPE:ROWSxCOLS ...] [--warps 8 16] [--logsumexp]
        [--ops softmax,log_softmax,logsumexp]

--logsumexp adds logsumexp's forward (ROW_ON_CHIP_TAIL_LOGSUMEXP), timed in the same columns;
--ops picks the ops (default softmax,log_softmax).
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import relative_error, rotation_count, time_ms
from onlinesoftmax.ops.softmax import launch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SHAPES = ["bf16:2048x8200", "bf16:1024x17000", "bf16:2048x9000", "fp16:2048x8200", "bf16:9682x8604",
          "bf16:4096x4104", "bf16:1024x20000", "bf16:512x24001", "fp32:9682x8604", "fp32:4096x4100",
          "fp32:2048x9000", "fp32:1024x17000"]
ALWAYS = {"forward": {4: 1.0, 2: 1.0}, "backward": {4: 1.0, 2: 1.0}}
NEVER = {"forward": {4: 0.0, 2: 0.0}, "backward": {4: 0.0, 2: 0.0}}
ANYWHERE = {"forward": {4: 1 << 20, 2: 1 << 20}, "backward": {4: 1 << 20, 2: 1 << 20}}
TORCH = {("softmax", "forward"): lambda x: torch.softmax(x, -1),
         ("log_softmax", "forward"): lambda x: torch.log_softmax(x, -1),
         ("softmax", "backward"): lambda y, dy: torch.ops.aten._softmax_backward_data(dy, y, 1, y.dtype),
         ("log_softmax", "backward"): lambda y, dy: torch.ops.aten._log_softmax_backward_data(dy, y, 1, y.dtype)}


def ours(op, direction):
    if direction == "forward":
        return lambda x: launch.launch_forward(x, 1, op)
    return lambda y, dy: launch.launch_backward(y, dy, 1, op == "log_softmax")


def forced_tail_cells(fn, sets, ref, warps_list) -> list[str]:
    """fn timed with the tail forced on every row (any head, rows off 16-byte boundaries, logsumexp
    too) at each warp count, after checking it against ref: "8w 0.0123" (or the error)."""
    cells = []
    for warps in warps_list:
        with onlinesoftmax.override_plan("softmax", ROW_ON_CHIP_TAIL_BELOW_FILL=ALWAYS, ROW_ON_CHIP_TAIL_LOGSUMEXP=True,
                                         ROW_ON_CHIP_TAIL_MAX_HEAD=ANYWHERE,
                                         ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD=ANYWHERE,
                                         WARPS_BY_TILE_ELEMENTS=((1 << 20, warps),), ROW_ON_CHIP_TAIL_WARPS=warps):
            error = relative_error(fn(*sets[0]), ref)
            cells.append(f"{warps}w " + (f"{time_ms(fn, sets):.4f}" if error < 2e-2 else f"ERR {error:.1e}"))
    return cells


def report(label, theirs_fn, fn, sets, ref, chosen, warps_list):
    """One row: torch, ours without tails and as planned (``chosen``), the tail forced at each warp
    count, after checking ours against ``ref``."""
    assert relative_error(fn(*sets[0]), ref) < 2e-2
    theirs, mine = time_ms(theirs_fn, sets), time_ms(fn, sets)
    with onlinesoftmax.override_plan("softmax", ROW_ON_CHIP_TAIL_BELOW_FILL=NEVER):
        before = time_ms(fn, sets)
    print(f"{label} | {theirs:.4f} | {before:.4f} | {mine:.4f} "
          f"({chosen.strategy} {chosen.block_cols}+{chosen.tail_cols} {chosen.num_warps}w) | "
          + " ".join(forced_tail_cells(fn, sets, ref, warps_list))
          + f" | {theirs / mine:.2f}x {before / mine:.2f}x", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", action="append")
    parser.add_argument("--warps", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--logsumexp", action="store_true")
    parser.add_argument("--ops", default="softmax,log_softmax", help="comma-separated: softmax,log_softmax,logsumexp")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    print("dtype shape op direction | torch | no tails | plan (strategy) | tail forced: warps ms ... | "
          "plan / torch, plan / no tails", flush=True)
    for spec in args.shape or SHAPES:
        name, dims = spec.split(":")
        dtype = DTYPES[name]
        rows, cols = map(int, dims.split("x"))
        n = rotation_count(3 * rows * cols * dtype.itemsize)
        xs = [(torch.randn(rows, cols, generator=gen) * 3).to("cuda", dtype) for _ in range(n)]
        dys = [torch.randn(rows, cols, generator=gen).to("cuda", dtype) for _ in range(n)]
        ys = []
        for op in [op for op in ("softmax", "log_softmax") if op in args.ops]:
            ys = [TORCH[(op, "forward")](x) for x in xs]
            for direction, sets in (("forward", [(x,) for x in xs]), ("backward", list(zip(ys, dys)))):
                chosen = (launch.forward_call(xs[0], 1, op) if direction == "forward"
                          else launch.backward_call(ys[0], dys[0], 1, op == "log_softmax")).plan
                report(f"{name} {rows}x{cols} {op} {direction}", TORCH[(op, direction)], ours(op, direction), sets,
                       TORCH[(op, direction)](*[t.double() for t in sets[0]]), chosen, args.warps)
        if args.logsumexp or "logsumexp" in args.ops:
            report(f"{name} {rows}x{cols} logsumexp forward", lambda x: torch.logsumexp(x, -1),
                   lambda x: launch.launch_forward(x, 1, "logsumexp"), [(x,) for x in xs],
                   torch.logsumexp(xs[0].double(), -1), launch.forward_call(xs[0], 1, "logsumexp").plan, args.warps)
        del xs, dys, ys
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
