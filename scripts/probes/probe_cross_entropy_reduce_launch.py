"""The loss's reduction over many rows: one program against programs of a step each, and in the
stream kernel's launch against a launch of its own. (GPU)

A training step keeping the logits and one in place (the denominators counted first), under CUDA
graphs, ms: torch's F.cross_entropy; ours as planned; ours with the count and reduce launches in one
program (REDUCE_LAUNCH_ONE_PROGRAM_STEPS past any row count, as before their programs of a step
each); ours with the loss reduced in the stream kernel's last row at any row count
(REDUCE_IN_ROWS_MAX_ROWS, as before it) and in a launch of its own at every row count
(REDUCE_IN_ROWS_LAUNCH=False); then eager steps (back to back, the host included): torch's, the
plan's, the plan's with a reduce launch of its own, and the plan's in place.

    python scripts/probes/probe_cross_entropy_reduce_launch.py [--dtype bf16] [--shapes 524288x19,100000x1000]
"""

import argparse

import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, rotation_count

SHAPES = ("524288x19,1048576x2,65536x150,16384x10,12288x37,4096x100,100000x1000,65536x1000,32768x4096,"
          "512x32000,1024x32000,2048x32000,4096x32000,8192x32000,16384x32000,32768x32000,24576x8192,8192x50257,"
          "4096x128256")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=suite.DTYPES)
    parser.add_argument("--shapes", default=SHAPES)
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; a training step, ms")
    print("# graph: torch | plan (strategy) | one-program reduction | reduced in the stream's launch at any rows | "
          "a reduce launch of its own || in place: plan | one-program || eager: torch | plan | "
          "a reduce launch of its own | plan in place")
    steps = dict(torch=suite._step(F.cross_entropy), ours=suite._step(onlinesoftmax.cross_entropy),
                 inplace=suite._step(lambda x, t: onlinesoftmax.cross_entropy(x, t, inplace_backward=True)))
    one_program = dict(REDUCE_LAUNCH_ONE_PROGRAM_STEPS=1 << 40)
    variants = [one_program, dict(REDUCE_IN_ROWS_MAX_ROWS=1 << 40), dict(REDUCE_IN_ROWS_LAUNCH=False)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for item in args.shapes.split(","):
        rows, cols = map(int, item.split("x"))
        count = min(rotation_count(2 * rows * cols * dtype.itemsize), 4)
        sets = [((torch.randn(rows, cols, device="cuda", generator=gen) * 3).to(dtype).requires_grad_(),
                 torch.randint(0, cols, (rows,), device="cuda", generator=gen)) for _ in range(count)]
        cells = [graph_time_ms(steps["torch"], sets), graph_time_ms(steps["ours"], sets)]
        steps["ours"](*sets[0])
        strategy = onlinesoftmax.ops.cross_entropy.plan.last_plan().strategy
        for table in variants:
            with onlinesoftmax.override_plan("cross_entropy", **table):
                cells.append(graph_time_ms(steps["ours"], sets))
        cells.append(graph_time_ms(steps["inplace"], sets))
        with onlinesoftmax.override_plan("cross_entropy", **one_program):
            cells.append(graph_time_ms(steps["inplace"], sets))
        eager = [back_to_back_ms(steps["torch"], sets), back_to_back_ms(steps["ours"], sets)]
        with onlinesoftmax.override_plan("cross_entropy", REDUCE_IN_ROWS_LAUNCH=False):
            eager.append(back_to_back_ms(steps["ours"], sets))
        eager.append(back_to_back_ms(steps["inplace"], sets))
        print(f"{item:>14s} | {cells[0]:.4f} | {cells[1]:.4f} ({strategy}) | "
              + " | ".join(f"{ms:.4f}" for ms in cells[2:5]) + " || "
              + " | ".join(f"{ms:.4f}" for ms in cells[5:]) + " || "
              + " | ".join(f"{ms:.4f}" for ms in eager), flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
