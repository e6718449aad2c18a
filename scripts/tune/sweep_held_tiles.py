"""Tiles held at 16 bits (GPU): the on-chip forward kernels with the chunk kept in its input dtype
while it waits, against the same kernels holding fp32, on the bench shapes where it matters.

    python scripts/tune/sweep_held_tiles.py [--cols 32768]   (only the cases of rows that long)

split_row_on_chip (2-byte forward): the chunk waits for its row at 16 bits (widen_opaque; 40
registers a thread instead of 60 at 8192 x 8 warps, ptxas for sm_90), under the plan's register
cap (SPLIT_ON_CHIP_MAX_REGISTERS: 32, 6 -> 8 programs an SM) and without it; "fp32 hold" runs
the same kernel with the inline-PTX widening off, which lets the compiler keep the fp32 chunk
across the wait. row_on_chip (bf16 1024x32768): the row held at 16 bits (32 registers at 32
warps: 2 programs an SM instead of 1) or as fp32. Float32 softmax and log_softmax: the plan with
and without the register cap.

Each line: CUDA-graph replays over rotated inputs (the kernel) and do_bench with L2 flushes (eager,
what the bench reports), GB/s counting x read once and y written once, and the relative error
against float64 on the first input. (The first run in docs/notes/2026-11/sweep_held_tiles-h100.log
also timed other tiles and warps, since removed from here: none beat the plan's.)
"""

import argparse
import contextlib
from unittest import mock

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import copy_bandwidth_gbs, graph_time_ms, relative_error, rotation_count, time_ms
from onlinesoftmax.ops.softmax import launch as softmax_launch
from onlinesoftmax.ops.softmax import plan


@contextlib.contextmanager
def settings(fp32_hold=False, **values):
    # Plan tables through override_plan (which also forgets the launch recipes, so the patch below
    # reaches the next recipe built); fp32_hold turns the inline-PTX widening off.
    patch = (mock.patch.object(softmax_launch, "inline_ptx_allowed", lambda: False) if fp32_hold
             else contextlib.nullcontext())
    with onlinesoftmax.override_plan("softmax", **values), patch:
        yield


UNCAPPED = dict(SPLIT_ON_CHIP_MAX_REGISTERS=dict.fromkeys(plan.FORWARD_OPS + plan.BACKWARD_OPS, 0))


def split_variants():
    yield "plan (16-bit hold)", {}
    yield "plan, no register cap", UNCAPPED
    yield "fp32 hold, no register cap", dict(UNCAPPED, fp32_hold=True)


def fp32_split_variants():
    yield "plan", {}
    yield "plan, no register cap", UNCAPPED


SIXTEEN_WARPS = dict(WARPS_BY_TILE_ELEMENTS=((512, 1), (1024, 2), (2048, 4), (4096, 8), (8192, 16), (65536, 16)))


def row_variants():
    yield "plan (16-bit hold)", {}
    yield "fp32 hold", dict(ROW_ON_CHIP_HOLD_INPUT_MIN_COLS={})
    yield "16-bit hold, 16 warps", SIXTEEN_WARPS


def unheld_row_variants():
    yield "plan", {}
    yield "16 warps", SIXTEEN_WARPS


CASES = [
    ("softmax", torch.bfloat16, 64, 128256, split_variants),
    ("softmax", torch.bfloat16, 16, 262144, split_variants),
    ("softmax", torch.bfloat16, 256, 151936, split_variants),
    ("softmax", torch.bfloat16, 1024, 32768, row_variants),
    ("log_softmax", torch.bfloat16, 1024, 32768, row_variants),
    ("softmax", torch.float32, 1024, 32768, unheld_row_variants),
    ("log_softmax", torch.float32, 1024, 32768, unheld_row_variants),
    ("softmax", torch.float16, 1024, 32768, unheld_row_variants),
    ("softmax", torch.float32, 64, 128256, fp32_split_variants),
    ("softmax", torch.float32, 256, 151936, fp32_split_variants),
    ("softmax", torch.float32, 16, 262144, fp32_split_variants),
    ("log_softmax", torch.float32, 64, 128256, fp32_split_variants),
    ("log_softmax", torch.float32, 256, 151936, fp32_split_variants),
]
OPS = {"softmax": (onlinesoftmax.softmax, torch.softmax), "log_softmax": (onlinesoftmax.log_softmax, torch.log_softmax)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cols", type=int, default=None, help="only the cases of rows of this many elements")
    only_cols = parser.parse_args().cols
    copy = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy:.0f} GB/s; {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(20261125)
    for op, dtype, rows, cols, variants in CASES:
        if only_cols is not None and cols != only_cols:
            continue
        ours, torch_op = OPS[op]
        nbytes = 2 * rows * cols * dtype.itemsize
        xs = [(torch.randn(rows, cols, device="cuda", dtype=torch.float32, generator=gen).mul_(2).to(dtype),)
              for _ in range(rotation_count(nbytes))]
        ref = torch_op(xs[0][0].double(), -1)
        for name, values in variants():
            with settings(**values):
                call = lambda x: ours(x)  # noqa: E731
                err = relative_error(call(*xs[0]), ref)
                chosen = plan.last_plan()
                graph = graph_time_ms(call, xs)
                eager = time_ms(call, xs)
            shape = f"{op} {str(dtype)[6:]} {rows}x{cols}"
            config = f"{chosen.strategy} {chosen.block_cols}x{chosen.num_warps}w"
            print(f"{shape:30s} {name:26s} {config:28s} graph {graph * 1e3:7.1f} us {nbytes / graph / 1e6:5.0f} GB/s"
                  f"   eager {eager * 1e3:7.1f} us {nbytes / eager / 1e6:5.0f} GB/s   err {err:.1e}", flush=True)
        del xs


if __name__ == "__main__":
    main()
