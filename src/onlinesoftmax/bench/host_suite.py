"""``onlinesoftmax bench host``: the host's time per eager call, ours beside torch in one run.

Training and serving code calls these ops eagerly many times a step, and at small sizes the call's
Python and dispatch work, not the kernel, decides its time. Each op runs on a tiny CUDA input;
CALLS calls in a row are timed on the host's clock (the GPU, a few microseconds a kernel, keeps up,
so nothing waits on it), REPEATS times, ours and the peer's runs in turn, and the median per call
is reported with the target.
"""

from __future__ import annotations

import contextlib
import cProfile
import functools
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

from . import harness

CALLS = 1000
REPEATS = 7
# The targets: forward within torch's time + 5 us (softmax family), + 10 us (attention); forward +
# backward within 1.3x torch's; softmax_topk under 25 us.
TARGETS = {"forward": ("plus", 5.0), "attention forward": ("plus", 10.0), "forward+backward": ("times", 1.3),
           "softmax_topk": ("under", 25.0)}


# Cases named with this suffix time our calls with the eager torch route off (the kernels' host path).
KERNELS = " (kernels)"


WARMUP_CALLS = 200
RUN_WARMUP_CALLS = 10


def host_us(ours, theirs, ours_context=contextlib.nullcontext) -> tuple[float, float]:
    """Median host microseconds per call of ``ours`` and of ``theirs``: REPEATS runs of CALLS calls
    each, the two alternating run by run (host time drifts by tens of percent over a few seconds:
    the same torch call measured 194 and 210 us a step in consecutive cases when each was timed
    in one block), after WARMUP_CALLS untimed calls each, with Python's garbage collector held off.
    ``ours_context()`` is entered around each of ``ours``'s runs."""
    def timed_run(fn, calls):
        for _ in range(RUN_WARMUP_CALLS):  # the context's cleared plan caches refilled
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        seconds = time.perf_counter() - start
        torch.cuda.synchronize()
        return seconds / calls * 1e6

    samples = ([], [])
    with harness.garbage_collector_held_off():
        for run in range(REPEATS + 1):  # run 0: the warm-up, not kept
            calls = WARMUP_CALLS if run == 0 else CALLS
            with ours_context():
                ours_us = timed_run(ours, calls)
            theirs_us = timed_run(theirs, calls)
            if run:
                samples[0].append(ours_us)
                samples[1].append(theirs_us)
    return statistics.median(samples[0]), statistics.median(samples[1])


def host_us_alone(fn) -> float:
    """host_us of ``fn`` by itself (its runs alternate with an empty call's)."""
    return host_us(fn, _nothing)[0]


def _nothing():
    pass


