"""Where a sharded call's time goes, under torchrun with one GPU a rank (NCCL).

`bench distributed` times a call as users make it (CUDA events around a loop of eager calls, the
slowest rank's mean). This times, per op, the same loop's GPU span and the host's time to issue it
(perf_counter around the loop, before the sync), then profiles a few calls on rank 0 (torch.profiler:
the kernels' GPU time by name, the host's ops by self time).

    torchrun --nproc-per-node 2 scripts/probes/probe_distributed_time.py [--dtype bf16]
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import onlinesoftmax
from onlinesoftmax import distributed

REPS = 50


def _spans(fn):
    """(GPU ms a call, host ms a call) over REPS calls, the ranks released together."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(REPS):
        fn()
    end.record()
    host = (time.perf_counter() - t0) * 1e3 / REPS
    torch.cuda.synchronize()
    return start.elapsed_time(end) / REPS, host


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    args = parser.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    for key, value in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                       "NVSHMEM_DISABLE_NVLS": "1"}.items():
        os.environ.setdefault(key, value)
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120), device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator(device="cuda").manual_seed(1234)
    calls = {}
    for rows, cols in ((8, 1048576), (64, 262144)):
        x = (torch.randn((rows, cols), generator=gen, device="cuda") * 3).to(dtype)
        shard = x[:, rank * cols // world:(rank + 1) * cols // world].contiguous()
        calls[f"softmax {rows}x{cols}"] = lambda s=shard: distributed.softmax(s, -1, validate=False)
        calls[f"softmax_topk {rows}x{cols}"] = lambda s=shard: distributed.softmax_topk(s, 50, -1, validate=False)
        calls[f"single-GPU softmax of the shard {rows}x{cols}"] = lambda s=shard: onlinesoftmax.softmax(s, -1)
    rows, cols = 8192, 128256
    x = (torch.randn((rows, cols), generator=gen, device="cuda") * 3).to(dtype)
    leaf = x[:, rank * cols // world:(rank + 1) * cols // world].contiguous().requires_grad_()
    target = torch.randint(0, cols, (rows,), generator=gen, device="cuda")

    def sharded_step():
        loss = distributed.cross_entropy(leaf, target, validate=False)
        return torch.autograd.grad(loss, leaf)

    def shard_step():
        loss = onlinesoftmax.cross_entropy(leaf, target.remainder(leaf.shape[1]))
        return torch.autograd.grad(loss, leaf)

    calls[f"cross_entropy step {rows}x{cols}"] = sharded_step
    calls[f"single-GPU cross_entropy step of the shard {rows}x{cols}"] = shard_step
    for name, fn in calls.items():
        gpu, host = _spans(fn)
        spans = [None] * world
        dist.all_gather_object(spans, (gpu, host))
        if rank == 0:
            print(f"{name}: " + "; ".join(f"rank {r} GPU span {g * 1e3:.1f} us, host {h * 1e3:.1f} us a call"
                                           for r, (g, h) in enumerate(spans)), flush=True)
    for name, fn in calls.items():
        if "single-GPU" in name:
            continue
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        if rank == 0:
            table = prof.key_averages()
            print(f"\n=== {name}: 5 calls, kernels by GPU time")
            print(table.table(sort_by="self_device_time_total", row_limit=10, max_name_column_width=70))
            print(f"=== {name}: host ops by self CPU time")
            print(table.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=70))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
