"""Which in-place strategy for few long rows? (GPU)

cross_entropy(inplace_backward=True) writes the gradient over the logits in its forward. Rows
longer than one program holds take two_pass (one program streams its row twice) where there are
rows enough, split_on_chip (a row held by several programs at once, one read) or separate (the
forward's stream launch, then the backward kernel over the logits: two reads spread over every
tile) where there are few (ops/cross_entropy/plan.py, TWO_PASS_MIN_ROWS_PER_SM). One training
step ("mean": forward, then the gradient) each way, forced by ``strategy=``, beside the step that
keeps the logits (the same two kernels, writing a new gradient tensor):

    GPU:   do_bench medians with the L2 flushed before each call (harness.time_ms);
    graph: the same calls replayed from a CUDA graph (harness.graph_time_ms): no host.

'-' where a strategy does not take the shape (split_on_chip's longest row, two_pass's none).

    python scripts/probes/probe_cross_entropy_inplace_strategies.py [--dtype bf16] [--rows 1,64,...] [--cols 50257,...]
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import graph_time_ms, rotation_count, time_ms
from onlinesoftmax.ops.cross_entropy import plan

STRATEGIES = ("split_on_chip", "separate", "two_pass")


def _ints(text):
    return [int(v) for v in text.split(",")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bf16", choices=list(suite.DTYPES))
    parser.add_argument("--rows", type=_ints, default=[1, 16, 64, 132, 333, 527, 528, 1024, 2048])
    parser.add_argument("--cols", type=_ints, default=[32001, 50257, 128256, 256003])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.dtype}; seed {args.seed}; "
          f"default: two_pass from {plan.TWO_PASS_MIN_ROWS_PER_SM} rows an SM (by element size), fewer rows "
          f"separate from {plan.SEPARATE_MIN_BYTES} bytes of logits, split_on_chip below")
    names = ("keep",) + STRATEGIES
    print(f"{'shape':>14s} {'default':>13s} | GPU ms: " + " ".join(f"{n:>13s}" for n in names)
          + " | graph ms: " + " ".join(f"{n:>13s}" for n in names), flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    for cols in args.cols:
        for rows in args.rows:
            case = suite.case((rows, cols), dtype)
            count = min(rotation_count(case.bytes_moved), 4)
            shared = [case.make_inputs(gen) for _ in range(count)]
            own = [case.make_inputs(gen) for _ in range(count)]  # overwritten by the in-place steps
            steps = {"keep": (suite._step(lambda x, t: onlinesoftmax.cross_entropy(x, t)), shared)}
            for strategy in STRATEGIES:
                steps[strategy] = (suite._step(lambda x, t, s=strategy: onlinesoftmax.cross_entropy(
                    x, t, inplace_backward=True, strategy=s)), own)
            default = plan.choose("forward_grad", rows, cols, dtype, "cuda").strategy
            gpu, graph = {}, {}
            for name, (step, sets) in steps.items():
                try:
                    step(*sets[0])
                except ValueError:  # a strategy that does not take this shape
                    gpu[name] = graph[name] = None
                    continue
                gpu[name] = time_ms(step, sets)
                graph[name] = graph_time_ms(step, sets)
            fmt = lambda v: f"{'-':>13s}" if v is None else f"{v:13.4f}"  # noqa: E731
            print(f"{rows:>6d}x{cols:<7d} {default:>13s} | GPU ms: " + " ".join(fmt(gpu[n]) for n in names)
                  + " | graph ms: " + " ".join(fmt(graph[n]) for n in names), flush=True)
            del shared, own
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