def print_profile(fn, lines: int, calls: int = 300):
    """cProfile of ``calls`` back-to-back calls: the frames that cost the host the most."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(lines)


def _with_backward(forward, x, dy):
    def call():
        forward(x).backward(dy)
    return call


def cases():
    """(name, kind, ours, theirs, their name): the calls to time, on tiny inputs."""
    import onlinesoftmax

    x = torch.randn(4, 128, device="cuda")
    xg = x.clone().requires_grad_()
    dy = torch.randn_like(x)
    xk = torch.randn(64, 4096, device="cuda")
    xkg = xk.clone().requires_grad_()
    dyk = torch.randn_like(xk)
    out = [
        ("softmax", "forward", lambda: onlinesoftmax.softmax(x, -1), lambda: torch.softmax(x, -1), "torch.softmax"),
        ("log_softmax", "forward", lambda: onlinesoftmax.log_softmax(x, -1), lambda: torch.log_softmax(x, -1),
         "torch.log_softmax"),
        ("logsumexp", "forward", lambda: onlinesoftmax.logsumexp(x, -1), lambda: torch.logsumexp(x, -1),
         "torch.logsumexp"),
        ("logsumexp", "forward+backward", _with_backward(lambda t: onlinesoftmax.logsumexp(t, -1), xg, dy[:, 0]),
         _with_backward(lambda t: torch.logsumexp(t, -1), xg, dy[:, 0]), "torch.logsumexp"),
        ("logsumexp" + KERNELS, "forward+backward",
         _with_backward(lambda t: onlinesoftmax.logsumexp(t, -1), xg, dy[:, 0]),
         _with_backward(lambda t: torch.logsumexp(t, -1), xg, dy[:, 0]), "torch.logsumexp"),
        ("softmax", "forward+backward", _with_backward(lambda t: onlinesoftmax.softmax(t, -1), xg, dy),
         _with_backward(lambda t: torch.softmax(t, -1), xg, dy), "torch.softmax"),
        ("log_softmax", "forward+backward", _with_backward(lambda t: onlinesoftmax.log_softmax(t, -1), xg, dy),
         _with_backward(lambda t: torch.log_softmax(t, -1), xg, dy), "torch.log_softmax"),
        # What a user's call of this size gets (torch's kernel, by the eager torch route), then the
        # Triton kernels' own host path at the same size (the route turned off: KERNELS).
        ("softmax 64x4096", "forward", lambda: onlinesoftmax.softmax(xk, -1), lambda: torch.softmax(xk, -1),
         "torch.softmax"),
        ("softmax 64x4096" + KERNELS, "forward", lambda: onlinesoftmax.softmax(xk, -1), lambda: torch.softmax(xk, -1),
         "torch.softmax"),
        ("log_softmax 64x4096" + KERNELS, "forward", lambda: onlinesoftmax.log_softmax(xk, -1),
         lambda: torch.log_softmax(xk, -1), "torch.log_softmax"),
        ("softmax 64x4096", "forward+backward", _with_backward(lambda t: onlinesoftmax.softmax(t, -1), xkg, dyk),
         _with_backward(lambda t: torch.softmax(t, -1), xkg, dyk), "torch.softmax"),
        ("softmax 64x4096" + KERNELS, "forward+backward",
         _with_backward(lambda t: onlinesoftmax.softmax(t, -1), xkg, dyk),
         _with_backward(lambda t: torch.softmax(t, -1), xkg, dyk), "torch.softmax"),
        ("softmax_topk", "softmax_topk", lambda: onlinesoftmax.softmax_topk(x, 8),
         lambda: torch.topk(torch.softmax(x, -1), 8), "torch.topk(torch.softmax)"),
    ]
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)
    sdpa = F.scaled_dot_product_attention
    out += [
        ("attention", "attention forward", lambda: onlinesoftmax.attention(q, k, v, causal=True),
         lambda: sdpa(q, k, v, is_causal=True), "SDPA"),
        ("attention", "forward+backward", lambda: onlinesoftmax.attention(qg, kg, vg, causal=True).backward(do),
         lambda: sdpa(qg, kg, vg, is_causal=True).backward(do), "SDPA"),
    ]
    qd = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((1,), 200, dtype=torch.int32, device="cuda")
    kd, vd = (t[:, :200].transpose(1, 2) for t in (kc, vc))
    out.append(("attention_with_kvcache", "attention forward",
                lambda: onlinesoftmax.attention_with_kvcache(qd, kc, vc, cache_seqlens=lens),
                lambda: sdpa(qd.transpose(1, 2), kd, vd, enable_gqa=True), "SDPA (enable_gqa)"))
    if hasattr(onlinesoftmax, "cross_entropy"):
        logits = torch.randn(8, 1024, device="cuda", requires_grad=True)
        target = torch.randint(0, 1024, (8,), device="cuda")
        out.append(("cross_entropy", "forward+backward", lambda: onlinesoftmax.cross_entropy(logits, target).backward(),
                    lambda: F.cross_entropy(logits, target).backward(), "F.cross_entropy"))
    return out


def _verdict(kind: str, ours: float, theirs: float) -> tuple[str, bool]:
    rule, value = TARGETS.get(kind, ("plus", 5.0))
    if rule == "plus":
        return f"<= {theirs + value:.1f} (torch + {value:g})", ours <= theirs + value
    if rule == "times":
        return f"<= {theirs * value:.1f} ({value:g}x torch)", ours <= theirs * value
    return f"< {value:g}", ours < value


def run(args) -> int:
    rows, lines = [], ["| op | call | ours us | peer | peer us | target | met |", "|---|---|---|---|---|---|---|"]
    import onlinesoftmax
    from ..ops.softmax import plan as softmax_plan

    for name, kind, ours, theirs, peer in cases():
        route_off = contextlib.nullcontext
        if name.endswith(KERNELS):
            route_off = functools.partial(onlinesoftmax.override_plan, "softmax",
                                          EAGER_HOST_US=softmax_plan.EAGER_ROUTE_OFF)
        ours_us, theirs_us = host_us(ours, theirs, route_off)
        target, met = _verdict(kind, ours_us, theirs_us)
        direction = "forward+backward" if kind == "forward+backward" else "forward"
        rows += [harness.Row(name, "host", direction, "onlinesoftmax", ms=ours_us / 1e3),
                 harness.Row(name, "host", direction, peer, ms=theirs_us / 1e3)]
        lines.append(f"| {name} | {kind} | {ours_us:.1f} | {peer} | {theirs_us:.1f} | {target} | "
                     f"{'yes' if met else '**no**'} |")
        print(lines[-1], flush=True)
    notes = (f"Host microseconds per eager call (median of {REPEATS} runs of {CALLS} calls; tiny CUDA inputs, "
             "the GPU keeping up).\n\n" + "\n".join(lines))
    harness.write_results(args, "host", rows, None, notes, table=False, bars=False)
    return 0
