"""Short rows (a few to 512 classes, many rows): the rows kernel's tiles against a program a row. (GPU)

One training step keeping the logits (forward, then the gradient) under CUDA graphs, ms: torch's
F.cross_entropy, ours as planned, ours with a program a row (the plan before the rows kernel:
ROWS_MAX_COLS=0), the rows kernel forced at other tiles (elements a program x warps) and at other
column groups (ROWS_COLUMN_GROUPS, at every width), and the plan with its count and reduce launches
in one program (REDUCE_LAUNCH_ONE_PROGRAM_STEPS, as before their programs of a step each); then the
plan's and torch's eager steps (back to back, the host included). ``--random N --seed S``: N seeded
random shapes (rows log-uniform from 2048 to 2^20, classes from 2 to 512, at most 2^27 logits), and
``--quick``: torch's and the plan's columns alone.

    python scripts/probes/probe_cross_entropy_short_rows.py [--dtype bf16] [--shapes 524288x19,65536x150]
        [--random 24 --seed 1] [--quick]
"""

import argparse
import math
import random

import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, rotation_count

SHAPES = ("524288x19,131072x21,65536x150,1048576x2,262144x9,16384x10,4096x100,65536x257,32768x512,8192x512,"
          "2048x37,100000x1000")
TILES = ((1024, 4), (2048, 4), (4096, 4), (4096, 8))
GROUPS = (1, 2, 4, 8, 16)
WIDTHS = [1 << k for k in range(1, 11)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=suite.DTYPES)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--random", type=int, default=0, help="this many seeded random shapes in place of --shapes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="torch's and the plan's columns alone")
    args = parser.parse_args()
    shapes = args.shapes.split(",") if not args.random else random_shapes(args.random, args.seed)
    dtype = suite.DTYPES[args.dtype]
    tiles = " ".join(f"{e}x{w}" for e, w in TILES)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; a training step, ms")
    groups = " ".join(map(str, GROUPS))
    if args.quick:
        print("# graph: torch | plan (strategy) torch / plan || eager: torch | plan torch / plan")
    else:
        print(f"# graph: torch | plan (strategy) | a program a row | rows kernel at {tiles} | column groups {groups} | "
              "the plan with a one-program reduction || eager: torch | plan")
    ours, theirs = suite._step(onlinesoftmax.cross_entropy), suite._step(F.cross_entropy)
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.random:
        print(f"# {args.random} random shapes, seed {args.seed}")
    for item in shapes:
        rows, cols = map(int, item.split("x"))
        count = min(rotation_count(2 * rows * cols * dtype.itemsize), 4)
        sets = [((torch.randn(rows, cols, device="cuda", generator=gen) * 3).to(dtype).requires_grad_(),
                 torch.randint(0, cols, (rows,), device="cuda", generator=gen)) for _ in range(count)]
        torch_ms, plan_ms = graph_time_ms(theirs, sets), graph_time_ms(ours, sets)
        ours(*sets[0])
        strategy = onlinesoftmax.ops.cross_entropy.plan.last_plan().strategy
        if args.quick:
            eager = [back_to_back_ms(theirs, sets), back_to_back_ms(ours, sets)]
            print(f"{item:>14s} | {torch_ms:.4f} | {plan_ms:.4f} ({strategy}) {torch_ms / plan_ms:.2f}x || "
                  f"{eager[0]:.4f} | {eager[1]:.4f} {eager[0] / eager[1]:.2f}x", flush=True)
            continue
        with onlinesoftmax.override_plan("cross_entropy", ROWS_MAX_COLS=0):
            per_row_ms = graph_time_ms(ours, sets)
        variants = []
        for elements, warps in TILES:
            with onlinesoftmax.override_plan("cross_entropy", ROWS_TILE_ELEMENTS={w: elements for w in WIDTHS},
                                             ROWS_WARPS=warps, ROWS_MIN_ROWS_PER_SM=0, ROWS_MAX_COLS=max(512, cols)):
                variants.append(graph_time_ms(ours, sets))
        variants.append(None)
        for group in GROUPS:
            with onlinesoftmax.override_plan("cross_entropy", ROWS_COLUMN_GROUPS={w: group for w in WIDTHS},
                                             ROWS_MIN_ROWS_PER_SM=0, ROWS_MAX_COLS=max(512, cols)):
                variants.append(graph_time_ms(ours, sets))
        variants.append(None)
        with onlinesoftmax.override_plan("cross_entropy", REDUCE_LAUNCH_ONE_PROGRAM_STEPS=1 << 40):
            variants.append(graph_time_ms(ours, sets))
        eager = [back_to_back_ms(theirs, sets), back_to_back_ms(ours, sets)]
        print(f"{item:>14s} | {torch_ms:.4f} | {plan_ms:.4f} ({strategy}) | {per_row_ms:.4f} | "
              + " ".join("|" if ms is None else f"{ms:.4f}" for ms in variants)
              + f" || {eager[0]:.4f} | {eager[1]:.4f}", flush=True)
        del sets
        torch.cuda.empty_cache()


def random_shapes(count: int, seed: int) -> list:
    picker = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        rows = int(math.exp(picker.uniform(math.log(2048), math.log(1 << 20))))
        cols = int(math.exp(picker.uniform(math.log(2), math.log(512))))
        if rows * cols <= 1 << 27:
            shapes.append(f"{rows}x{cols}")
    return shapes


if __name__ == "__main__":
    main()
