"""Attention backward launches that hold one more program an SM (plan.ATTENTION_MAX_REGISTERS):
TFLOP/s of the backward alone (out and lse given; 2.5 x 4*B*Hq*S^2*D, half causal) for the plan
against variants of its dK/dV or dQ config and register cap, on the GPU, same inputs, the plan
timed first and last (run-to-run spread). Registers per variant: scripts/kernel_resources.py.

    python scripts/probe_backward_occupancy.py [--dkdv-128]

By default: head dim 64's dK/dV variants, then head dim 128's dQ variants; --dkdv-128: head dim
128's dK/dV variants (key blocks of 64 on one warpgroup, two programs an SM) instead.

Variants name the config they force and the cap; "plan" is whatever plan.py holds when it runs
(benchmarks/results/probe_backward_occupancy-h100.log says which plan that was).
"""

import importlib
import sys

import torch
import triton.testing

from onlinesoftmax import plan

attention_module = importlib.import_module("onlinesoftmax.attention")
gen = torch.Generator(device="cuda").manual_seed(0)
saved = dict(plan.ATTENTION_CONFIGS)
saved_caps = dict(plan.ATTENTION_MAX_REGISTERS)


def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def force(kern, cfg, cap, head_dim, causal):
    plan.ATTENTION_CONFIGS.update(saved)
    plan.ATTENTION_MAX_REGISTERS.clear()
    plan.ATTENTION_MAX_REGISTERS.update(saved_caps)
    if cfg:
        plan.ATTENTION_CONFIGS[kern] = ((1 << 30, cfg, cfg),)
    if cap is not None:
        plan.ATTENTION_MAX_REGISTERS[(kern, head_dim, causal)] = cap


def run(batch, heads_q, heads_kv, seq, head_dim, variants):
    q = torch.randn(batch, heads_q, seq, head_dim, device="cuda", generator=gen).bfloat16()
    d_out = torch.randn_like(q)
    k, v = (torch.randn(batch, heads_kv, seq, head_dim, device="cuda", generator=gen).bfloat16() for _ in range(2))
    scale = head_dim ** -0.5
    for mode in ("none", "top_left"):
        causal = mode != "none"
        flops = 2.5 * 4 * batch * heads_q * seq * seq * head_dim / (2 if causal else 1)
        out, lse = attention_module.launch_forward(q, k, v, mode, scale)
        force(None, None, None, head_dim, causal)
        ref = attention_module.launch_backward(d_out, q, k, v, out, lse, mode, scale)
        line = f"B{batch} H{heads_q}/{heads_kv} S{seq} D{head_dim} {mode}:"
        for name, kernel, config, cap in variants:
            force(kernel, config, cap, head_dim, causal)
            grads = attention_module.launch_backward(d_out, q, k, v, out, lse, mode, scale)
            err = max(rel(a, b) for a, b in zip(grads, ref))
            ms = time_ms(lambda: attention_module.launch_backward(d_out, q, k, v, out, lse, mode, scale))
            line += f" | {name} {flops / ms / 1e9:.1f}" + ("" if err < 1e-2 else f" WRONG ({err:.1e})")
        print(line, flush=True)
    force(None, None, None, head_dim, False)


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


def main():
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__}")
    dkdv_128 = "--dkdv-128" in sys.argv
    if not dkdv_128:
        run(4, 32, 32, 4096, 64, D64)
    for shape in [(4, 16, 16, 4096, 128), (8, 16, 16, 1024, 128), (1, 16, 16, 16384, 128), (2, 32, 8, 8192, 128)]:
        run(*shape, D128_DKDV if dkdv_128 else D128)


if __name__ == "__main__":
    main()
