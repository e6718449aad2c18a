"""Seed 000's CPU loops as ``numba.njit`` functions: the three-loop safe softmax and the two-loop
online softmax (Milakov & Gimelshein, 2018, https://arxiv.org/abs/1805.02867), row by row.

The three-loop version accumulates its sum in double, as the seed (and llm.c) does for a
trustworthy ground truth; the two-loop version keeps fp32 throughout, as the seed does. Like the GPU
steps, the online update skips ``-inf`` entries instead of computing ``exp(-inf - -inf)``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from .. import _buffers

NEG_INF = np.float32(-np.inf)


@numba.njit(error_model="numpy")  # IEEE division: 0 / 0 is NaN, not ZeroDivisionError
def three_loops(inp, out):
    """Loop 1: the row max; loop 2: exp(x - max) into out and its sum; loop 3: scale by 1 / sum.
    Reads the row twice and writes it twice."""
    for i in range(inp.shape[0]):
        row_max = NEG_INF
        for j in range(inp.shape[1]):
            if inp[i, j] > row_max:
                row_max = inp[i, j]
        total = 0.0
        for j in range(inp.shape[1]):
            out[i, j] = math.exp(inp[i, j] - row_max)
            total += out[i, j]
        norm = np.float32(1.0) / np.float32(total)
        for j in range(inp.shape[1]):
            out[i, j] *= norm


@numba.njit(error_model="numpy")  # IEEE division: 0 / 0 is NaN, not ZeroDivisionError
def two_loops(inp, out):
    """Loop 1: max and sum together, the sum rescaled by exp(old max - new max) at each new max;
    loop 2: exp(x - max) / sum. Reads the row twice and writes it once."""
    for i in range(inp.shape[0]):
        row_max = NEG_INF
        norm = np.float32(0.0)
        for j in range(inp.shape[1]):
            x = inp[i, j]
            if x > row_max:
                norm = norm * np.float32(math.exp(row_max - x)) + np.float32(1.0)
                row_max = x
            elif x != NEG_INF:
                norm += np.float32(math.exp(x - row_max))
        for j in range(inp.shape[1]):
            out[i, j] = math.exp(inp[i, j] - row_max) / norm


def _run(loops, x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} takes a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32 or x.dim() != 2 or x.is_cuda:
        raise ValueError(f"{name} takes a 2-D float32 CPU tensor, got {x.dtype} of shape {tuple(x.shape)} "
                         f"on {x.device}")
    out = _buffers.empty(x.shape, torch.float32, x.device)
    loops(x.numpy(), out.numpy())
    return out


def softmax_three_loops(x: torch.Tensor) -> torch.Tensor:
    """Seed 000's three-loop softmax over the last dim of an (M, N) float32 CPU tensor.

    Returns an (M, N) float32 tensor; a row of only ``-inf`` (or with a NaN) gives NaN.
    Raises TypeError for a non-tensor, ValueError for another dtype, rank or device.
    """
    return _run(three_loops, x, "softmax_three_loops")


def softmax_two_loops(x: torch.Tensor) -> torch.Tensor:
    """Seed 000's two-loop (online) softmax; same contract as :func:`softmax_three_loops`."""
    return _run(two_loops, x, "softmax_two_loops")
