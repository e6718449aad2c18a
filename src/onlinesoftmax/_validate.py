"""Argument checks shared by every public function: one wording of each error, raised at the API
boundary with what to do about it.

Each check takes ``op``, the public name the message starts with (``"softmax"``,
``"distributed.cross_entropy"``), so a user sees which call refused what.
"""

from __future__ import annotations

import math

import torch

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class DimensionError(IndexError, ValueError):
    """``dim`` out of range. An IndexError like torch's, and a ValueError like our other argument errors."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tensor(t, op: str, arg: str = "x") -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    return t


def device(t: torch.Tensor, op: str) -> None:
    if t.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{op} runs on CUDA and CPU tensors, got a tensor on {t.device}")


def same_device(op: str, **tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        listed = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ValueError(f"{op}: inputs must be on one device, got {listed}")


def integer(value, op: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {what} must be an int, got {type(value).__name__}")
    return value


def dim(value, ndim: int, op: str) -> int:
    """``value`` as an index in ``[0, ndim)``; a 0-d tensor has one dim for this purpose (as in torch)."""
    integer(value, op, "dim")
    ndim = max(ndim, 1)
    if not -ndim <= value < ndim:
        raise DimensionError(f"{op}: dim {value} is out of range for a tensor of {ndim} dims "
                             f"(expected in [{-ndim}, {ndim - 1}])")
    return value % ndim


def real(value, op: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {what} must be a real number, got {type(value).__name__}")
    return float(value)


def finite(value) -> bool:
    """math.isfinite by comparisons, which torch.compile can also trace where it makes a float
    symbolic (``dynamic=True`` does so to a public function's float defaults; math.isfinite of one
    is a graph break)."""
    return value == value and -math.inf < value < math.inf


def positive(value, op: str, what: str) -> float:
    """A finite real number > 0 (temperatures, scales)."""
    value = real(value, op, what)
    if not (finite(value) and value > 0):
        raise ValueError(f"{op}: {what} must be finite and > 0, got {value}")
    return value


def non_negative(value, op: str, what: str) -> float:
    value = real(value, op, what)
    if not (finite(value) and value >= 0):
        raise ValueError(f"{op}: {what} must be finite and >= 0, got {value}")
    return value


def choice(value, options, op: str, what: str):
    if value not in options:
        raise ValueError(f"{op}: {what} must be one of {tuple(options)}, got {value!r}")
    return value


def float_dtype(t: torch.Tensor, op: str, supported=KERNEL_DTYPES) -> None:
    """Refuse tensors whose dtype the op's kernels do not take, saying what to do instead."""
    if t.dtype not in supported:
        names = ", ".join(dtype_name(d) for d in supported)
        raise TypeError(f"{op} supports {names} tensors, got {dtype_name(t.dtype)}; cast it first")
