"""Where cross_entropy's host time goes on tiny inputs, beside F.cross_entropy's (GPU).

`bench host` has our forward + backward at 8 x 1024 fp32 at 1.3-1.7x F.cross_entropy's. This times
the whole step and its parts as `bench host` times a call (host_suite.host_us): the forward without
autograd, the prepared forward call with and without its lookup, the prepared backward, each
launch, one allocation; and autograd's own cost, a Python autograd.Function of two outputs (the
second non-differentiable, as our lse) with its unused gradient materialized (autograd's default)
or not, against a native op's step. Then it cProfiles our step and torch's.

    python scripts/probes/probe_cross_entropy_host.py [--repeat 3]

``--repeat N`` then times bench host's forward + backward rows of cross_entropy and attention N
times in a row (the host's time moves between runs). The step and the forward are also timed with
the loss reduced in the rows' launch (the plan) and in a launch of its own (REDUCE_IN_ROWS_LAUNCH
off), in turns in one process.
"""

import argparse

import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench import host_suite
from onlinesoftmax.bench.host_suite import host_us, host_us_alone, print_profile
from onlinesoftmax.ops.cross_entropy import launch


class _TwoOutputs(torch.autograd.Function):
    """x.sum() and x.amax(), the second non-differentiable; backward through the first."""

    @staticmethod
    def forward(ctx, x, materialize):
        total, top = x.sum(), x.amax()
        ctx.mark_non_differentiable(top)
        ctx.set_materialize_grads(materialize)
        ctx.shape = x.shape
        return total, top

    @staticmethod
    def backward(ctx, d_total, _d_top):
        return d_total.expand(ctx.shape), None


def _reduce_launch_of_its_own():
    return onlinesoftmax.override_plan("cross_entropy", REDUCE_IN_ROWS_LAUNCH=False)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=0)
    args = parser.parse_args()
    x = torch.randn(8, 1024, device="cuda", requires_grad=True)
    target = torch.randint(0, 1024, (8,), device="cuda")
    logits = x.detach()
    options = (-100, "mean", 0.0, 0.0, 0.0, 1.0, False)
    call = launch.forward_call(logits, target, None, *options, None)
    loss, lse, lse_low, denom = call(logits, target, None)
    upstream = torch.ones((), device="cuda")

    def ours():
        onlinesoftmax.cross_entropy(x, target).backward()

    def theirs():
        F.cross_entropy(x, target).backward()

    def ours_forward():
        with torch.no_grad():
            onlinesoftmax.cross_entropy(x, target)

    def theirs_forward():
        with torch.no_grad():
            F.cross_entropy(x, target)

    cases = [
        ("ours forward + backward", ours), ("torch forward + backward", theirs),
        ("ours forward, no grad", ours_forward), ("torch forward, no grad", theirs_forward),
        ("forward_call(...)(...)", lambda: launch.forward_call(logits, target, None, *options, None)(logits, target,
                                                                                                      None)),
        ("prepared forward call", lambda: call(logits, target, None)),
        ("prepared backward (call.backward)", lambda: call.backward(logits, target, None, lse, lse_low, denom, upstream)),
        # (The rows' kernel reduces the loss in the same launch: its last row finds itself at a counter.)
        ("the rows' launch", lambda: call.main(logits, target, logits, denom, lse_low, lse, lse_low,
                                               *launch._exchange(call.chosen, logits.device), loss, logits)),
        ("one torch.empty_like", lambda: torch.empty_like(lse)),
        ("Function of 2 outputs, materialized", lambda: _TwoOutputs.apply(x, True)[0].backward()),
        ("Function of 2 outputs, not materialized", lambda: _TwoOutputs.apply(x, False)[0].backward()),
        ("x.sum().backward(), a native step", lambda: x.sum().backward()),
    ]
    for name, fn in cases:
        print(f"{name:40s} {host_us_alone(fn):8.1f} us", flush=True)
    # The loss reduced in the rows' launch (the plan) against a reduce launch after it, in turns.
    for name, fn in (("forward + backward", ours), ("forward, no grad", ours_forward)):
        separate, folded = host_us(fn, fn, ours_context=_reduce_launch_of_its_own)
        print(f"{name}: reduced in the rows' launch {folded:6.1f} us, in a launch of its own {separate:6.1f} us",
              flush=True)
    for fn in (ours, theirs):
        print_profile(fn, 22)
    rows = [c for c in host_suite.cases() if c[1] == "forward+backward" and c[0] in ("cross_entropy", "attention")]
    for run in range(args.repeat):
        for name, _, ours_fn, theirs_fn, peer in rows:
            mine, peers = host_us(ours_fn, theirs_fn)
            print(f"run {run}: {name:14s} ours {mine:6.1f} us  {peer} {peers:6.1f} us  ratio {mine / peers:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
