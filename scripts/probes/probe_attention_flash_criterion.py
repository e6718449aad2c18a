"""flash-attention's accuracy criterion for our attention: max |error| against float64 of the output
and of dQ, dK, dV, over the max |error| of the same math done in bf16 (flash-attention's tests
require at most 2). Runs on the GPU, or on CPU tensors under TRITON_INTERPRET=1 (short lengths).

    python scripts/probes/probe_attention_flash_criterion.py [--lengths 37,130] [--head-dims 64,128]
"""

import argparse

import torch

import onlinesoftmax


def math_attention(q, k, v, causal):
    """Attention as plain tensor math in q's dtype (products and softmax each rounded to it)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        seen = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~seen, float("-inf"))
    return torch.softmax(s, -1) @ v


def ratios(seq, head_dim, heads_q, heads_kv, causal, seed, device):
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
    return [((a.double() - c).abs().max() / (b.double() - c).abs().max()).item() for a, b, c in zip(got, same, ref)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="37,130")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device {device}; ratio = ours' max |error| / bf16 math's, against float64 (flash-attention allows 2)")
    print("S D heads causal seed | out dq dk dv")
    for seq in map(int, args.lengths.split(",")):
        for head_dim in map(int, args.head_dims.split(",")):
            for heads in ((2, 2), (4, 1)):
                for causal in (False, True):
                    for seed in range(args.seeds):
                        r = ratios(seq, head_dim, *heads, causal, seed, device)
                        print(f"{seq} {head_dim} {heads[0]}/{heads[1]} {causal} {seed} | " + " ".join(f"{x:.2f}" for x in r),
                              flush=True)


if __name__ == "__main__":
    main()
