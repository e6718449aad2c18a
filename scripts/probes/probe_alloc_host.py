"""Host time of one CUDA buffer allocation, by the call that makes it (GPU).

    python scripts/probes/probe_alloc_host.py

Every op's launcher allocates its outputs per call (onlinesoftmax._buffers). An allocation by shape
parses keyword arguments (dtype, device); one "like" a tensor copies them from it. Median of 5
runs of 20000 calls, µs. Output of the recorded run: docs/notes/2026-11/alloc_host-h100.log.
"""
import statistics
import time

import torch

from onlinesoftmax import _buffers

device = torch.device("cuda", 0)
x = torch.empty(8, 1024, device=device)
stand_in = _buffers.template((8, 1024), torch.float32, device)


def us(fn, calls=20000):
    for _ in range(200):
        fn()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


print("torch.empty(shape, dtype=, device=)", round(us(lambda: torch.empty((8, 1024), dtype=torch.float32,
                                                                         device=device)), 2))
print("torch.empty_like(x)", round(us(lambda: torch.empty_like(x)), 2))
print("torch.empty_like(template)", round(us(lambda: torch.empty_like(stand_in)), 2))
print("_buffers.empty (cached template)", round(us(lambda: _buffers.empty((8, 1024), torch.float32, device)), 2))
print("x.new_empty(shape)", round(us(lambda: x.new_empty((8, 1024))), 2))
