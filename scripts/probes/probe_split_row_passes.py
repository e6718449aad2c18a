"""Where the time of a split_row softmax goes (GPU): its two launches timed apart, beside a copy.

    python scripts/probes/probe_split_row_passes.py

The 1x16M rows of the bench run `split_row`: a partials launch reads the row once and writes an
(m, d) per chunk, a normalize launch merges them and reads the row again to write y. Each line
times, under CUDA-graph replays over rotated inputs, the whole call, the partials launch alone
(normalize replaced by nothing), the normalize launch alone (partials replaced by nothing: it then
merges whatever the partials buffer holds, which changes no control flow), and, for scale, a
device copy of the row (read + write) and a read-only reduction of it. GB/s count the bytes each
step must move at least (the partials: x read; the normalize: x read and y written).
"""

import contextlib
from unittest import mock

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import graph_time_ms, rotation_count
from onlinesoftmax.ops.softmax import launch as softmax_launch
from onlinesoftmax.ops.softmax import plan as planner


def skip(*args, **kwargs):
    return None


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for dtype in (torch.float32, torch.bfloat16):
        n = 1 << 24
        nbytes = n * dtype.itemsize
        xs = [(torch.randn(1, n, device="cuda").to(dtype),) for _ in range(rotation_count(2 * nbytes))]
        onlinesoftmax.softmax(xs[0][0])
        plan = planner.last_plan()
        steps = {
            "whole call": (lambda x: onlinesoftmax.softmax(x), 2 * nbytes, None),
            "partials launch alone": (lambda x: onlinesoftmax.softmax(x), nbytes, "_split_row_normalize"),
            "normalize launch alone": (lambda x: onlinesoftmax.softmax(x), 2 * nbytes, "_split_row_partials"),
            "copy (x.clone())": (lambda x: x.clone(), 2 * nbytes, None),
            "read-only reduction (x.amax())": (lambda x: x.amax(), nbytes, None),
        }
        print(f"{str(dtype)[6:]} 1x{n}: {plan.strategy}, {plan.num_chunks} chunks of {plan.chunk_size}, "
              f"{plan.num_warps} warps, block {plan.block_cols}", flush=True)
        for name, (fn, moved, skipped) in steps.items():
            patch = mock.patch.object(softmax_launch, skipped, skip) if skipped else contextlib.nullcontext()
            with patch:
                ms = graph_time_ms(fn, xs)
            print(f"  {name:32s} {ms * 1e3:7.1f} us  {moved / ms / 1e6:5.0f} GB/s", flush=True)
        del xs


if __name__ == "__main__":
    main()
