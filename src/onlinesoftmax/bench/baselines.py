"""A Triton baseline in the style of Triton's fused-softmax tutorial, written for comparison.

One program per row, the whole row in one power-of-two block, nothing else: no row packing, no
persistent grid, no fallback for rows that do not fit on chip. It is what most people write
first, and the reference point for what the planner adds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Past this the single block no longer fits in registers (a design limit of the tutorial kernel).
TUTORIAL_MAX_BLOCK = 32768


@triton.jit
def tutorial_softmax_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * y_row_stride + cols, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=mask)


def tutorial_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of a 2-d contiguous tensor."""
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    if block > TUTORIAL_MAX_BLOCK:
        raise ValueError(f"row of {cols} does not fit in one block (tutorial design, max {TUTORIAL_MAX_BLOCK})")
    y = torch.empty_like(x)
    num_warps = 4 if block <= 2048 else (8 if block <= 4096 else (16 if block <= 16384 else 32))
    tutorial_softmax_kernel[(rows,)](x, y, x.stride(0), y.stride(0), cols, BLOCK=block, num_warps=num_warps)
    return y
