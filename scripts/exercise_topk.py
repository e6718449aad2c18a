"""Every softmax_topk kernel variant once at small sizes, for compute-sanitizer (memcheck, racecheck).

Single and split launches, K lists of 2 / 8 / 64 / 256, every selection (the running list, one or
two kept per lane, each with a second read of the chunk or of the suspect lanes), contiguous and
strided columns, fp32 and bf16, rows ending mid-block, NaN and all -inf rows, and the backward
kernel on both plans.
"""

import importlib

import torch

topk_module = importlib.import_module("onlinesoftmax.topk")

torch.manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    for k in (1, 5, 50, 256):
        for strategy, num_chunks in (("single", None), ("split", 3)):
            for strided in (False, True):
                # The plan's selection; contiguous runs also force every other one k allows (the
                # running list, one or two kept per lane, each with either second read).
                keeps = [(None, None)] if strided else [(None, None), (0, None)] + [
                    (keep, second_read) for keep in (1, 2) if k <= (16, 64)[keep - 1] for second_read in ("chunk", "lanes")]
                for lane_keep, second_read in keeps:
                    base = torch.randn(700, 6, device="cuda", dtype=dtype)
                    x2 = base.t() if strided else base.t().contiguous()  # 6 rows of 700 columns
                    x2[1, 10] = float("nan")
                    x2[2] = float("-inf")
                    x2[4, 3:300:64] = 30.0  # several of the top k in one lane of 64: a second read
                    values, indices, lse = topk_module.launch_forward(x2, k, 0.9, strategy, 64, num_chunks, lane_keep,
                                                                      second_read)
                    dv = torch.randn_like(values, dtype=torch.float32)
                    dx = topk_module.launch_backward(x2, lse, indices, dv, torch.randn_like(lse), 0.9, strategy, 64,
                                                     num_chunks)
                    torch.cuda.synchronize()
                    ok = torch.isfinite(values[3:]).all() and torch.isfinite(dx[3:]).all()
                    assert (indices >= 0).all() and (indices < 700).all()
                    print(f"{str(dtype)[6:]} k={k} {strategy} strided={strided} lane_keep={lane_keep} "
                          f"second_read={second_read}: "
                          f"{'finite' if ok else 'NON-FINITE'}")
