"""Worlds of processes for the distributed tests: spawn ranks, run named check functions on each.

One GPU per rank takes NCCL; ranks that share a GPU (the one-GPU machine) and CPU runs take gloo,
which the distributed module stages through host memory for CUDA tensors, so the ranks' kernels
still run on the GPU. A check is ``check(rank, world, seed)`` in the test module that names it.
"""

from __future__ import annotations

import datetime
import importlib
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Seconds: process-group init, and the whole world (spawn, imports, checks). A hang fails here.
INIT_TIMEOUT_S = 60
WORLD_TIMEOUT_S = 150
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _worker(rank, world, init_file, seed, module, checks):
    for key, value in NCCL_ENV.items():
        os.environ.setdefault(key, value)
    buffers = importlib.import_module("onlinesoftmax._buffers")
    # The autouse poisoning fixture does not reach spawned processes: poison here too (integer
    # buffers with their most negative value, never a valid index).
    buffers.empty = lambda shape, dtype, device: torch.full(
        shape, float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min, dtype=dtype, device=device)
    on_gpu = torch.cuda.is_available()
    backend = "nccl" if on_gpu and torch.cuda.device_count() >= world else "gloo"
    if on_gpu:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S))
    try:
        tests = importlib.import_module(module)
        for check in checks:
            getattr(tests, check)(rank, world, seed)
    finally:
        dist.destroy_process_group()


def bits(t):
    """The tensor's bit patterns as integers: NaN compares equal to the same NaN."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def gathered_equal_everywhere(t):
    """True when every rank holds bitwise the same tensor. Gathered where the tensor lives: NCCL
    has no CPU collectives, and gloo takes CUDA tensors."""
    out = [torch.empty_like(bits(t)) for _ in range(dist.get_world_size())]
    dist.all_gather(out, bits(t))
    return all(torch.equal(o, out[0]) for o in out)


def run_world(world: int, module: str, checks: list[str], seed: int) -> None:
    """Run ``module``'s named check functions on every rank of a fresh world; fail on error or timeout."""
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.start_processes(_worker, args=(world, os.path.join(tmp, "init"), seed, module, checks),
                                     nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + WORLD_TIMEOUT_S
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.terminate()
                pytest.fail(f"world of {world} did not finish {checks} in {WORLD_TIMEOUT_S} s (hang?)")


def shard_bounds(total: int, world: int, rank: int) -> tuple[int, int]:
    """Uneven contiguous shards: rank r gets about (r + 1) parts, the middle rank of 3 gets none."""
    weights = [r + 1 for r in range(world)]
    if world == 3:
        weights[1] = 0
    cuts = [0]
    for w in weights:
        cuts.append(cuts[-1] + total * w // sum(weights))
    cuts[-1] = total
    return cuts[rank], cuts[rank + 1]
