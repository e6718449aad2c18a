"""Host time of eager softmax / log_softmax training steps on our kernels (GPU), two autograd paths.

    python scripts/probes/probe_softmax_step_host.py [--profile 25] [--rounds 3]

Eager calls with autograd take ``_EagerSoftmaxFunction``: the signature's prepared forward
(launch.ForwardCall) in one argument, the backward looked up by dy's layout alone. This times it
against the general ``_SoftmaxFunction`` (seven arguments, the backward's whole signature looked up
each step; what torch.compile traces) and torch's own step, on our kernels (the eager torch route
off), with bench host's method (host_us: medians of alternating runs of 1000 calls):

- a step: forward and ``.backward(dy)``;
- the backward alone: ``torch.autograd.grad`` of a kept graph (what the sweep's eager backward times).

``--profile N``: cProfile's N costliest frames of the prepared step. ``--rounds N``: then the
sweep's eager backward cells of bf16 rows off 16-byte boundaries (whose kernels take 60-80 µs, about
the host's time), ``torch.autograd.grad`` of a kept graph timed with do_bench, the three paths in
turn, N rounds.
"""

import argparse
import functools

import torch
import triton

import onlinesoftmax
from onlinesoftmax.bench.host_suite import host_us, print_profile
from onlinesoftmax.ops.softmax import op as softmax_op
from onlinesoftmax.ops.softmax import plan

ROUTE_OFF = functools.partial(onlinesoftmax.override_plan, "softmax", EAGER_HOST_US=plan.EAGER_ROUTE_OFF)
SHAPES = ((torch.float32, 64, 4096), (torch.float32, 4, 128), (torch.bfloat16, 3077, 12867))
SWEEP_CELLS = ((torch.bfloat16, 3077, 12867), (torch.bfloat16, 4096, 10007))


def general(log):
    return lambda t: softmax_op._SoftmaxFunction.apply(t, t.dim() - 1, log, 1.0, None, "auto", None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--skip-host", action="store_true", help="only the --rounds timings")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          "host us a call (prepared / general / torch)")
    for dtype, rows, cols in () if args.skip_host else SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=dtype, requires_grad=True)
        dy = torch.randn_like(x)
        for log in (False, True):
            ours = onlinesoftmax.log_softmax if log else onlinesoftmax.softmax
            theirs = torch.log_softmax if log else torch.softmax
            paths = {"prepared": lambda t, f=ours: f(t, -1), "general": general(log), "torch": lambda t, f=theirs: f(t, -1)}
            step = {name: (lambda f=f: f(x).backward(dy)) for name, f in paths.items()}
            kept = {}
            with ROUTE_OFF():
                for name, f in paths.items():
                    kept[name] = f(x)
            grad = {name: (lambda y=y: torch.autograd.grad(y, x, dy, retain_graph=True)) for name, y in kept.items()}
            line = []
            for label, calls in (("step", step), ("backward", grad)):
                prepared, torch_us = host_us(calls["prepared"], calls["torch"], ROUTE_OFF)
                general_us, _ = host_us(calls["general"], calls["torch"], ROUTE_OFF)
                line.append(f"{label} {prepared:.1f} / {general_us:.1f} / {torch_us:.1f}")
            name = "log_softmax" if log else "softmax"
            print(f"{str(dtype)[6:]} {name} {rows}x{cols}: " + "; ".join(line), flush=True)
            if args.profile and dtype == torch.float32 and rows == 64:
                with ROUTE_OFF():
                    for _ in range(20):
                        step["prepared"]()
                    print_profile(step["prepared"], args.profile)
    if args.rounds:
        print("ms a backward step (do_bench of torch.autograd.grad, a kept graph), prepared / general / torch")
    for dtype, rows, cols in SWEEP_CELLS if args.rounds else ():
        x = torch.randn(rows, cols, device="cuda", dtype=dtype, requires_grad=True)
        dy = torch.randn_like(x)
        for log in (False, True):
            ours = onlinesoftmax.log_softmax if log else onlinesoftmax.softmax
            theirs = torch.log_softmax if log else torch.softmax
            kept = (ours(x, -1), general(log)(x), theirs(x, -1))
            times = [[] for _ in kept]
            for _ in range(args.rounds):
                for i, y in enumerate(kept):
                    times[i].append(triton.testing.do_bench(
                        lambda y=y: torch.autograd.grad(y, x, dy, retain_graph=True), warmup=50, rep=200))
            name = "log_softmax" if log else "softmax"
            print(f"{str(dtype)[6:]} {name} {rows}x{cols}: " + " / ".join(
                ", ".join(f"{t:.4f}" for t in path) for path in times), flush=True)


if __name__ == "__main__":
    main()
