"""Would persistent programs speed the backward kernel? (GPU)

The backward kernel: one tile a program (the plan) against persistent programs looping over the
(row, tile) pairs (the SKIP_UNIT form with an upstream gradient of 0.5, so every tile is written),
at 1-16 programs an SM (plan.SCALE_PROGRAMS_PER_SM); a copy of the same bytes beside. GB/s of bytes
read + written, do_bench with the L2 flushed, inputs rotated past the L2.

    python scripts/probes/probe_cross_entropy_backward_programs.py
"""

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import copy_bandwidth_gbs, rotation_count, time_ms
from onlinesoftmax.ops.cross_entropy import launch, plan

OPTIONS = (-100, "mean", 0.0, 0.0, 0.0, 1.0)
PROGRAMS_PER_SM = (1, 2, 3, 4, 6, 8, 16)

SHAPES = [(torch.bfloat16, 8192, 128256), (torch.bfloat16, 8192, 32000), (torch.bfloat16, 4096, 256000),
          (torch.bfloat16, 16384, 50257), (torch.bfloat16, 1024, 128256), (torch.bfloat16, 333, 256003),
          (torch.float32, 8192, 128256), (torch.float32, 8192, 32000), (torch.float32, 2048, 65537)]


def main():
    print(f"# {torch.cuda.get_device_name()} copy {copy_bandwidth_gbs():.0f} GB/s")
    for dtype, rows, cols in SHAPES:
        nbytes = rows * cols * dtype.itemsize
        n = max(2, rotation_count(2 * nbytes))
        xs = [torch.randn(rows, cols, device="cuda", dtype=dtype) for _ in range(n)]
        dxs = [torch.empty_like(x) for x in xs]
        target = torch.randint(0, cols, (rows,), device="cuda")
        loss, lse, lse_low, denom = launch.launch_forward(xs[0], target, None, *OPTIONS, False)
        grad = torch.tensor(0.5, device="cuda")
        chosen = plan.choose("backward", rows, cols, dtype, torch.device("cuda"))
        cells = []
        for label, per_sm in [("grid", None)] + [(f"p{k}", k) for k in PROGRAMS_PER_SM]:
            with onlinesoftmax.override_plan("cross_entropy", SCALE_PROGRAMS_PER_SM=per_sm or 4):
                recipe = launch.backward_recipe(chosen, xs[0], dxs[0], target, xs[0], False, lse, lse_low, grad,
                                                *OPTIONS, skip_unit=per_sm is not None).bind()
                ms = time_ms(lambda x, dx: recipe(x, dx, target, x, denom, lse, lse_low, grad),
                             list(zip(xs, dxs)))
            cells.append(f"{label} {2 * nbytes / ms / 1e6:5.0f}")
        copy_ms = time_ms(lambda x, dx: dx.copy_(x), list(zip(xs, dxs)))
        cells.append(f"copy {2 * nbytes / copy_ms / 1e6:5.0f}")
        print(f"{str(dtype)[6:]:9s} {rows:6d}x{cols:<7d} tiles {chosen.grid[1]:3d} warps {chosen.num_warps} | "
              + " | ".join(cells), flush=True)
        xs.clear()
        dxs.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
