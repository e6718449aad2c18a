"""The bf16 split_row_on_chip backward at 256x151936, eager against CUDA graphs (GPU).

    python scripts/probes/probe_backward_eager.py

A bench run measured 8192-element tiles with 16 warps at 0.0973 ms under CUDA graphs but 0.1765 ms
eager (do_bench, L2 flushed before each call), against 0.1076 / 0.1039 for the then plan's 16384 x 4
(docs/notes/2026-11/bench_softmax-trial_bf16_backward_8192x16-h100.md). This times both configurations both ways in one process,
and eager once more with the inputs rotated instead of the L2 flushed (the flush leaves 256 MB of
dirty lines for the kernel to evict), to tell whether the slow eager time is the kernel's.
"""

import itertools

import torch
import triton

import onlinesoftmax
from onlinesoftmax.bench.harness import graph_time_ms, rotation_count, time_ms
from onlinesoftmax.ops.softmax import launch as softmax_launch
from onlinesoftmax.ops.softmax import plan


def tiles(tile_bytes, warp_bytes):
    return onlinesoftmax.override_plan(
        "softmax", SPLIT_ON_CHIP_TILE_BYTES=dict(plan.SPLIT_ON_CHIP_TILE_BYTES, backward=tile_bytes),
        SPLIT_ON_CHIP_WARP_BYTES=dict(plan.SPLIT_ON_CHIP_WARP_BYTES, backward=warp_bytes))


def rotated_ms(fn, input_sets, calls=200):
    # Back-to-back calls over rotated inputs, no flush, events around the whole batch.
    cycle = itertools.cycle(input_sets)
    for _ in range(10):
        fn(*next(cycle))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(*next(cycle))
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    rows, cols, dtype = 256, 151936, torch.bfloat16
    nbytes = 3 * rows * cols * dtype.itemsize
    sets = [(torch.softmax(torch.randn(rows, cols, device="cuda"), -1).to(dtype),
             torch.randn(rows, cols, device="cuda", dtype=dtype)) for _ in range(rotation_count(nbytes))]
    call = lambda y, dy: softmax_launch.launch_backward(y, dy, 1, False)  # noqa: E731
    for tile_bytes, warp_bytes in ((32768, 8192), (16384, 1024), (32768, 8192)):
        with tiles(tile_bytes, warp_bytes):
            call(*sets[0])
            chosen = plan.last_plan()
            graph = graph_time_ms(call, sets)
            eager = time_ms(call, sets)
            rotated = rotated_ms(call, sets)
        print(f"bf16 {rows}x{cols} backward {chosen.block_cols} x {chosen.num_warps} warps: graph {graph * 1e3:6.1f} us, "
              f"eager (L2 flushed) {eager * 1e3:6.1f} us, eager rotated {rotated * 1e3:6.1f} us "
              f"({nbytes / graph / 1e6:.0f} / {nbytes / eager / 1e6:.0f} / {nbytes / rotated / 1e6:.0f} GB/s)", flush=True)


if __name__ == "__main__":
    main()
