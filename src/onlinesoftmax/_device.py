"""Device facts every planner reads, and the one way to override a planner's tables for tuning.

Nothing here touches CUDA at import: properties are read on first use and cached, so the package
imports on a machine without a GPU.

Plan tables are module-level constants of each op's ``plan.py`` (``ops/softmax/plan.py`` and so
on), each with a one-line reason beside it. Planners cache their decisions (planning is on every
call's path), and so do the launchers (one launch recipe per call signature). A tuning script or a
test that wants another value calls :func:`override_plan`, which sets the tables, clears every
registered cache, and puts everything back when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from typing import Callable

import torch

# The interpreter runs on a CPU with no SMs; a small count keeps split rows and split keys
# exercised at test sizes.
INTERPRETER_SM_COUNT = 4


def interpreter_active() -> bool:
    """True when Triton kernels run through ``TRITON_INTERPRET=1`` (read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def inline_ptx_allowed() -> bool:
    """False under the interpreter, which runs no inline PTX (kernels take plain Triton there)."""
    return not interpreter_active()


def triton_runs_on(device: torch.device) -> bool:
    """Whether the Triton kernels can run on tensors of ``device`` (CUDA, or any under the interpreter)."""
    return device.type == "cuda" or interpreter_active()


@functools.lru_cache(maxsize=None)
def _cuda_properties(index: int):
    return torch.cuda.get_device_properties(index)


def cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


# torch's bindings themselves (torch.cuda.is_current_stream_capturing() wraps the first in 0.5 us of
# checks); absent or stubs in CPU builds of torch, so called only for CUDA tensors.
_stream_is_capturing = torch._C._cuda_isCurrentStreamCapturing
current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def capturing(device_index: int) -> bool:
    """Whether the current stream of CUDA device ``device_index`` is capturing a CUDA graph. The
    legacy default stream (handle 0), where eager code runs unless it picks a stream, cannot
    capture, so there its handle answers (0.1 us a call on the H200 machine's host), where the
    driver's capture query cost 0.3-0.35 us of the 1.2-2.4 us that the softmax family's eager route
    adds to torch's own call (scripts/probes/probe_route_host.py)."""
    return current_raw_stream(device_index) != 0 and _stream_is_capturing()


# Programmatic dependent launch (Hopper on): a kernel launched with it may be scheduled while the
# kernel before it in the stream still runs, and waits (griddepcontrol.wait) before touching
# memory until that one has finished, so that its launch latency overlaps the other's tail.
# Off here turns every such launch back into a plain one.
PROGRAMMATIC_LAUNCH = True


def programmatic_launch(device: torch.device) -> bool:
    """Whether kernels on ``device`` may be launched programmatically dependent (a CUDA GPU of
    compute capability 9.0 on, not the interpreter, PROGRAMMATIC_LAUNCH on)."""
    return (PROGRAMMATIC_LAUNCH and device.type == "cuda" and not interpreter_active()
            and _cuda_properties(cuda_index(device)).major >= 9)


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; INTERPRETER_SM_COUNT for any other."""
    if device.type == "cuda":
        return _cuda_properties(cuda_index(device)).multi_processor_count
    return INTERPRETER_SM_COUNT


def device_name(device: torch.device | None = None) -> str:
    """``"NVIDIA H100 80GB HBM3"``, or ``"cpu"``."""
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return _cuda_properties(cuda_index(device)).name if device.type == "cuda" else "cpu"


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class LastPlan:
    """``last()`` is the plan an op's launcher recorded last in this process (``record(plan)``):
    tests force a strategy and assert that it ran."""

    def __init__(self):
        self.plan = None

    def record(self, plan) -> None:
        self.plan = plan

    def last(self):
        return self.plan


# --------------------------------------------------------------------------------------------
# Plan overrides
# --------------------------------------------------------------------------------------------

_CACHES: list[Callable[[], None]] = []
PLAN_MODULES = {
    "softmax": "onlinesoftmax.ops.softmax.plan",
    "topk": "onlinesoftmax.ops.topk.plan",
    "attention": "onlinesoftmax.ops.attention.plan",
    "decode": "onlinesoftmax.ops.decode.plan",
    "cross_entropy": "onlinesoftmax.ops.cross_entropy.plan",
    "linear_cross_entropy": "onlinesoftmax.ops.cross_entropy.linear_plan",
}


def plan_cache(clear: Callable[[], None]) -> Callable[[], None]:
    """Register a function that forgets cached plan decisions (a planner's ``cache_clear``, a
    launcher's recipe table); :func:`override_plan` calls every one of them."""
    _CACHES.append(clear)
    return clear


# Entries a per-signature table (prepared calls, routes, validated arguments) holds before it
# starts over: a long-running process that sees ever new shapes must not grow without bound.
MAX_SIGNATURES = 4096


def remember(table: dict, key, value):
    """``table[key] = value``, emptying ``table`` first when it is full; returns ``value``.

    For the miss path of a per-signature table: the hit path stays one ``table.get(key)``."""
    if len(table) >= MAX_SIGNATURES:
        table.clear()
    table[key] = value
    return value


def clear_plan_caches() -> None:
    for clear in _CACHES:
        clear()


@contextlib.contextmanager
def override_plan(op: str, **tables):
    """Run a ``with`` block under other values of an op's plan tables.

    >>> import onlinesoftmax
    >>> with onlinesoftmax.override_plan("softmax", ROW_ON_CHIP_MAX_COLS={4: 1024, 2: 1024}):
    ...     pass  # rows over 1024 columns take the streaming strategies here

    ``op`` is one of ``PLAN_MODULES``; each keyword names a constant of that op's ``plan.py``
    (an unknown name raises AttributeError before anything changes). Cached decisions are
    forgotten on entry and on exit, so the block plans with the new values and nothing planned
    inside it outlives the block. Not thread-safe: tables are module state.
    """
    if op not in PLAN_MODULES:
        raise ValueError(f"override_plan: op must be one of {tuple(PLAN_MODULES)}, got {op!r}")
    module = importlib.import_module(PLAN_MODULES[op])
    for name in tables:
        if not name.isupper() or not hasattr(module, name):
            raise AttributeError(f"override_plan: {PLAN_MODULES[op]} has no table {name!r}")
    saved = {name: getattr(module, name) for name in tables}
    for name, value in tables.items():
        setattr(module, name, value)
    clear_plan_caches()
    try:
        yield module
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        clear_plan_caches()
