"""Host time of an eager attention training step on tiny inputs (GPU): as planned, and with the
backward's TMA descriptors off, beside SDPA, then a cProfile of our step.

    python scripts/probes/probe_attention_host.py

The case is bench host's (B1 H2 S128 D64 bf16, causal): the GPU's work is a few microseconds, so
the host's time per call is the step's. Output of the recorded run:
docs/notes/2026-11/host_attention_descriptors-h100.log.
"""
import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench.host_suite import host_us_alone, print_profile
from onlinesoftmax.ops.attention import plan

q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
do = torch.randn_like(q)


def ours():
    onlinesoftmax.attention(qg, kg, vg, causal=True).backward(do)


print("sdpa fwd+bwd", round(host_us_alone(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)), 1))
print("ours fwd+bwd", round(host_us_alone(ours), 1))
print("ours fwd only (no grad)", round(host_us_alone(lambda: onlinesoftmax.attention(q, k, v, causal=True)), 1))
print("ours fwd with grad", round(host_us_alone(lambda: onlinesoftmax.attention(qg, kg, vg, causal=True)), 1))
with onlinesoftmax.override_plan("attention", ATTENTION_USE_DESCRIPTOR=dict.fromkeys(plan.ATTENTION_USE_DESCRIPTOR, False)):
    print("ours fwd+bwd, no descriptors", round(host_us_alone(ours), 1))
print_profile(ours, 25, calls=2000)
