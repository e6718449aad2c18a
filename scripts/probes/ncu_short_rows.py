"""log_softmax over short rows, ours (row_on_chip, the plan's launch) and torch's, one call each inside
an NVTX range, for Nsight Compute (GPU).

    ncu --nvtx --nvtx-include "profile/" --clock-control none --metrics ... python scripts/probes/ncu_short_rows.py

Each case runs twice untimed and once inside the range "profile"; its name and our plan are
printed just before. For the rows of 129-300 elements that half fill their tile, where torch's
log_softmax stays ahead of ours under CUDA graphs (docs/perf-h200.md): instructions, occupancy,
load requests and stalls beside torch's warp-per-row kernel.
"""

import torch

import onlinesoftmax
from onlinesoftmax.ops.softmax import plan

CASES = [  # (dtype, rows, cols)
    (torch.float32, 3000, 273),
    (torch.float32, 6000, 143),
    (torch.float32, 1207, 143),
    (torch.bfloat16, 3000, 143),
    (torch.float32, 3000, 256),  # a full tile, for contrast
]


def main():
    impls = {"onlinesoftmax": lambda x: onlinesoftmax.log_softmax(x, -1, strategy="row_on_chip"),
             "torch": lambda x: torch.log_softmax(x, -1)}
    for dtype, rows, cols in CASES:
        x = torch.randn(rows, cols, device="cuda", dtype=dtype)
        for name, fn in impls.items():
            for _ in range(2):
                fn(x)
            torch.cuda.synchronize()
            chosen = plan.last_plan().describe() if name == "onlinesoftmax" else ""
            print(f"=== {name} log_softmax {str(dtype)[6:]} {rows}x{cols} {chosen}", flush=True)
            torch.cuda.nvtx.range_push("profile")
            fn(x)
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
