"""Rows that start and end on 16-byte boundaries but whose length is no multiple of 16 elements (GPU).

Triton learns divisibility only from integers divisible by 16, so rows of 95704 bf16 (a multiple of
8) or 32004 fp32 (of 4) were read one element a load, though each starts on a 16-byte boundary: a
seeded sweep shape, bf16 1742 x 95704, ran log_softmax at 0.69x torch. This times forward and
backward of such rows beside their aligned neighbour (the next multiple of 16) and torch, in one
process, so that the same script run on two versions of the library shows what a change did.

    python scripts/probes/probe_whole_granule_rows.py
"""

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import rotation_count, time_ms
from onlinesoftmax.ops.softmax import launch

SHAPES = {torch.bfloat16: [(4096, 1000), (4096, 4104), (2048, 8200), (1024, 32008), (4096, 32008), (1742, 95704),
                           (64, 50264), (512, 128264), (8, 256008)],
          torch.float32: [(4096, 1000), (4096, 4100), (1024, 32004), (1742, 95704), (256, 50260), (64, 128260),
                          (1, 32004)]}
OPS = (("softmax", onlinesoftmax.softmax, torch.softmax, torch.ops.aten._softmax_backward_data),
       ("log_softmax", onlinesoftmax.log_softmax, torch.log_softmax, torch.ops.aten._log_softmax_backward_data))


def times(rows, cols, dtype, gen):
    """ms: (forward ours, torch), (backward ours, torch) for each op."""
    sets = [((torch.randn(rows, cols, generator=gen) * 3).to("cuda", dtype),
             torch.randn(rows, cols, generator=gen).to("cuda", dtype))
            for _ in range(rotation_count(3 * rows * cols * dtype.itemsize))]
    out = {}
    for op, ours, theirs, torch_backward in OPS:
        log = op == "log_softmax"
        ys = [(theirs(x, -1), dy) for x, dy in sets]
        out[op] = (time_ms(lambda x, dy: ours(x, -1), sets), time_ms(lambda x, dy: theirs(x, -1), sets),
                   time_ms(lambda y, dy: launch.launch_backward(y, dy, 1, log), ys),
                   time_ms(lambda y, dy: torch_backward(dy, y, 1, y.dtype), ys))
    return out


def main():
    gen = torch.Generator().manual_seed(0)
    print("dtype op shape | forward plan | ms forward: ours, torch, aligned neighbour ours | backward: ours, torch, "
          "neighbour", flush=True)
    for dtype, shapes in SHAPES.items():
        for rows, cols in shapes:
            here = times(rows, cols, dtype, gen)
            neighbour = times(rows, cols + (-cols) % 16, dtype, gen)
            for op, *_ in OPS:
                f, ft, b, bt = here[op]
                chosen = launch.forward_call(torch.empty(rows, cols, device="cuda", dtype=dtype), 1, op).plan
                name = str(dtype).replace("torch.", "")
                print(f"{name} {op} {rows}x{cols} | {chosen.strategy} | {f:.4f} {ft:.4f} {neighbour[op][0]:.4f} "
                      f"({ft / f:.2f}x torch, {neighbour[op][0] / f:.2f}x neighbour) | {b:.4f} {bt:.4f} "
                      f"{neighbour[op][2]:.4f} ({bt / b:.2f}x, {neighbour[op][2] / b:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
