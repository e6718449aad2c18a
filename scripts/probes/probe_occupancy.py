"""Attention launches that hold one more program an SM (ATTENTION_MAX_REGISTERS): TFLOP/s of
the plan against variants of one kernel's config and register cap, on the GPU, same inputs, the
plan timed first and last (run-to-run spread). Backward alone (out and lse given): 2.5 x
4*B*Hq*S^2*D, half causal; forward: 4*B*Hq*S^2*D. Registers per variant: scripts/probes/kernel_resources.py.

    python scripts/probes/probe_occupancy.py [--dkdv-128 | --forward-64 | --dq-128]

By default: head dim 64's dK/dV variants, then head dim 128's dQ variants; --dkdv-128: head dim 128's dK/dV variants (key blocks of 64 on one warpgroup, two programs
an SM); --forward-64: the head dim 64 forward under register caps; --dq-128: head dim 128's dQ
on one warpgroup. Variants name the config they force and the cap; "plan" is whatever
ops/attention/plan.py holds when it runs (each log in docs/notes/2026-11/ says which plan that was).
"""

import sys

import torch
import triton.testing

import onlinesoftmax
from onlinesoftmax.ops.attention import launch as attention_launch
from onlinesoftmax.ops.attention import plan

gen = torch.Generator(device="cuda").manual_seed(0)


def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def force(kern, cfg, cap, head_dim, causal):
    """The plan with ``kern`` forced to ``cfg`` at every head dim (None: the plan's config) and its
    register cap at (head_dim, causal) set to ``cap`` (None: the plan's; 0: none)."""
    tables = {}
    if cfg:
        tables["ATTENTION_CONFIGS"] = dict(plan.ATTENTION_CONFIGS, **{kern: ((1 << 30, cfg, cfg),)})
    if cap is not None:
        tables["ATTENTION_MAX_REGISTERS"] = {**plan.ATTENTION_MAX_REGISTERS, (kern, head_dim, causal): cap}
    return onlinesoftmax.override_plan("attention", **tables)


def run(batch, heads_q, heads_kv, seq, head_dim, variants, forward=False):
    q = torch.randn(batch, heads_q, seq, head_dim, device="cuda", generator=gen).bfloat16()
    d_out = torch.randn_like(q)
    k, v = (torch.randn(batch, heads_kv, seq, head_dim, device="cuda", generator=gen).bfloat16() for _ in range(2))
    scale = head_dim ** -0.5
    for mode in ("none", "top_left"):
        causal = mode != "none"
        flops = (1 if forward else 2.5) * 4 * batch * heads_q * seq * seq * head_dim / (2 if causal else 1)
        out, lse = attention_launch.launch_forward(q, k, v, mode, scale)

        def call():
            if forward:
                return attention_launch.launch_forward(q, k, v, mode, scale)[:1]
            return attention_launch.launch_backward(d_out, q, k, v, out, lse, mode, scale)
        ref = call()
        line = f"{'forward' if forward else 'backward'} B{batch} H{heads_q}/{heads_kv} S{seq} D{head_dim} {mode}:"
        for name, kernel, config, cap in variants:
            with force(kernel, config, cap, head_dim, causal):
                err = max(rel(a, b) for a, b in zip(call(), ref))
                ms = time_ms(call)
            line += f" | {name} {flops / ms / 1e9:.1f}" + ("" if err < 1e-2 else f" WRONG ({err:.1e})")
        print(line, flush=True)


# (name, kernel, config or None for the plan's, cap: None keeps the plan's, 0 removes it)
D128 = [("plan", None, None, None), ("dq 128x64 uncapped", "backward_dq", (128, 64, 8, 2), 0),
        ("dq 128x32 uncapped", "backward_dq", (128, 32, 8, 2), 0), ("dq 128x32 cap128", "backward_dq", (128, 32, 8, 2), 128),
        ("dq 128x64 cap128", "backward_dq", (128, 64, 8, 2), 128), ("plan", None, None, None)]
D64 = [("plan", None, None, None), ("dkdv 32x64x3 uncapped", "backward_dkdv", (32, 64, 4, 3), 0),
       ("dkdv 32x64x2 uncapped", "backward_dkdv", (32, 64, 4, 2), 0),
       ("dkdv 32x64x2 cap168", "backward_dkdv", (32, 64, 4, 2), 168),
       ("dkdv 32x64x3 cap168", "backward_dkdv", (32, 64, 4, 3), 168), ("plan", None, None, None)]


D128_DKDV = [("plan", None, None, None), ("dkdv 32x64x3", "backward_dkdv", (32, 64, 4, 3), None),
             ("dkdv 32x64x2", "backward_dkdv", (32, 64, 4, 2), None), ("dkdv 16x64x3", "backward_dkdv", (16, 64, 4, 3), None),
             ("dkdv 16x64x2", "backward_dkdv", (16, 64, 4, 2), None), ("plan", None, None, None)]


FORWARD_64 = [("plan", None, None, None), ("cap 168", "forward", None, 168), ("cap 128", "forward", None, 128),
              ("cap 112", "forward", None, 112), ("plan", None, None, None)]
D128_DQ = [("plan", None, None, None), ("dq 64x64x3", "backward_dq", (64, 64, 4, 3), 0),
           ("dq 64x32x3", "backward_dq", (64, 32, 4, 3), 0), ("dq 64x64x2", "backward_dq", (64, 64, 4, 2), 0),
           ("plan", None, None, None)]
SHAPES_128 = [(4, 16, 16, 4096, 128), (8, 16, 16, 1024, 128), (1, 16, 16, 16384, 128), (2, 32, 8, 8192, 128)]


def main():
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__}")
    if "--forward-64" in sys.argv:
        run(4, 32, 32, 4096, 64, FORWARD_64, forward=True)
        return
    lists = {"--dkdv-128": D128_DKDV, "--dq-128": D128_DQ}
    chosen = next((lists[flag] for flag in lists if flag in sys.argv), None)
    if chosen is None:
        run(4, 32, 32, 4096, 64, D64)
    for shape in SHAPES_128:
        run(*shape, chosen or D128)


if __name__ == "__main__":
    main()
