"""The log_softmax backward at rows of 4K-17K elements under other looped / row_on_chip configs (GPU).

probe_backward_mid_rows.py found it behind torch's on every strategy (bf16 2048 x 8200: row_on_chip
0.0456 ms, looped 0.0486, torch 0.0418). This times looped at other stream blocks and warps and
row_on_chip at other warps (plan tables overridden), beside torch, in one process. With
``--check``, instead: the plan's log_softmax backward (plan.LOG_BACKWARD_STREAM) against the
looped config it replaced, on the shapes where the plan takes looped, beside torch. With ``--softmax``:
the softmax backward (not log) at the same configs, on the shapes where its plan takes looped.

    python scripts/probes/probe_log_backward_configs.py [--check | --softmax]
"""

import sys

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import rotation_count, time_ms
from onlinesoftmax.ops.softmax import launch

SHAPES = [(torch.bfloat16, 2048, 8200), (torch.bfloat16, 1024, 17000), (torch.bfloat16, 4096, 4104),
          (torch.bfloat16, 2048, 8192), (torch.bfloat16, 9682, 8604), (torch.float32, 4096, 4100),
          (torch.float32, 2048, 8192)]
LOOPED = [(block, warps) for block in (2048, 4096, 8192) for warps in (4, 8, 16)]
ON_CHIP_WARPS = (8, 16, 32)


# Shapes where the plan takes looped for the log_softmax backward: 2-byte rows under 60% of their
# power-of-two tile, and rows too long for split_row_on_chip at more rows than split_row takes.
CHECK_SHAPES = [(torch.bfloat16, 2048, 8200), (torch.bfloat16, 1024, 17000), (torch.bfloat16, 9682, 8604),
                (torch.bfloat16, 4096, 9500), (torch.bfloat16, 2048, 9000), (torch.float16, 2048, 8200),
                (torch.bfloat16, 300, 600000), (torch.float32, 300, 600000)]
REPLACED = {2: (8192, 8), 4: (4096, 8)}
# Shapes where the plan takes looped for the softmax backward: 2-byte rows under 60% of their
# power-of-two tile that take no tail (rows off 16-byte boundaries with a head over
# ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD).
SOFTMAX_SHAPES = [(torch.bfloat16, 9682, 8604), (torch.bfloat16, 4096, 9500), (torch.float16, 9682, 8604),
                  (torch.bfloat16, 2048, 8604), (torch.bfloat16, 1024, 17004)]
TORCH_BACKWARD = {True: torch.ops.aten._log_softmax_backward_data, False: torch.ops.aten._softmax_backward_data}


def backward_sets(gen, dtype, rows, cols, log=True):
    """(y, dy) input sets of a log_softmax (or softmax) backward, rotated beyond the L2."""
    forward = torch.log_softmax if log else torch.softmax
    return [(forward(torch.randn(rows, cols, generator=gen).to("cuda", dtype) * 3, -1),
             torch.randn(rows, cols, generator=gen).to("cuda", dtype))
            for _ in range(rotation_count(3 * rows * cols * dtype.itemsize))]


def check():
    gen = torch.Generator().manual_seed(0)
    print("dtype shape | plan | ms: plan, replaced config, torch | plan vs torch, vs replaced", flush=True)
    for dtype, rows, cols in CHECK_SHAPES:
        sets = backward_sets(gen, dtype, rows, cols)
        chosen = launch.backward_call(sets[0][0], sets[0][1], 1, True).plan
        ours = time_ms(lambda y, dy: launch.launch_backward(y, dy, 1, True), sets)
        with onlinesoftmax.override_plan("softmax", LOG_BACKWARD_STREAM=REPLACED):
            before = time_ms(lambda y, dy: launch.launch_backward(y, dy, 1, True), sets)
        theirs = time_ms(lambda y, dy: torch.ops.aten._log_softmax_backward_data(dy, y, 1, y.dtype), sets)
        print(f"{str(dtype).replace('torch.', '')} {rows}x{cols} | {chosen.strategy} {chosen.block_cols}x"
              f"{chosen.num_warps}w | {ours:.4f} {before:.4f} {theirs:.4f} | {theirs / ours:.2f}x {before / ours:.2f}x",
              flush=True)


def main():
    if "--check" in sys.argv:
        return check()
    log = "--softmax" not in sys.argv
    gen = torch.Generator().manual_seed(0)
    print(f"# {'log_softmax' if log else 'softmax'} backward; plan: the plan's own (strategy block x warps)", flush=True)
    print("dtype shape | torch | plan | looped (block, warps): ms ... | row_on_chip warps: ms ...", flush=True)
    for dtype, rows, cols in SHAPES if log else SOFTMAX_SHAPES:
        sets = backward_sets(gen, dtype, rows, cols, log)
        theirs = time_ms(lambda y, dy: TORCH_BACKWARD[log](dy, y, 1, y.dtype), sets)
        chosen = launch.backward_call(sets[0][0], sets[0][1], 1, log).plan
        cells = [f"{chosen.strategy} {chosen.block_cols}x{chosen.num_warps}w "
                 f"{time_ms(lambda y, dy: launch.launch_backward(y, dy, 1, log), sets):.4f}"]
        for block, warps in LOOPED:
            with onlinesoftmax.override_plan("softmax", STREAM_BLOCK={2: block, 4: block // 2}, STREAM_WARPS=warps,
                                             LOG_BACKWARD_STREAM={2: (block, warps), 4: (block // 2, warps)}):
                ms = time_ms(lambda y, dy: launch.launch_backward(y, dy, 1, log, strategy="looped"), sets)
            cells.append(f"({block},{warps}) {ms:.4f}")
        for warps in ON_CHIP_WARPS:
            with onlinesoftmax.override_plan("softmax", WARPS_BY_TILE_ELEMENTS=((65536, warps),)):
                ms = time_ms(lambda y, dy: launch.launch_backward(y, dy, 1, log, strategy="row_on_chip"), sets)
            cells.append(f"[{warps}] {ms:.4f}")
        print(f"{str(dtype).replace('torch.', '')} {rows}x{cols} | {theirs:.4f} | {cells[0]} | "
              + " ".join(cells[1:]), flush=True)


if __name__ == "__main__":
    main()
