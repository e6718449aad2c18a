"""Where a cross-entropy training step's GPU time goes: each kernel's time, ours and torch's. (GPU)

One step keeping the logits (forward, then the gradient), as the bench suite times it, run STEPS
times under torch.profiler after a warm-up; each kernel's mean time a step in µs, its launches a
step, and the step's bytes floor (logits read twice, the gradient written once, targets read) at the
copy bandwidth measured in the same run. ``--override NAME=VALUE``: ours under that plan table value too.

    python scripts/probes/probe_cross_entropy_step_kernels.py [--dtype bf16] [--shapes 524288x19,65536x150] \
        [--override REDUCE_IN_ROWS_LAUNCH=False]
"""

import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import copy_bandwidth_gbs, plan_tables

SHAPES = "524288x19,1048576x2,262144x9,65536x150,32768x512,8192x512,100000x1000"
STEPS = 10


def kernel_times(step, args):
    """{kernel name: (µs a step, launches a step)} over STEPS steps."""
    for _ in range(3):
        step(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step(*args)
        torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time
            counts[event.name] += 1
    return {name: (totals[name] / STEPS, counts[name] / STEPS) for name in totals}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=suite.DTYPES)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--override", action="append", default=[], help="NAME=VALUE, a Python literal")
    args = parser.parse_args()
    overrides = plan_tables(args.override)
    dtype = suite.DTYPES[args.dtype]
    copy_gbs = copy_bandwidth_gbs()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; copy {copy_gbs:.0f} GB/s;"
          f" µs a step (launches a step), mean of {STEPS} profiled steps")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for item in args.shapes.split(","):
        rows, cols = map(int, item.split("x"))
        x = (torch.randn(rows, cols, device="cuda", generator=gen) * 3).to(dtype).requires_grad_()
        target = torch.randint(0, cols, (rows,), device="cuda", generator=gen)
        floor_bytes = 3 * x.numel() * x.element_size() + target.numel() * target.element_size()
        print(f"{item}: floor {floor_bytes / 1e6:.1f} MB = {floor_bytes / copy_gbs / 1e3:.1f} µs")
        runs = [("ours", onlinesoftmax.cross_entropy, {}), ("torch", F.cross_entropy, {})]
        if overrides:
            runs.insert(1, (f"ours with {args.override}", onlinesoftmax.cross_entropy, overrides))
        for who, fn, table in runs:
            with onlinesoftmax.override_plan("cross_entropy", **table):
                times = kernel_times(suite._step(fn), (x, target))
            total = sum(us for us, _ in times.values())
            print(f"  {who}: {total:.1f} µs")
            for name, (us, launches) in sorted(times.items(), key=lambda kv: -kv[1][0]):
                print(f"    {us:8.1f} ({launches:g})  {name[:90]}")
        onlinesoftmax.cross_entropy(x, target)
        print("  our plan:", onlinesoftmax.ops.cross_entropy.plan.last_plan().strategy)
        del x, target
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
