"""Output and scratch allocation for every op's launcher.

Every buffer a kernel is expected to fill comes from :func:`empty`, so the tests can replace it with
a NaN-filled allocation: an element that no kernel wrote then fails the comparison instead of
passing on whatever memory happened to hold.
"""

from __future__ import annotations

import torch


def empty(shape, dtype, device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """A buffer of ``t``'s shape, dtype and device, laid out as ``t`` (callers pass contiguous tensors).

    On the H100 machine's host ``torch.empty_like(t)`` took 3.8 us a call and ``torch.empty(shape,
    dtype=..., device=...)`` 8.3: the keyword arguments' parsing is most of an allocation."""
    return torch.empty_like(t)


_EXCHANGE: dict = {}


def row_exchange(parts: int, counters: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for programs of one launch that meet in device memory (split_row_on_chip): ``parts``
    float32 slots for their partials and ``counters`` int32 counters that are zero when the next
    kernel on the current stream starts.

    The kernels that use them write every partial before any program reads it and leave their
    counters zero when they finish, so one pair per (device, stream) serves every launch, since a
    stream runs its kernels one after another: a call pays for neither an allocation nor a zeroing
    (on the H100 machine's host one allocation cost about as much as the launch). Under CUDA graph
    capture a fresh pair is recorded with the graph instead (its memset node runs at every replay),
    so that a graph replayed on another stream never shares them with eager launches. The partials
    come from :func:`empty`, like every other buffer (the tests fill those with NaN).
    """
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return empty((parts,), torch.float32, device), torch.zeros(counters, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))  # the stream handle, without a Stream object
    pair = _EXCHANGE.get(key)
    if pair is None or pair[0].numel() < parts or pair[1].numel() < counters:
        kept_parts, kept_counters = pair or (None, None)
        if kept_parts is None or kept_parts.numel() < parts:
            kept_parts = empty((max(parts, 4096),), torch.float32, device)
        if kept_counters is None or kept_counters.numel() < counters:
            kept_counters = torch.zeros(max(counters, 1024), dtype=torch.int32, device=device)
        pair = _EXCHANGE[key] = (kept_parts, kept_counters)
    return pair
