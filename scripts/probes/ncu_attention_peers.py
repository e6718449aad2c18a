"""Attention kernels, ours and SDPA's (cuDNN, FLASH), one call each inside an NVTX range, for Nsight Compute.

    ncu --nvtx --nvtx-include "profile/" --clock-control none --metrics ... python scripts/probes/ncu_attention_peers.py [forward|backward]

Each case runs twice untimed (compilation, caches) and then once inside the range "profile"; the
case's name is printed just before it. ncu matches ranges per thread and autograd runs a backward in
a thread of its own, so there the range is opened and closed by gradient hooks in that thread (on
the output's gradient before the backward kernels, on q's after them). Used to see where the time of our forward and backward goes
next to cuDNN's on the same shapes: tensor-pipe activity, the special-function (exp2) pipe, issue
slots and the reasons warps stall (docs/notes/2026-11/ncu_attention_peers-h100.txt).
"""

import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax

CASES = [  # (direction, batch, heads, seq, head_dim, causal)
    ("forward", 4, 16, 4096, 128, False),
    ("forward", 8, 16, 1024, 128, False),
    ("forward", 8, 16, 1024, 128, True),
    ("forward", 4, 32, 4096, 64, True),
    ("backward", 4, 16, 4096, 128, False),
]


def sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


class BackwardRange:
    """Hooks that open the NVTX range "profile" in autograd's thread around one backward."""

    def __init__(self):
        self.armed = False

    def attach(self, out, q):
        out.register_hook(self.open)
        q.register_hook(self.close)

    def open(self, grad):
        if self.armed:
            torch.cuda.nvtx.range_push("profile")

    def close(self, grad):
        if self.armed:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            self.armed = False


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    impls = {"onlinesoftmax": lambda q, k, v, causal: onlinesoftmax.attention(q, k, v, causal=causal),
             "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    only = sys.argv[1] if len(sys.argv) > 1 else None
    for direction, batch, heads, seq, head_dim, causal in CASES:
        if only and direction != only:
            continue
        q, k, v, d_out = (torch.randn(batch, heads, seq, head_dim, device="cuda", generator=gen).bfloat16()
                          for _ in range(4))
        for name, fn in impls.items():
            backward_range = BackwardRange()
            if direction == "forward":
                def call():
                    fn(q, k, v, causal)
            else:
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

                def call():
                    out = fn(qg, kg, vg, causal)
                    backward_range.attach(out, qg)
                    out.backward(d_out)
            for _ in range(2):
                call()
            torch.cuda.synchronize()
            print(f"=== {name} {direction} bfloat16 B{batch} H{heads} S{seq} D{head_dim}"
                  f"{' causal' if causal else ''}", flush=True)
            if direction == "forward":
                torch.cuda.nvtx.range_push("profile")
                call()
                torch.cuda.nvtx.range_pop()
            else:
                backward_range.armed = True
                call()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
