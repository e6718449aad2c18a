"""The softmax / log_softmax backward on rows of 4K-17K elements, every strategy beside torch (GPU).

Probing rows of a multiple of 16 bytes (scripts/probes/probe_whole_granule_rows.py) found the bf16
log_softmax backward behind torch's at 2048 x 8200 (0.86x) and at its aligned neighbour 2048 x 8208
(0.90x): the plan sends rows that fill less than 60% of row_on_chip's power-of-two tile to looped,
which reads dy twice. This times the backward (launch_backward, no autograd) on each strategy that
takes the shape, and torch's aten kernel, in one process. ``--forward``: the forward instead (the
public functions with a strategy named: our kernels at every size), on FORWARD_SHAPES, beside
torch's.

    python scripts/probes/probe_backward_mid_rows.py [--forward] [--shape bf16:256x100003 ...]

``--shape DTYPE:ROWSxCOLS`` (repeatable) replaces the shape lists with the shapes named.
"""

import sys

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import rotation_count, time_ms
from onlinesoftmax.ops.softmax import launch

SHAPES = {torch.bfloat16: [(2048, 8200), (2048, 8208), (4096, 4104), (4096, 4096), (9682, 8604), (1024, 17000),
                           (4096, 5000), (1024, 12288), (2048, 10000)],
          torch.float32: [(4096, 4100), (2048, 8192), (2048, 5000), (9682, 8604), (2048, 9000)]}
STRATEGIES = ("row_on_chip", "looped", "split_row", "split_row_on_chip")
# float32 rows half of their row_on_chip tile (the fp32 sweep's log_softmax 9682 x 8604 ran at 0.79x torch.compile).
FORWARD_SHAPES = {torch.float32: [(9682, 8604), (2048, 9000), (4096, 8200), (4096, 4100), (2048, 8192)],
                  torch.bfloat16: [(9682, 8604), (2048, 8200)]}


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def named_shapes() -> dict:
    """The shapes named by --shape DTYPE:ROWSxCOLS, by dtype ({} when none is)."""
    named: dict = {}
    for i, arg in enumerate(sys.argv):
        if arg == "--shape":
            dtype, shape = sys.argv[i + 1].split(":")
            rows, cols = (int(n) for n in shape.split("x"))
            named.setdefault(DTYPES[dtype], []).append((rows, cols))
    return named


def forward():
    gen = torch.Generator().manual_seed(0)
    print("dtype op shape | auto plan | ms: " + " ".join(STRATEGIES) + " torch", flush=True)
    for dtype, shapes in (named_shapes() or FORWARD_SHAPES).items():
        for rows, cols in shapes:
            sets = [((torch.randn(rows, cols, generator=gen) * 3).to("cuda", dtype),)
                    for _ in range(rotation_count(2 * rows * cols * dtype.itemsize))]
            for op, ours, theirs in (("softmax", onlinesoftmax.softmax, torch.softmax),
                                     ("log_softmax", onlinesoftmax.log_softmax, torch.log_softmax)):
                ms = []
                for strategy in STRATEGIES:
                    try:
                        ms.append(time_ms(lambda x: ours(x, -1, strategy=strategy), sets))
                    except ValueError:
                        ms.append(float("nan"))
                chosen = launch.forward_call(sets[0][0], 1, op).plan
                name = str(dtype).replace("torch.", "")
                print(f"{name} {op} {rows}x{cols} | {chosen.strategy} {chosen.num_warps}w | "
                      + " ".join(f"{m:.4f}" for m in ms) + f" {time_ms(lambda x: theirs(x, -1), sets):.4f}",
                      flush=True)


def main():
    if "--forward" in sys.argv:
        return forward()
    gen = torch.Generator().manual_seed(0)
    print("dtype op shape | auto plan | ms: " + " ".join(STRATEGIES) + " torch | auto vs torch", flush=True)
    for dtype, shapes in (named_shapes() or SHAPES).items():
        for rows, cols in shapes:
            sets = [(torch.softmax(torch.randn(rows, cols, generator=gen).to("cuda", dtype) * 3, -1),
                     torch.randn(rows, cols, generator=gen).to("cuda", dtype))
                    for _ in range(rotation_count(3 * rows * cols * dtype.itemsize))]
            for log, aten in ((False, torch.ops.aten._softmax_backward_data),
                              (True, torch.ops.aten._log_softmax_backward_data)):
                ms = []
                for strategy in STRATEGIES:
                    try:
                        ms.append(time_ms(lambda y, dy: launch.launch_backward(y, dy, 1, log, strategy=strategy),
                                          sets))
                    except ValueError:
                        ms.append(float("nan"))
                auto = time_ms(lambda y, dy: launch.launch_backward(y, dy, 1, log), sets)
                chosen = launch.backward_call(sets[0][0], sets[0][1], 1, log).plan
                theirs = time_ms(lambda y, dy: aten(dy, y, 1, y.dtype), sets)
                name = str(dtype).replace("torch.", "")
                op = "log_softmax" if log else "softmax"
                print(f"{name} {op} {rows}x{cols} | {chosen.strategy} {chosen.num_warps}w | "
                      + " ".join(f"{m:.4f}" for m in ms) + f" {theirs:.4f} | {auto:.4f} ({theirs / auto:.2f}x)",
                      flush=True)


if __name__ == "__main__":
    main()
