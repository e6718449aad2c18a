"""Every attention kernel variant once at tiny sizes, for compute-sanitizer (memcheck, racecheck).

Head dims 32 / 80 (padded to 128) / 256, causal modes, GQA, lengths ending mid-block, a row with
no visible key, TMA descriptors and pointer loads, forward and backward.
"""

import importlib

import torch

attention_module = importlib.import_module("onlinesoftmax.attention")

torch.manual_seed(0)
for head_dim in (32, 80, 256):
    for mode in ("none", "top_left", "bottom_right"):
        for use_descriptor in (True, False):
            q = torch.randn(1, 4, 70, head_dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, 2, 45, head_dim, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(1, 2, 45, head_dim, device="cuda", dtype=torch.bfloat16)
            out, lse = attention_module.launch_forward(q, k, v, mode, head_dim ** -0.5, use_descriptor=use_descriptor)
            grads = attention_module.launch_backward(torch.randn_like(out), q, k, v, out, lse, mode, head_dim ** -0.5,
                                                     use_descriptor=use_descriptor)
            torch.cuda.synchronize()
            bad = [name for name, t in zip(("out", "dq", "dk", "dv"), (out, *grads)) if not torch.isfinite(t).all()]
            print(f"D={head_dim} {mode} descriptor={use_descriptor}: {'non-finite ' + str(bad) if bad else 'finite'}")
