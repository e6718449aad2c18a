"""Why in-place cross-entropy rows off 16-byte vectors run slower than their aligned neighbour: the
kernels under Nsight Compute (GPU).

    ncu --nvtx --nvtx-include "profile/" --clock-control none --kernel-name regex:"two_pass|stream" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
        --section Occupancy --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,\
l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,\
l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,\
smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,\
lts__t_requests_srcunit_tex_op_read.sum \
        python scripts/probes/ncu_cross_entropy_edges.py [--rows 8192] [--cases ...]

In place (``inplace_backward=True``), bf16, each case under its own tables, so that it stays what it
names as the plan changes: rows of 50304 columns (whole vectors) and 50257 on the kernel for plain
rows without a register cap (plan.PLAIN_MAX_REGISTERS; 50257 over runs of 16 or 128 bytes, its
partial first and last runs element-wise), 50257 on the general kernel (the stream kernel with
WRITE_GRAD: the plan before plan.PLAIN_EDGES_UP_TO), then both on the plan. Each case runs twice
untimed and then once inside the NVTX range "profile"; its name and plan are printed just before.
Times: scripts/tune/sweep_cross_entropy.py --graph with the variants these tables make.
"""

import argparse

import torch

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.ops.cross_entropy import launch as ce_launch, plan as ce_plan

UNCAPPED = dict(PLAIN_MAX_REGISTERS={})
CASES = {
    "50304 uncapped": (50304, UNCAPPED),
    "50257 general kernel": (50257, dict(PLAIN_EDGES_UP_TO={4: 0, 2: 0}, **UNCAPPED)),
    "50257 plain runs of 16 B, uncapped": (50257, dict(PLAIN_EDGES={4: (0, 16), 2: (0, 16)}, **UNCAPPED)),
    "50257 plain runs of 128 B, uncapped": (50257, dict(PLAIN_EDGES={4: (0, 128), 2: (0, 128)}, **UNCAPPED)),
    "50304 plan": (50304, {}),
    "50257 plan": (50257, {}),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    step = suite._step(lambda x, t: onlinesoftmax.cross_entropy(x, t, inplace_backward=True))
    for name in args.cases:
        cols, overrides = CASES[name]
        inputs = suite.case((args.rows, cols), torch.bfloat16).make_inputs(gen)
        with onlinesoftmax.override_plan("cross_entropy", **overrides):
            chosen = ce_plan.choose("forward_grad", args.rows, cols, torch.bfloat16, torch.device("cuda"),
                                    **ce_launch.row_options(False, 0.0, 0.0, 0.0, False))
            print(f"=== {name} bfloat16 {args.rows}x{cols}: {chosen.strategy} block {chosen.block} tail {chosen.tail} "
                  f"warps {chosen.num_warps} align {chosen.align} edges {chosen.edges} plain {chosen.plain} "
                  f"registers cap {chosen.max_registers}", flush=True)
            for _ in range(2):
                step(*inputs)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("profile")
            step(*inputs)
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
