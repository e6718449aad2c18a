"""Run every Triton kernel and strategy once on small CUDA tensors (for compute-sanitizer).

    compute-sanitizer --tool memcheck python scripts/exercise_kernels.py
    compute-sanitizer --tool racecheck python scripts/exercise_kernels.py

Each launch is checked against torch so a silent wrong answer fails too.
"""

import sys

import torch

import onlinesoftmax
from onlinesoftmax import plan


def main() -> int:
    torch.manual_seed(0)
    failures = 0
    cases = [("row_on_chip", "auto"), ("split_row_on_chip", "auto"), ("looped", "online"), ("looped", "safe"),
             ("split_row", "online"), ("split_row", "safe")]
    # Small split_row_on_chip chunks: the long rows below take 13 (forward) and 25 (backward)
    # programs each, which meet at their row's counter.
    plan.SPLIT_ON_CHIP_TILE_BYTES = {"forward": 4096, "backward": 2048}  # 1024 / 512 fp32 elements
    plan.SPLIT_ON_CHIP_WARP_BYTES = {"forward": 1024, "backward": 1024}
    # row_on_chip holds every 2-byte row in its own dtype (the plan: bf16 rows of 32768 only).
    plan.ROW_ON_CHIP_HOLD_INPUT_MIN_COLS = {torch.bfloat16: 1, torch.float16: 1}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for cols in (37, 3 * plan.STREAM_BLOCK[dtype.itemsize] + 17):
            for dim, shape in ((-1, (3, cols)), (0, (cols, 3))):
                x = (torch.randn(shape, device="cuda") * 3).to(dtype).requires_grad_()
                for strategy, algorithm in cases:
                    if strategy == "row_on_chip" and plan.next_power_of_2(cols) > plan.ROW_ON_CHIP_MAX_COLS[dtype.itemsize]:
                        continue
                    for ours, ref in ((onlinesoftmax.softmax, torch.softmax), (onlinesoftmax.log_softmax, torch.log_softmax)):
                        y = ours(x, dim, algorithm=algorithm, strategy=strategy)
                        dy = torch.randn_like(y)
                        (dx,) = torch.autograd.grad(y, x, dy)
                        x64 = x.detach().double().requires_grad_()
                        y64 = ref(x64, dim)
                        (dx64,) = torch.autograd.grad(y64, x64, dy.double())
                        err = ((y.double() - y64).norm() / y64.norm()).item()
                        gerr = ((dx.double() - dx64).norm() / dx64.norm()).item()
                        ok = err < 2e-2 and gerr < 2e-2
                        failures += not ok
                        print(f"{'ok ' if ok else 'BAD'} {ours.__name__:11s} {str(dtype):15s} {shape!s:14s} dim={dim:2d} "
                              f"{strategy:17s} {algorithm:6s} err={err:.1e} grad_err={gerr:.1e}")
                    lse = onlinesoftmax.logsumexp(x.detach(), dim, strategy=strategy)
                    lerr = ((lse.double() - torch.logsumexp(x.detach().double(), dim)).norm()).item()
                    failures += not lerr < 1e-1
    torch.cuda.synchronize()
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
