"""Every attention kernel variant once at tiny sizes, for compute-sanitizer (memcheck, racecheck).

Head dims 32 / 80 (padded to 128) / 256, causal modes, GQA, lengths ending mid-block, a row with
no visible key, TMA descriptors and pointer loads, forward and backward; then the forward's row
descriptors (head dim 64, keys ending mid-block) and its warp-specialized loop (head dim 128, keys
in whole blocks, the last query block reading past its head).
"""

import importlib

import torch

from onlinesoftmax import cpu

attention_module = importlib.import_module("onlinesoftmax.attention")


def report(what, tensors):
    torch.cuda.synchronize()
    bad = [name for name, t in tensors if not torch.isfinite(t).all()]
    print(f"{what}: {'non-finite ' + str(bad) if bad else 'finite'}")


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
            report(f"D={head_dim} {mode} descriptor={use_descriptor}", zip(("out", "dq", "dk", "dv"), (out, *grads)))
for head_dim, n_keys in ((64, 200), (128, 256)):
    for mode in ("none", "top_left", "bottom_right"):
        q = torch.randn(2, 4, 70, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 2, n_keys, head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, 2, n_keys, head_dim, device="cuda", dtype=torch.bfloat16)
        out, lse = attention_module.launch_forward(q, k, v, mode, head_dim ** -0.5)
        chosen = attention_module.planner.last_attention_plan()
        ref, _ = cpu.attention_forward(q, k, v, mode, head_dim ** -0.5)  # blockwise torch, on the GPU
        error = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        report(f"D={head_dim} keys={n_keys} {mode} rows={chosen.row_descriptors} "
               f"warp-specialized={chosen.warp_specialize} rel err {error:.1e}",
               (("out", out), ("lse", lse[lse > float("-inf")])))
        assert error < 2e-2, error
