"""Where the in-place cross-entropy's second read comes from: its kernels under Nsight Compute (GPU).

    ncu --nvtx --nvtx-include "profile/" --clock-control none \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
        python scripts/probes/ncu_cross_entropy_reread.py

The plan's in-place forward (two_pass: one program a row, each row read twice) and two variants of
probe_cross_entropy_split_reread.py (a persistent grid of one program an SM over whole rows, and
over halves of rows that wait for each other), on bf16 8192 x 128256 logits (2.1 GB): if the second
read came from L2, device memory would serve about 2.1 GB of reads, not 4.2. Each runs twice
untimed and then once inside the NVTX range "profile"; its name is printed just before.
"""

import torch

from onlinesoftmax.ops.cross_entropy import launch
from probe_cross_entropy_split_reread import SplitReread


def main():
    rows, cols = 8192, 128256
    x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
    target = torch.randint(0, cols, (rows,), device="cuda")
    cases = {
        "plan in place (two_pass)": lambda: launch.launch_forward(x, target, None, -100, "mean", 0.0, 0.0, 0.0, 1.0,
                                                                  False, None, inplace=True),
        "whole rows, 1 an SM, 32 warps, 16K": SplitReread(rows, cols, 1, 1, 16384, 32),
        "halves, 1 an SM, 32 warps, 16K": SplitReread(rows, cols, 2, 1, 16384, 32),
    }
    for name, fn in cases.items():
        call = fn if name.startswith("plan") else (lambda fn=fn: fn(x, target))
        for _ in range(2):
            call()
        torch.cuda.synchronize()
        print(f"=== {name} bfloat16 {rows}x{cols}", flush=True)
        torch.cuda.nvtx.range_push("profile")
        call()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
