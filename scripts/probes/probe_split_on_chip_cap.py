"""split_row_on_chip's register cap at rows the sweep had not seen (GPU).

A seeded random shape of `bench sweep` (bf16 softmax 1742 x 95704, forward) took 2.64 ms against
torch's 0.47: the plan was split_row_on_chip, 12 chunks of 7984 in 8192-element tiles, under the
32-register cap (plan.SPLIT_ON_CHIP_MAX_REGISTERS). This times the forward of such shapes with the
plan as it is, with the cap off, and on the split_row strategy, beside torch, in one process.

    python scripts/probes/probe_split_on_chip_cap.py
"""

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import rotation_count, time_ms
from onlinesoftmax.ops.softmax import plan

SHAPES = [(1742, 95704), (1742, 95712), (2048, 95704), (1000, 95704), (512, 95704), (1742, 65536), (1742, 131072),
          (256, 151936), (2048, 50304), (4096, 32000)]
CAP_OFF = {op: 0 for op in plan.SPLIT_ON_CHIP_MAX_REGISTERS}


def main():
    gen = torch.Generator().manual_seed(0)
    print("dtype op shape | plan (chunks, cap) | ms: plan, cap off, split_row, torch", flush=True)
    for dtype in (torch.bfloat16, torch.float32):
        for rows, cols in SHAPES:
            sets = [((torch.randn(rows, cols, generator=gen) * 3).to("cuda", dtype),)
                    for _ in range(rotation_count(2 * rows * cols * dtype.itemsize))]
            for op, fn, torch_fn in (("softmax", onlinesoftmax.softmax, torch.softmax),
                                     ("log_softmax", onlinesoftmax.log_softmax, torch.log_softmax)):
                chosen = plan.choose(op, rows, cols, dtype, sets[0][0].device, "auto")
                ms = [time_ms(lambda x: fn(x, -1), sets)]
                with onlinesoftmax.override_plan("softmax", SPLIT_ON_CHIP_MAX_REGISTERS=CAP_OFF):
                    ms.append(time_ms(lambda x: fn(x, -1), sets))
                ms.append(time_ms(lambda x: fn(x, -1, strategy="split_row"), sets))
                ms.append(time_ms(lambda x: torch_fn(x, -1), sets))
                name = str(dtype).replace("torch.", "")
                print(f"{name} {op} {rows}x{cols} | {chosen.strategy} {chosen.num_chunks} x {chosen.chunk_size}, "
                      f"cap {chosen.max_registers} | " + " ".join(f"{m:.4f}" for m in ms), flush=True)


if __name__ == "__main__":
    main()
