"""Short rows (a few to 512 classes, many rows): the rows kernel's tiles against a program a row. (GPU)

One training step keeping the logits (forward, then the gradient) under CUDA graphs, ms: torch's
F.cross_entropy, ours as planned, ours with a program a row (the plan before the rows kernel:
ROWS_MAX_COLS=0), and the rows kernel forced at other tiles (elements a program x warps); then the
plan with its reduction launches at 4 warps over 1024 rows a step (REDUCE_LAUNCH_*, as they were before
16 over 4096); then the plan's and torch's eager steps (back to back, the host included).

    python scripts/probes/probe_cross_entropy_short_rows.py [--dtype bf16] [--shapes 524288x19,65536x150]
"""

import argparse

import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, rotation_count

SHAPES = ("524288x19,131072x21,65536x150,1048576x2,262144x9,16384x10,4096x100,65536x257,32768x512,8192x512,"
          "2048x37,100000x1000")
TILES = ((1024, 4), (2048, 4), (4096, 4), (4096, 8))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=suite.DTYPES)
    parser.add_argument("--shapes", default=SHAPES)
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    tiles = " ".join(f"{e}x{w}" for e, w in TILES)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; a training step, ms")
    print(f"# graph: torch | plan (strategy) | a program a row | rows kernel at {tiles}, the plan with its reduction "
          "launches at 4 warps over 1024 rows a step || eager: torch | plan")
    ours, theirs = suite._step(onlinesoftmax.cross_entropy), suite._step(F.cross_entropy)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for item in args.shapes.split(","):
        rows, cols = map(int, item.split("x"))
        count = min(rotation_count(2 * rows * cols * dtype.itemsize), 4)
        sets = [((torch.randn(rows, cols, device="cuda", generator=gen) * 3).to(dtype).requires_grad_(),
                 torch.randint(0, cols, (rows,), device="cuda", generator=gen)) for _ in range(count)]
        torch_ms, plan_ms = graph_time_ms(theirs, sets), graph_time_ms(ours, sets)
        ours(*sets[0])
        strategy = onlinesoftmax.ops.cross_entropy.plan.last_plan().strategy
        with onlinesoftmax.override_plan("cross_entropy", ROWS_MAX_COLS=0):
            per_row_ms = graph_time_ms(ours, sets)
        variants = []
        for elements, warps in TILES:
            every_width = {1 << k: elements for k in range(4, 11)}
            with onlinesoftmax.override_plan("cross_entropy", ROWS_TILE_ELEMENTS=every_width, ROWS_WARPS=warps,
                                             ROWS_MIN_ROWS_PER_SM=0, ROWS_MAX_COLS=max(512, cols)):
                variants.append(graph_time_ms(ours, sets))
        with onlinesoftmax.override_plan("cross_entropy", REDUCE_LAUNCH_BLOCK=1024, REDUCE_LAUNCH_WARPS=4):
            variants.append(graph_time_ms(ours, sets))
        eager = [back_to_back_ms(theirs, sets), back_to_back_ms(ours, sets)]
        print(f"{item:>14s} | {torch_ms:.4f} | {plan_ms:.4f} ({strategy}) | {per_row_ms:.4f} | "
              + " ".join("-" if ms is None else f"{ms:.4f}" for ms in variants)
              + f" || {eager[0]:.4f} | {eager[1]:.4f}", flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
