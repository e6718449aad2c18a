"""A training step that keeps its logits: the gradient from the saved lse, or written by the forward? (GPU)

cross_entropy(inplace_backward=False) keeps the logits. Its training step either reads them twice
(the default: the stream forward, then the backward kernel writing a new gradient tensor) or, with
gradient_in_forward=True, once with the in-place forward's plan, writing the gradient into a new
tensor in the forward; the backward then leaves it for an upstream gradient of 1 and writes it
again from the logits for any other. Each shape both ways, the second at any size (the plan's
GRADIENT_IN_FORWARD_* tables set to let it; 'default' says what plan.gradient_in_forward answers),
for a loss backed by 1 and by 0.5 (``x0.5``):

    eager: calls back to back between CUDA events (harness.back_to_back_ms): the host included;
    GPU:   do_bench medians with the L2 flushed before each call (harness.time_ms);
    graph: the same calls replayed from a CUDA graph (harness.graph_time_ms): no host.

    python scripts/probes/probe_cross_entropy_gradient_in_forward.py [--dtype bf16] [--shapes 8192x128256,...]
        [--random 16 --seed 1]   (seeded random shapes, as probe_cross_entropy_off_grid.py draws them, instead)
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, rotation_count, time_ms
from onlinesoftmax.ops.cross_entropy import plan
from probe_cross_entropy_off_grid import shapes as off_grid_shapes  # (scripts/probes is the script's path)

SHAPES = ("8192x128256,16384x128256,8192x50257,8192x32000,32768x32000,1024x128256,528x128256,777x151937,"
          "333x256003,3000x32003,12000x50257,2048x50257,512x65537,8192x4097,2048x4097,100x128256")
# Each mode: the call's options, the plan's tables.
MODES = {"separate": ({}, {}),
         "forward": (dict(gradient_in_forward=True),
                     dict(GRADIENT_IN_FORWARD_MIN_BYTES=0, GRADIENT_IN_FORWARD_MIN_ROWS_PER_SM=0))}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bf16", choices=list(suite.DTYPES))
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random", type=int, default=0, help="this many random shapes (of --seed) instead")
    parser.add_argument("--max-gb", type=float, default=1.1, help="random shapes: at most this many GB of logits")
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    if args.random:
        drawn = off_grid_shapes(dtype, args.random, args.seed, 0)[1]
        cases = [(r, c) for r, c in drawn if r * c * dtype.itemsize <= args.max_gb * 1e9]
    else:
        cases = [tuple(int(v) for v in text.split("x")) for text in args.shapes.split(",")]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.dtype}; seed {args.seed}; default: "
          f"the forward's gradient from {plan.GRADIENT_IN_FORWARD_MIN_BYTES} bytes and "
          f"{plan.GRADIENT_IN_FORWARD_MIN_ROWS_PER_SM} rows an SM")
    names = [f"{mode}{scale}" for scale in ("", " x0.5") for mode in MODES]
    print(f"{'shape':>14s} {'MB':>6s} {'rows/SM':>7s} {'default':>9s} {'forward plan':>13s} | " + " | ".join(
        f"{what} ms: " + " ".join(f"{n:>16s}" for n in names) for what in ("eager", "GPU", "graph")), flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    for rows, cols in cases:
        case = suite.case((rows, cols), dtype)
        sets = [case.make_inputs(gen) for _ in range(min(rotation_count(case.bytes_moved), 4))]
        default = plan.gradient_in_forward(plan.choose("forward_grad", rows, cols, dtype, "cuda"), "mean",
                                           torch.device("cuda"))
        strategy = plan.choose("forward_grad", rows, cols, dtype, "cuda").strategy
        times = {}
        for scale in (1.0, 0.5):
            for mode, (options, tables) in MODES.items():
                step = suite._step(lambda x, t, s=scale, o=options: onlinesoftmax.cross_entropy(x, t, **o) * s
                                   if s != 1.0 else onlinesoftmax.cross_entropy(x, t, **o))
                with onlinesoftmax.override_plan("cross_entropy", **tables):
                    step(*sets[0])
                    name = f"{mode}{'' if scale == 1.0 else ' x0.5'}"
                    times[name] = (back_to_back_ms(step, sets), time_ms(step, sets), graph_time_ms(step, sets))
        cells = " | ".join(" ".join(f"{times[n][i]:16.4f}" for n in names) for i in range(3))
        print(f"{rows:>6d}x{cols:<7d} {rows * cols * dtype.itemsize / 2**20:6.0f} {rows / sms:7.1f} "
              f"{'forward' if default else 'separate':>9s} {strategy:>13s} | {cells}", flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
