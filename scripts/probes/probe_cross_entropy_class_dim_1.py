"""Inputs with the classes at dim 1, as torch.nn.CrossEntropyLoss takes them (N, C, d1, ...): one
training step through onlinesoftmax.CrossEntropyLoss against torch's module. (GPU)

The module reads such an input through a view with the classes last: rows (the pixels) of stride 1
and classes of stride d1 * d2 * ...; where N > 1 the rows do not merge into one dim and the view is
copied. Segmentation-sized shapes, eager (back to back, the host included) and under CUDA graphs, ms;
and the step's error against float64. "copied": the classes made last by a copy before the loss.
``--override NAME=VALUE``: every run of ours under that plan table value (a Python literal).
``--unit-tiles 4096x4,16384x16``: instead, ours alone under CUDA graphs with rows of unit stride
(N = 1) at each of these tiles (elements a program x warps, at every width), beside the plan's:
the median of three rounds, the variants in turn in each.

    python scripts/probes/probe_cross_entropy_class_dim_1.py [--dtype bf16] [--shapes 8x21x256x256,...]
        [--override "ROWS_TILE_ELEMENTS={32: 4096}"] [--unit-tiles 4096x4,8192x8]
"""

import argparse
import statistics

import torch

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, plan_tables, relative_error, rotation_count

ROUNDS = 3
SHAPES = "1x19x512x1024,2x19x512x1024,8x21x256x256,4x150x128x128,16x10x32x32,4096x1000x1,64x32000x2"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=suite.DTYPES)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--override", action="append", default=[], help="NAME=VALUE, a Python literal")
    parser.add_argument("--unit-tiles", help="elements x warps a program, comma-separated")
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    if args.override:
        print(f"# under {args.override}")
    with onlinesoftmax.override_plan("cross_entropy", **plan_tables(args.override)):
        if args.unit_tiles:
            unit_tiles(args.shapes, dtype, [tuple(map(int, t.split("x"))) for t in args.unit_tiles.split(",")])
        else:
            run(args.shapes, dtype)


def make_sets(shape: tuple, dtype: torch.dtype, gen: torch.Generator) -> list:
    count = min(rotation_count(2 * torch.Size(shape).numel() * dtype.itemsize), 4)
    sets = []
    for _ in range(count):
        x = (torch.randn(shape, device="cuda", generator=gen) * 3).to(dtype).requires_grad_()
        sets.append((x, torch.randint(0, shape[1], shape[:1] + shape[2:], device="cuda", generator=gen)))
    return sets


def unit_tiles(shapes: str, dtype: torch.dtype, tiles: list) -> None:
    widths = [1 << k for k in range(1, 11)]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {dtype}; one training step under CUDA "
          f"graphs, ms: the plan, then rows of unit stride at {' '.join(f'{e}x{w}' for e, w in tiles)} "
          "(elements a program x warps)")
    step = suite._step(onlinesoftmax.CrossEntropyLoss())
    gen = torch.Generator(device="cuda").manual_seed(0)
    for item in shapes.split(","):
        shape = tuple(map(int, item.split("x")))
        sets = make_sets(shape, dtype, gen)
        step(*sets[0])
        chosen = onlinesoftmax.ops.cross_entropy.plan.last_plan()
        rounds = []
        for _ in range(ROUNDS):  # the variants in turn, each round; the median of the rounds
            times = [graph_time_ms(step, sets)]
            for elements, warps in tiles:
                table = {w: elements for w in widths}
                with onlinesoftmax.override_plan("cross_entropy", ROWS_UNIT_TILE_ELEMENTS={2: table, 4: table},
                                                 ROWS_UNIT_WARPS=warps):
                    times.append(graph_time_ms(step, sets))
            rounds.append(times)
        times = [None if None in column else statistics.median(column) for column in zip(*rounds)]
        best = min(range(1, len(times)), key=lambda i: times[i] or float("inf"))
        print(f"{item:>18s} | {chosen.rows_per_program * chosen.block}x{chosen.num_warps} {times[0]:.4f} | "
              + " ".join("-" if ms is None else f"{ms:.4f}" for ms in times[1:])
              + f" | best {'x'.join(map(str, tiles[best - 1]))}", flush=True)
        del sets
        torch.cuda.empty_cache()


def run(shapes: str, dtype: torch.dtype):
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {dtype}; one training step, ms")
    print(f"{'shape':>18s} | {'eager: torch':>12s} {'ours':>7s} {'copied':>7s} {'ratio':>5s} | {'graph: torch':>12s} "
          f"{'ours':>7s} {'copied':>7s} {'ratio':>5s} | rel err loss, grad")
    steps = {"torch": suite._step(torch.nn.CrossEntropyLoss()), "ours": suite._step(onlinesoftmax.CrossEntropyLoss()),
             # the classes made last by a copy before the loss, whatever the view would be
             "copied": suite._step(lambda x, t: onlinesoftmax.cross_entropy(x.movedim(1, -1).contiguous(), t))}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for item in shapes.split(","):
        shape = tuple(map(int, item.split("x")))
        sets = make_sets(shape, dtype, gen)
        # The error on copies: a graph kept alive from the timed inputs' own eager step makes their
        # capture on another stream fail.
        x, target = sets[0]
        want = steps["torch"](x.detach().double().requires_grad_(), target)
        got = steps["ours"](x.detach().clone().requires_grad_(), target)
        errors = [relative_error(g.double(), w) for g, w in zip(got, want)]
        del got, want
        eager = {name: back_to_back_ms(step, sets) for name, step in steps.items()}
        graph = {name: graph_time_ms(step, sets) for name, step in steps.items()}
        graph_ratio = f"{graph['torch'] / graph['ours']:5.2f}" if None not in graph.values() else "    -"
        graph = {name: "-" if ms is None else f"{ms:.3f}" for name, ms in graph.items()}
        print(f"{item:>18s} | {eager['torch']:12.3f} {eager['ours']:7.3f} {eager['copied']:7.3f} "
              f"{eager['torch'] / eager['ours']:5.2f} | {graph['torch']:>12s} {graph['ours']:>7s} "
              f"{graph['copied']:>7s} {graph_ratio} | "
              f"{errors[0]:.1e} {errors[1]:.1e}", flush=True)
        del sets, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
