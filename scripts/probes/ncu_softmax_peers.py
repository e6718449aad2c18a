"""Softmax kernels, ours and Quack's, one call each inside an NVTX range, for Nsight Compute (GPU).

    ncu --nvtx --nvtx-include "profile/" --clock-control none --metrics ... python scripts/probes/ncu_softmax_peers.py [forward|backward]

Each case runs twice untimed (compilation, caches) and then once inside the range "profile", so
ncu profiles only that call's kernels; the case's name is printed just before it. Used to compare
DRAM throughput, occupancy and waves where the bench has ours behind Quack on rows that fit on chip
(docs/notes/2026-11/ncu_softmax_peers-h100.txt).
"""

import importlib
import sys

import torch

import onlinesoftmax
from onlinesoftmax.ops.softmax import launch as softmax_launch

CASES = [  # (direction, rows, cols)
    ("forward", 1024, 32768),
    ("forward", 4096, 4096),
    ("backward", 4096, 4096),
    ("backward", 256, 151936),
]


def main():
    quack = importlib.import_module("quack.softmax")
    impls = {
        "forward": {"onlinesoftmax": lambda x, dy: onlinesoftmax.softmax(x), "quack": lambda x, dy: quack.softmax_fwd(x)},
        "backward": {"onlinesoftmax": lambda y, dy: softmax_launch.launch_backward(y, dy, 1, False),
                     "quack": lambda y, dy: quack.softmax_bwd(dy, y)},
    }
    only = sys.argv[1] if len(sys.argv) > 1 else None
    for direction, rows, cols in CASES:
        if only and direction != only:
            continue
        x = torch.randn(rows, cols, device="cuda").bfloat16()
        a = torch.softmax(x.float(), -1).bfloat16() if direction == "backward" else x
        dy = torch.randn_like(x)
        for name, fn in impls[direction].items():
            for _ in range(2):
                fn(a, dy)
            torch.cuda.synchronize()
            print(f"=== {name} {direction} bfloat16 {rows}x{cols}", flush=True)
            torch.cuda.nvtx.range_push("profile")
            fn(a, dy)
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
