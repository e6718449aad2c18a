"""row_on_chip on rows that start on 8- or 4-byte boundaries, not 16 (GPU).

Rows whose length is no multiple of 16 bytes start off 16-byte boundaries, and row_on_chip (which
has no granule path) read them one element a load: bf16 9682 x 8604 logsumexp took 126 registers a
thread and 0.27 ms, where 9682 x 8608 took 63. Rows of 8604 bf16 all start on 8-byte boundaries,
and ROW_ALIGN now says so (launch._row_align, the recipe's row_multiple). This times each op and
direction on such shapes with ROW_ALIGN as it is and as before (1 wherever rows are not whole
16-byte granules), beside torch, in one process, after checking each against float64; backward
also with row_on_chip forced where the plan takes another strategy.

    python scripts/probes/probe_part_granule_rows.py [--shape DTYPE:ROWSxCOLS ...]
"""

import argparse

import torch

from onlinesoftmax import _device
from onlinesoftmax.bench.harness import relative_error, rotation_count, time_ms
from onlinesoftmax.ops.softmax import launch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SHAPES = ["bf16:9682x8604", "bf16:8192x4100", "bf16:16384x2052", "bf16:4096x1002", "fp32:4096x4098",
          "fp32:9682x8606"]
FORWARD = {"softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: torch.log_softmax(x, -1),
           "logsumexp": lambda x: torch.logsumexp(x, -1)}
BACKWARD = {"softmax": lambda y, dy: torch.ops.aten._softmax_backward_data(dy, y, 1, y.dtype),
            "log_softmax": lambda y, dy: torch.ops.aten._log_softmax_backward_data(dy, y, 1, y.dtype)}
_row_align = launch._row_align
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU under TRITON_INTERPRET=1: a dry run


def whole_granules_only(recipe, align):
    """ROW_ALIGN before part granules: the granule where rows are whole granules, else 1."""
    return align if recipe.row_multiple == recipe.granule else 1


def timed(fn, sets, ref, before: bool) -> str:
    launch._row_align = whole_granules_only if before else _row_align
    _device.clear_plan_caches()  # launches are bound once per signature
    try:
        error = relative_error(fn(*sets[0]), ref)
        return f"{time_ms(fn, sets):.4f}" if error < 2e-2 else f"ERR {error:.1e}"
    finally:
        launch._row_align = _row_align
        _device.clear_plan_caches()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", action="append")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    print("dtype shape op direction | plan (strategy ROW_ALIGN) | torch | before | now | now / before, now / torch",
          flush=True)
    for spec in args.shape or SHAPES:
        name, dims = spec.split(":")
        dtype = DTYPES[name]
        rows, cols = map(int, dims.split("x"))
        n = rotation_count(3 * rows * cols * dtype.itemsize)
        xs = [(torch.randn(rows, cols, generator=gen) * 3).to(DEVICE, dtype) for _ in range(n)]
        dys = [torch.randn(rows, cols, generator=gen).to(DEVICE, dtype) for _ in range(n)]
        cases = []
        for op, theirs in FORWARD.items():
            cases.append((op, "forward", [(x,) for x in xs], theirs,
                          lambda x, op=op: launch.launch_forward(x, 1, op), launch.forward_call(xs[0], 1, op)))
        for op, theirs in BACKWARD.items():
            sets = list(zip([FORWARD[op](x) for x in xs], dys))
            for strategy in (None, "row_on_chip"):
                call = launch.backward_call(*sets[0], 1, op == "log_softmax", strategy=strategy)
                if strategy and call.plan.strategy == "row_on_chip" and call.plan.strategy == launch.backward_call(
                        *sets[0], 1, op == "log_softmax").plan.strategy:
                    continue  # the plan's own
                cases.append((op, "backward" + (" (forced)" if strategy else ""), sets, theirs,
                              lambda y, dy, op=op, strategy=strategy: launch.launch_backward(
                                  y, dy, 1, op == "log_softmax", strategy=strategy), call))
        for op, direction, sets, theirs, fn, call in cases:
            ref = theirs(*[t.double() for t in sets[0]])
            torch_ms = time_ms(theirs, sets)
            row_align = _row_align(call.recipe, call.recipe.granule) if call.plan.strategy == "row_on_chip" else "-"
            before, now = timed(fn, sets, ref, True), timed(fn, sets, ref, False)
            ratio = (f"{float(before) / float(now):.2f}x {torch_ms / float(now):.2f}x"
                     if "ERR" not in before + now else "")
            print(f"{name} {rows}x{cols} {op} {direction} | {call.plan.strategy} {row_align} | {torch_ms:.4f} | "
                  f"{before} | {now} | {ratio}", flush=True)
        del xs, dys, cases
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
