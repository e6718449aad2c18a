"""Output and scratch allocation for every op's launcher.

Every buffer a kernel is expected to fill comes from :func:`empty`, so the tests can replace it with
a NaN-filled allocation: an element that no kernel wrote then fails the comparison instead of
passing on whatever memory happened to hold.
"""

from __future__ import annotations

import torch


def empty(shape, dtype, device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


_COUNTERS: dict = {}


def zeroed_counters(n: int, device: torch.device) -> torch.Tensor:
    """``n`` int32 counters that are zero when the next kernel on the current stream starts.

    For kernels that leave their counters zero when they finish (split_row_on_chip's tickets and
    row arrivals): one buffer per (device, stream) then serves every launch, since a stream runs
    its kernels one after another, and no launch pays for zeroing it. Under CUDA graph capture a
    fresh zeroed buffer is recorded with the graph instead (its memset node runs at every replay),
    so that a graph replayed on another stream never shares counters with eager launches.
    """
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))  # the stream handle, without a Stream object
    counters = _COUNTERS.get(key)
    if counters is None or counters.numel() < n:
        counters = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = counters
    return counters
