"""Is cross_entropy ahead of torch off the bench grid? (GPU)

The bench grid's rows are large and mostly aligned. Here one training step ("mean": forward, then
the gradient of the logits) on odd, prime and "vocabulary + a few" lengths at rows from 1 to 8192,
plus seeded random shapes: torch's F.cross_entropy, ours keeping the logits, ours in place, each
timed two ways on the same inputs:

    eager: calls back to back between two CUDA events (harness.back_to_back_ms): what a loop of
           eager calls costs, the host's time included wherever it exceeds the GPU's;
    GPU:   do_bench medians with the L2 flushed before each call (harness.time_ms);
    graph: (--graph) the same calls replayed from a CUDA graph (harness.graph_time_ms): no host.

Ratios are torch's time over ours (above 1: ours faster). Logits above --max-gb are left out.

    python scripts/probes/probe_cross_entropy_off_grid.py [--dtype bf16] [--random 16] [--seed 0] [--max-gb 1.1] [--graph]
"""

import argparse
import math
import random

import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, rotation_count, time_ms

ROWS = (1, 64, 512, 2048, 8192)
VOCABS = (4097, 32001, 32008, 50257, 65537, 128257, 256000)


def shapes(dtype, n_random, seed, max_bytes):
    grid = [(r, v) for r in ROWS for v in VOCABS]
    rng = random.Random(seed)
    drawn = [(int(math.exp(rng.uniform(0, math.log(16384)))), int(math.exp(rng.uniform(math.log(1000),
                                                                                        math.log(262144)))))
             for _ in range(n_random)]
    return [s for s in grid + drawn if s[0] * s[1] * dtype.itemsize <= max_bytes], drawn


def _graph_columns(graph) -> str:
    if None in graph.values():  # a step that could not be captured
        return " | " + " ".join(f"{name}: {'-' if ms is None else f'{ms:.3f}'}" for name, ms in graph.items())
    return (f" | {graph['torch']:15.3f} {graph['ours']:7.3f} {graph['inplace']:7.3f} "
            f"{graph['torch'] / graph['ours']:5.2f} {graph['torch'] / graph['inplace']:5.2f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bf16", choices=list(suite.DTYPES))
    parser.add_argument("--random", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-gb", type=float, default=1.1)
    parser.add_argument("--graph", action="store_true", help="also time CUDA-graph replays")
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    cases, drawn = shapes(dtype, args.random, args.seed, args.max_gb * 1e9)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.dtype}; random shapes (seed "
          f"{args.seed}): {' '.join(f'{r}x{v}' for r, v in drawn)}")
    print(f"{'shape':>14s} | {'eager ms: torch':>15s} {'ours':>7s} {'inplace':>7s} {'ratios':>11s} | "
          f"{'GPU ms: torch':>13s} {'ours':>7s} {'inplace':>7s} {'ratios':>11s}"
          + (f" | {'graph ms: torch':>15s} {'ours':>7s} {'inplace':>7s} {'ratios':>11s}" if args.graph else ""),
          flush=True)
    steps = {"torch": suite._step(F.cross_entropy),
             "ours": suite._step(lambda x, t: onlinesoftmax.cross_entropy(x, t)),
             "inplace": suite._step(lambda x, t: onlinesoftmax.cross_entropy(x, t, inplace_backward=True))}
    gen = torch.Generator().manual_seed(args.seed)
    worst = []
    for rows, vocab in cases:
        case = suite.case((rows, vocab), dtype)
        # Rotated beyond L2 where that takes a few sets; small logits stay in L2 (their calls are
        # the host's time, and do_bench flushes L2 before each GPU timing anyway).
        count = min(rotation_count(case.bytes_moved), 4)
        shared = [case.make_inputs(gen) for _ in range(count)]
        own = [case.make_inputs(gen) for _ in range(count)]  # overwritten by the in-place step
        eager, gpu, graph = {}, {}, {}
        for name, step in steps.items():
            sets = own if name == "inplace" else shared
            eager[name] = back_to_back_ms(step, sets)
            gpu[name] = time_ms(step, sets)
            if args.graph:
                graph[name] = graph_time_ms(step, sets)
        ratios = [eager["torch"] / eager["ours"], eager["torch"] / eager["inplace"]]
        gpu_ratios = [gpu["torch"] / gpu["ours"], gpu["torch"] / gpu["inplace"]]
        worst.append((min(ratios), f"{rows}x{vocab}"))
        print(f"{rows:>6d}x{vocab:<7d} | {eager['torch']:15.3f} {eager['ours']:7.3f} {eager['inplace']:7.3f} "
              f"{ratios[0]:5.2f} {ratios[1]:5.2f} | {gpu['torch']:13.3f} {gpu['ours']:7.3f} {gpu['inplace']:7.3f} "
              f"{gpu_ratios[0]:5.2f} {gpu_ratios[1]:5.2f}" + (_graph_columns(graph) if args.graph else ""), flush=True)
        del shared, own
        torch.cuda.empty_cache()
    worst.sort()
    print("# eager, ours (the lower of keeping the logits and in place) against torch, worst first: "
          + ", ".join(f"{shape} {ratio:.2f}" for ratio, shape in worst[:12]))


if __name__ == "__main__":
    main()
