"""Output and scratch allocation for every op's launcher.

Every buffer a kernel is expected to fill comes from :func:`empty`, so the tests can replace it with
a NaN-filled allocation: an element that no kernel wrote then fails the comparison instead of
passing on whatever memory happened to hold.
"""

from __future__ import annotations

import math

import torch

from ._device import capturing, cuda_index, current_raw_stream


_TEMPLATES: dict = {}
MAX_TEMPLATES = 4096  # (shape, dtype, device) stand-ins kept before the table starts over


def empty(shape, dtype, device) -> torch.Tensor:
    """A contiguous buffer, allocated like a cached :func:`template` of its shape (an allocation by
    shape parses keyword arguments: see empty_like; with the lookup, 4.0 us against 5.8). A device
    without an index (the current one when called) is not cached."""
    key = (shape, dtype, device)
    try:
        stand_in = _TEMPLATES.get(key)
    except TypeError:  # an unhashable shape (a list)
        return torch.empty(shape, dtype=dtype, device=device)
    if stand_in is None:
        if not isinstance(device, torch.device) or (device.type == "cuda" and device.index is None):
            return torch.empty(shape, dtype=dtype, device=device)
        if len(_TEMPLATES) >= MAX_TEMPLATES:
            _TEMPLATES.clear()
        stand_in = _TEMPLATES[key] = template(shape, dtype, device)
    return torch.empty_like(stand_in)


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """A buffer of ``t``'s shape, dtype and device, laid out as ``t`` (callers pass contiguous tensors
    or a :func:`template`).

    On the H100 machine's host ``torch.empty_like(t)`` took 3.5 us a call, like a template 3.7, and
    ``torch.empty(shape, dtype=..., device=...)`` 5.8: parsing the keyword arguments is a third of an
    allocation (scripts/probes/probe_alloc_host.py, docs/notes/2026-11/alloc_host-h100.log)."""
    return torch.empty_like(t)


def template(shape, dtype, device) -> torch.Tensor:
    """A stand-in for a buffer a prepared call allocates every time: ``empty_like(template(...))``
    is a contiguous buffer of ``shape``, at empty_like's host cost instead of empty's.

    Every element of the stand-in is one stored element (zero strides, no memory of the shape's
    size). empty_like lays out a tensor that is not dense contiguously; a shape of at most one
    element would be dense with any strides, so it gets a real tensor instead.
    """
    shape = tuple(shape)
    if math.prod(shape) <= 1:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty((1,), dtype=dtype, device=device).as_strided(shape, (0,) * len(shape))


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
    if device.type != "cuda" or capturing(index := cuda_index(device)):
        return empty((parts,), torch.float32, device), torch.zeros(counters, dtype=torch.int32, device=device)
    key = (index, current_raw_stream(index))  # the stream handle, without a Stream object
    pair = _EXCHANGE.get(key)
    if pair is None or pair[0].numel() < parts or pair[1].numel() < counters:
        kept_parts, kept_counters = pair or (None, None)
        if kept_parts is None or kept_parts.numel() < parts:
            kept_parts = empty((max(parts, 4096),), torch.float32, device)
        if kept_counters is None or kept_counters.numel() < counters:
            kept_counters = torch.zeros(max(counters, 1024), dtype=torch.int32, device=device)
        pair = _EXCHANGE[key] = (kept_parts, kept_counters)
    return pair
