"""One eager call under two plans, alternating in one process (GPU): whether a plan change moved the
host-bound eager time of a cell, or the sweep's run-to-run spread did.

    python scripts/probes/probe_eager_plan_ab.py [--rounds 7]

For each case: softmax and log_softmax of a few rows, bf16, called back to back between two CUDA
events over rotated inputs (as ``bench sweep`` times eager calls), under the plan's tables ("plan")
and under the same tables with split_row_on_chip's forward as it was before its warps and tiles by
programs ("before": SPLIT_ON_CHIP_UNCAPPED_WARP_BYTES and the forward's SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES
at the tile's own values), the two alternating round by round; then torch's call. Medians of the rounds, µs.
"""

import argparse
import statistics

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import rotation_count
from onlinesoftmax.ops.softmax import plan

SHAPES = ((1, 100003), (4, 100003), (4, 128257), (1, 262147), (1, 65537), (4, 50257), (256, 32001), (5, 73849))
BEFORE = dict(SPLIT_ON_CHIP_UNCAPPED_WARP_BYTES=plan.SPLIT_ON_CHIP_WARP_BYTES["forward"],
              SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES=dict(plan.SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES,
                                                         forward=plan.SPLIT_ON_CHIP_TILE_BYTES["forward"]))


def eager_us(fn, xs, calls=300):
    for x in xs[:20]:
        fn(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for i in range(calls):
        fn(xs[i % len(xs)])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print("case | plan us | before us | torch us | plan chunks x warps, before")
    for rows, cols in SHAPES:
        xs = [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
              for _ in range(max(2, rotation_count(2 * rows * cols * 2)))]
        for name, ours, theirs in (("softmax", onlinesoftmax.softmax, torch.softmax),
                                   ("log_softmax", onlinesoftmax.log_softmax, torch.log_softmax)):
            times = {"plan": [], "before": [], "torch": []}
            shapes = {}
            for _ in range(args.rounds):
                times["plan"].append(eager_us(ours, xs))
                shapes["plan"] = plan.last_plan()
                with onlinesoftmax.override_plan("softmax", **BEFORE):
                    times["before"].append(eager_us(ours, xs))
                    shapes["before"] = plan.last_plan()
                times["torch"].append(eager_us(lambda x: theirs(x, -1), xs))
            med = {key: statistics.median(value) for key, value in times.items()}
            described = ", ".join(f"{p.strategy} {p.num_chunks} x {p.num_warps}" for p in shapes.values())
            print(f"bf16 {name} {rows}x{cols} | {med['plan']:.1f} | {med['before']:.1f} | {med['torch']:.1f} | {described}",
                  flush=True)


if __name__ == "__main__":
    main()
