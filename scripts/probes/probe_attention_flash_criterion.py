"""flash-attention's accuracy criterion for our attention: max |error| against float64 of the output
and of dQ, dK, dV, over the max |error| of the same math done in bf16 (flash-attention's tests
require at most 2). Runs on the GPU, or on CPU tensors under TRITON_INTERPRET=1 (short lengths).

With --emulate, also the max |error| of ours and of a torch emulation of the algorithm (P and dS
rounded to bf16 before their products, fp32 accumulation), rounding to nearest and by truncation
(as Triton 3.6's interpreter converts float32 to bfloat16). Under the interpreter, --round-to-nearest
makes its bf16 casts round as the GPU's (onlinesoftmax._interpreter), as the CPU test run does.

    python scripts/probes/probe_attention_flash_criterion.py [--lengths 37,130] [--head-dims 64,128] [--emulate]
        [--round-to-nearest]
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax._device import interpreter_active
from onlinesoftmax._interpreter import round_bf16_casts_to_nearest
from onlinesoftmax.bench.attention_suite import math_attention


def truncated(t):
    """float32 to bfloat16 by dropping the low 16 bits (the interpreter's conversion), as float32."""
    return (t.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32)


def rounded(t):
    return t.to(torch.bfloat16).float()


def emulated(q, k, v, d_out, causal, to_bf16):
    """(out, dq, dk, dv) of the kernels' algorithm in torch: fp32 products of bf16 values, P and dS
    rounded by ``to_bf16`` before their products, delta from the rounded output."""
    group = q.shape[1] // k.shape[1]
    q, k, v, d_out = (t.detach().float() for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), d_out))
    scale = q.shape[-1] ** -0.5
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).tril(), float("-inf"))
    p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))
    out = to_bf16(to_bf16(p) @ v)
    delta = (d_out * out).sum(-1, keepdim=True)
    ds = p * (d_out @ v.transpose(-1, -2) - delta)
    dk = (to_bf16(ds).transpose(-1, -2) @ q) * scale
    dv = to_bf16(p).transpose(-1, -2) @ d_out
    fold = (lambda t: t.unflatten(1, (-1, group)).sum(2)) if group > 1 else (lambda t: t)
    return out, (to_bf16(ds) @ k) * scale, fold(dk), fold(dv)


def ratios(seq, head_dim, heads_q, heads_kv, causal, seed, device, emulate=False):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn((1, h, seq, head_dim), generator=gen).to(device=device, dtype=torch.bfloat16)
               .requires_grad_() for h in (heads_q, heads_kv, heads_kv))
    d_out = torch.randn((1, heads_q, seq, head_dim), generator=gen).to(device=device, dtype=torch.bfloat16)
    ours = onlinesoftmax.attention(q, k, v, causal=causal)
    low = math_attention(q, k, v, causal)
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact = math_attention(*wide, causal)
    got = (ours, *torch.autograd.grad(ours, (q, k, v), d_out))
    same = (low, *torch.autograd.grad(low, (q, k, v), d_out))
    ref = (exact, *torch.autograd.grad(exact, wide, d_out.double()))
    out = [((a.double() - c).abs().max() / (b.double() - c).abs().max()).item() for a, b, c in zip(got, same, ref)]
    if emulate:
        for tensors in (got, emulated(q, k, v, d_out, causal, rounded), emulated(q, k, v, d_out, causal, truncated)):
            out += [(a.double() - c).abs().max().item() for a, c in zip(tensors, ref)]
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="37,130")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--emulate", action="store_true", help="also the max errors of ours and of the emulations")
    parser.add_argument("--round-to-nearest", action="store_true",
                        help="under TRITON_INTERPRET=1: bf16 casts round to nearest even, as on the GPU")
    args = parser.parse_args()
    if args.round_to_nearest and interpreter_active():
        round_bf16_casts_to_nearest()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device {device}; ratio = ours' max |error| / bf16 math's, against float64 (flash-attention allows 2)")
    print("S D heads causal seed | out dq dk dv" + (" | max |error| (out dq dk dv): ours; emulation rounding "
                                                    "to nearest; emulation truncating" if args.emulate else ""))
    for seq in map(int, args.lengths.split(",")):
        for head_dim in map(int, args.head_dims.split(",")):
            for heads in ((2, 2), (4, 1)):
                for causal in (False, True):
                    for seed in range(args.seeds):
                        r = ratios(seq, head_dim, *heads, causal, seed, device, args.emulate)
                        text = " ".join(f"{x:.2f}" for x in r[:4])
                        for start in range(4, len(r), 4):
                            text += " | " + " ".join(f"{x:.1e}" for x in r[start:start + 4])
                        print(f"{seq} {head_dim} {heads[0]}/{heads[1]} {causal} {seed} | {text}", flush=True)


if __name__ == "__main__":
    main()
