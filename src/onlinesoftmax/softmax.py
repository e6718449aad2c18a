"""softmax, log_softmax and logsumexp: Triton kernels, launchers, custom ops, autograd, public functions.

Every strategy computes the online normalizer (m, d) of each row (seed 001): the running maximum
m and the sum d of exp(x - m), merged with the associative operator

    (m_a, d_a) (+) (m_b, d_b) = (M, d_a e^(m_a - M) + d_b e^(m_b - M)),   M = max(m_a, m_b)

and then writes y = exp(x - m) / d. The strategies differ only in where the row lives while that
happens (registers, a loop over device memory, or several programs); :mod:`onlinesoftmax.plan`
chooses between them.

Layout: a row is every index but the softmax dim's. The kernels address rows through two
(size, stride) levels, row r at (r // inner) * stride_outer + (r % inner) * stride_inner, so
strided, sliced and transposed tensors are read in place whenever their row dims merge into two
such levels (slices of a 3-d tensor in every dim do); other views are copied once with
``.contiguous()``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import triton
import triton.language as tl

from . import _buffers, cpu, plan as planner
from ._launch import Launcher, aligned, op_when_compiling
from ._triton import (
    COUNTER_STRIDE,
    NEG_INF,
    claim_chunk,
    col_offset,
    finish_lse,
    grad_from_dot,
    max_keep_nan,
    merge_row_partials,
    row_offset,
    widen_opaque,
    store_row_partial,
    stream_grad_dot,
    stream_max,
    stream_online_normalizer,
    stream_sum_exp,
    stream_write_grad,
    stream_write_normalized,
    wait_for_row,
)

# --------------------------------------------------------------------------------------------
# Forward kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def row_on_chip_softmax_kernel(
    x_ptr, y_ptr, lse_ptr,
    n_rows, n_cols, inner,
    x_stride_outer, x_stride_col, x_stride_inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    inv_temperature,
    BLOCK_COLS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, CONTIGUOUS: tl.constexpr,
    LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr,
    HOLD_INPUT: tl.constexpr, OPAQUE_WIDEN: tl.constexpr,
):
    # One read and one write per element: the [rows, cols] tile stays in registers between the
    # max, the sum and the write; one program per block of rows. HOLD_INPUT keeps the tile in the
    # input dtype and widens it for each use (see split_row_on_chip_softmax_kernel).
    cols = tl.arange(0, BLOCK_COLS)
    col_mask = cols < n_cols
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    p_x = x_ptr + row_offset(rows, inner, x_stride_outer, x_stride_inner)[:, None] \
        + col_offset(cols, x_stride_col, CONTIGUOUS)[None, :]
    b_in = tl.load(p_x, mask=mask, other=NEG_INF)  # [R, C]
    if HOLD_INPUT:
        # Unscaled maximum, then scaled: the same number (see split_row_on_chip_softmax_kernel).
        b_x = b_in.to(tl.float32)
        if WRITE_LSE:
            b_m = max_keep_nan(b_x, 1) * inv_temperature  # [R]
        else:
            b_m = tl.max(b_x, 1) * inv_temperature
        b_x = widen_opaque(b_in, OPAQUE_WIDEN, 1) * inv_temperature
    else:
        # Scaled before the maximum here: taking it unscaled, as split_row_on_chip does, cost this
        # kernel registers instead (ptxas for sm_90, 65536x256: 48 -> 59 fp32, 32 -> 37 bf16).
        b_x = b_in.to(tl.float32) * inv_temperature
        if WRITE_LSE:
            b_m = max_keep_nan(b_x, 1)  # [R]
        else:
            # A NaN already turns the sum, and so the whole row, into NaN: the plain max will do.
            b_m = tl.max(b_x, 1)
    b_e = tl.exp(b_x - b_m[:, None])
    b_d = tl.sum(b_e, 1)  # an all -inf row gives NaN here, as torch.softmax does
    if WRITE_LSE:
        tl.store(lse_ptr + rows, finish_lse(b_m, tl.sum(tl.where(mask, b_e, 0.0), 1)), mask=rows < n_rows)
    if WRITE_Y:
        if HOLD_INPUT:
            b_x = widen_opaque(b_in, OPAQUE_WIDEN, 0) * inv_temperature
            b_e = tl.exp(b_x - b_m[:, None])
        if LOG:
            b_y = (b_x - b_m[:, None]) - tl.log(b_d)[:, None]
        else:
            b_y = b_e * (1.0 / b_d)[:, None]
        p_y = y_ptr + row_offset(rows, inner, y_stride_outer, y_stride_inner)[:, None] \
            + col_offset(cols, y_stride_col, CONTIGUOUS)[None, :]
        tl.store(p_y, b_y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def looped_softmax_kernel(
    x_ptr, y_ptr, lse_ptr,
    n_cols, inner,
    x_stride_outer, x_stride_col, x_stride_inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    inv_temperature,
    BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, SAFE: tl.constexpr,
    LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    # One program per row. Online: 2 reads of x (normalizer, write). Safe: 3 (max, sum, write).
    row = tl.program_id(0)
    x_row = x_ptr + row_offset(row, inner, x_stride_outer, x_stride_inner)
    if SAFE:
        m = stream_max(x_row, x_stride_col, 0, n_cols, inv_temperature, BLOCK, CONTIGUOUS)
        d = stream_sum_exp(x_row, x_stride_col, 0, n_cols, m, inv_temperature, BLOCK, CONTIGUOUS)
    else:
        m, d = stream_online_normalizer(x_row, x_stride_col, 0, n_cols, inv_temperature, BLOCK, CONTIGUOUS)
    if WRITE_LSE:
        tl.store(lse_ptr + row, finish_lse(m, d))
    if WRITE_Y:
        y_row = y_ptr + row_offset(row, inner, y_stride_outer, y_stride_inner)
        stream_write_normalized(x_row, y_row, x_stride_col, y_stride_col, 0, n_cols, m, d, inv_temperature,
                                BLOCK, CONTIGUOUS, LOG)


# split_row passes for the partials kernel
PARTIAL_ONLINE = 0  # (m, d) of the chunk in one read
PARTIAL_MAX = 1  # safe, pass 1: the chunk's maximum
PARTIAL_SUM = 2  # safe, pass 2: sum of exp(x - M) with M the row maximum merged from pass 1


@triton.jit
def split_row_partials_kernel(
    x_ptr, parts_ptr,
    n_cols, inner, x_stride_outer, x_stride_col, x_stride_inner,
    chunk_size, num_chunks, inv_temperature,
    BLOCK: tl.constexpr, CHUNKS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr, PASS: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * chunk_size
    stop = tl.minimum(start + chunk_size, n_cols)
    x_row = x_ptr + row_offset(row, inner, x_stride_outer, x_stride_inner)
    # parts holds three [rows, chunks] planes: m, d (store_row_partial) and (safe algorithm) the
    # chunk maxima.
    n_parts = tl.num_programs(0).to(tl.int64) * num_chunks
    part_max_ptr = parts_ptr + 2 * n_parts
    part = row.to(tl.int64) * num_chunks + chunk
    if PASS == 0:
        m, d = stream_online_normalizer(x_row, x_stride_col, start, stop, inv_temperature, BLOCK, CONTIGUOUS)
        store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d)
    elif PASS == 1:
        tl.store(part_max_ptr + part, stream_max(x_row, x_stride_col, start, stop, inv_temperature, BLOCK, CONTIGUOUS))
    else:
        # Every chunk sums against the row maximum, so the merge that follows only adds the d's.
        idx = tl.arange(0, CHUNKS_POW2)
        row_maxes = tl.load(part_max_ptr + row.to(tl.int64) * num_chunks + idx, mask=idx < num_chunks, other=NEG_INF)
        m = max_keep_nan(row_maxes, 0)
        store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m,
                          stream_sum_exp(x_row, x_stride_col, start, stop, m, inv_temperature, BLOCK, CONTIGUOUS))


@triton.jit
def split_row_normalize_kernel(
    x_ptr, y_ptr, lse_ptr, parts_ptr,
    n_cols, inner,
    x_stride_outer, x_stride_col, x_stride_inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    chunk_size, num_chunks, inv_temperature,
    BLOCK: tl.constexpr, CHUNKS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr,
    LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    # Every program merges all of its row's partials itself (at most SPLIT_MAX_CHUNKS, from L2,
    # in the same fixed tree order), which saves a launch and keeps the result deterministic.
    # Programs run in the reverse of the partials launch's order: the chunks that launch read
    # last are the ones still in L2, so they are read again first.
    row = tl.num_programs(0) - 1 - tl.program_id(0)
    chunk = tl.num_programs(1) - 1 - tl.program_id(1)
    n_parts = tl.num_programs(0).to(tl.int64) * num_chunks  # the planes of split_row_partials_kernel
    m, d = merge_row_partials(parts_ptr, n_parts, row, num_chunks, CHUNKS_POW2, False)
    if WRITE_LSE:
        tl.store(lse_ptr + row, finish_lse(m, d))
    if WRITE_Y:
        start = chunk * chunk_size
        stop = tl.minimum(start + chunk_size, n_cols)
        x_row = x_ptr + row_offset(row, inner, x_stride_outer, x_stride_inner)
        y_row = y_ptr + row_offset(row, inner, y_stride_outer, y_stride_inner)
        stream_write_normalized(x_row, y_row, x_stride_col, y_stride_col, start, stop, m, d, inv_temperature,
                                BLOCK, CONTIGUOUS, LOG)


@triton.jit
def split_row_on_chip_softmax_kernel(
    x_ptr, y_ptr, lse_ptr, parts_ptr, sync_ptr,
    n_cols, inner,
    x_stride_outer, x_stride_col, x_stride_inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    chunk_size, num_chunks, inv_temperature,
    BLOCK_COLS: tl.constexpr, CHUNKS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr,
    LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr, OPAQUE_WIDEN: tl.constexpr,
):
    # A row too long for one program's registers, held by num_chunks programs at once: each keeps
    # its chunk in registers, publishes the chunk's (m, d), waits for the rest of the row, merges
    # the row's partials (all programs in the same fixed order) and writes from registers. One read
    # and one write per element, as row_on_chip, where split_row reads the row twice.
    row, chunk, cols, mask = claim_chunk(sync_ptr, n_cols, chunk_size, num_chunks, BLOCK_COLS)
    x_row = x_ptr + row_offset(row, inner, x_stride_outer, x_stride_inner)
    # The chunk waits for the row in the input dtype (widened again after the wait, opaquely on the
    # GPU: see widen_opaque), as in split_row_on_chip_backward_kernel: half the registers for 2-byte
    # inputs, so more programs (and their loads) fit on an SM.
    b_in = tl.load(x_row + col_offset(cols, x_stride_col, CONTIGUOUS), mask=mask, other=NEG_INF)
    b_x = b_in.to(tl.float32)
    # The maximum is taken of the unscaled chunk and then scaled: the same number, as rounding
    # x * (1/T) is monotone in x for T > 0, but ptxas otherwise keeps the chunk twice (scaled for
    # the maximum, unscaled for the exponentials), 96 registers a thread instead of 72 (fp32, 4
    # warps), which left 5 programs on an SM instead of 7.
    if WRITE_LSE:
        m = max_keep_nan(b_x, 0) * inv_temperature
    else:
        # A NaN makes its chunk's d, and through the merge the whole row, NaN: tl.max will do.
        m = tl.max(b_x, 0) * inv_temperature
    # Widened again (COPY 1), not reusing b_x: the chunk then lives at 16 bits from the maximum on,
    # not as fp32 through the maximum's exchange between warps.
    b_x = widen_opaque(b_in, OPAQUE_WIDEN, 1) * inv_temperature
    d = tl.sum(tl.exp(b_x - tl.where(m == NEG_INF, 0.0, m)), 0)  # an all -inf chunk is (-inf, 0)
    n_parts = tl.num_programs(0).to(tl.int64)  # the two planes of parts: m, then d
    store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d)
    wait_for_row(sync_ptr, row, num_chunks)
    m, d = merge_row_partials(parts_ptr, n_parts, row, num_chunks, CHUNKS_POW2, True)
    b_x = widen_opaque(b_in, OPAQUE_WIDEN, 0) * inv_temperature
    if WRITE_LSE:
        if chunk == 0:
            tl.store(lse_ptr + row, finish_lse(m, d))
    if WRITE_Y:
        if LOG:
            b_y = (b_x - m) - tl.log(d)
        else:
            b_y = tl.exp(b_x - m) * (1.0 / d)  # an all -inf row gives NaN, as torch.softmax does
        y_row = y_ptr + row_offset(row, inner, y_stride_outer, y_stride_inner)
        tl.store(y_row + col_offset(cols, y_stride_col, CONTIGUOUS), b_y.to(y_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Backward kernels: dx = (y * (dy - sum(dy * y))) / T, or (dy - exp(y) * sum(dy)) / T for log
# --------------------------------------------------------------------------------------------


@triton.jit
def row_on_chip_backward_kernel(
    y_ptr, dy_ptr, dx_ptr,
    n_rows, n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    dx_stride_outer, dx_stride_col, dx_stride_inner,
    inv_temperature,
    BLOCK_COLS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr,
    OPAQUE_WIDEN: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_COLS)
    col_mask = cols < n_cols
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    p_y = y_ptr + row_offset(rows, inner, y_stride_outer, y_stride_inner)[:, None] \
        + col_offset(cols, y_stride_col, CONTIGUOUS)[None, :]
    p_dy = dy_ptr + row_offset(rows, inner, dy_stride_outer, dy_stride_inner)[:, None] \
        + col_offset(cols, dy_stride_col, CONTIGUOUS)[None, :]
    # In the input dtype across the row's reduction, as in split_row_on_chip_backward_kernel.
    b_y = tl.load(p_y, mask=mask, other=0.0)  # [R, C]
    b_dy = tl.load(p_dy, mask=mask, other=0.0)
    if LOG:
        b_dot = tl.sum(b_dy.to(tl.float32), 1)
    else:
        b_dot = tl.sum(b_dy.to(tl.float32) * b_y.to(tl.float32), 1)
    b_dx = grad_from_dot(widen_opaque(b_y, OPAQUE_WIDEN), widen_opaque(b_dy, OPAQUE_WIDEN), b_dot[:, None],
                         inv_temperature, LOG)
    p_dx = dx_ptr + row_offset(rows, inner, dx_stride_outer, dx_stride_inner)[:, None] \
        + col_offset(cols, dx_stride_col, CONTIGUOUS)[None, :]
    tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def looped_backward_kernel(
    y_ptr, dy_ptr, dx_ptr,
    n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    dx_stride_outer, dx_stride_col, dx_stride_inner,
    inv_temperature,
    BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr,
):
    row = tl.program_id(0)
    y_row = y_ptr + row_offset(row, inner, y_stride_outer, y_stride_inner)
    dy_row = dy_ptr + row_offset(row, inner, dy_stride_outer, dy_stride_inner)
    dx_row = dx_ptr + row_offset(row, inner, dx_stride_outer, dx_stride_inner)
    dot = stream_grad_dot(y_row, dy_row, y_stride_col, dy_stride_col, 0, n_cols, BLOCK, CONTIGUOUS, LOG)
    stream_write_grad(y_row, dy_row, dx_row, y_stride_col, dy_stride_col, dx_stride_col, 0, n_cols, dot,
                      inv_temperature, BLOCK, CONTIGUOUS, LOG)


@triton.jit
def split_row_backward_dot_kernel(
    y_ptr, dy_ptr, part_ptr,
    n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    chunk_size, num_chunks,
    BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * chunk_size
    stop = tl.minimum(start + chunk_size, n_cols)
    y_row = y_ptr + row_offset(row, inner, y_stride_outer, y_stride_inner)
    dy_row = dy_ptr + row_offset(row, inner, dy_stride_outer, dy_stride_inner)
    dot = stream_grad_dot(y_row, dy_row, y_stride_col, dy_stride_col, start, stop, BLOCK, CONTIGUOUS, LOG)
    tl.store(part_ptr + row.to(tl.int64) * num_chunks + chunk, dot)


@triton.jit
def split_row_backward_apply_kernel(
    y_ptr, dy_ptr, dx_ptr, part_ptr,
    n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    dx_stride_outer, dx_stride_col, dx_stride_inner,
    chunk_size, num_chunks, inv_temperature,
    BLOCK: tl.constexpr, CHUNKS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr,
):
    # Reverse order, as in split_row_normalize_kernel: what the dot launch read last is in L2.
    row = tl.num_programs(0) - 1 - tl.program_id(0)
    chunk = tl.num_programs(1) - 1 - tl.program_id(1)
    idx = tl.arange(0, CHUNKS_POW2)
    dot = tl.sum(tl.load(part_ptr + row.to(tl.int64) * num_chunks + idx, mask=idx < num_chunks, other=0.0), 0)
    start = chunk * chunk_size
    stop = tl.minimum(start + chunk_size, n_cols)
    y_row = y_ptr + row_offset(row, inner, y_stride_outer, y_stride_inner)
    dy_row = dy_ptr + row_offset(row, inner, dy_stride_outer, dy_stride_inner)
    dx_row = dx_ptr + row_offset(row, inner, dx_stride_outer, dx_stride_inner)
    stream_write_grad(y_row, dy_row, dx_row, y_stride_col, dy_stride_col, dx_stride_col, start, stop, dot,
                      inv_temperature, BLOCK, CONTIGUOUS, LOG)


@triton.jit
def split_row_on_chip_backward_kernel(
    y_ptr, dy_ptr, dx_ptr, part_ptr, sync_ptr,
    n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    dx_stride_outer, dx_stride_col, dx_stride_inner,
    chunk_size, num_chunks, inv_temperature,
    BLOCK_COLS: tl.constexpr, CHUNKS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr,
    OPAQUE_WIDEN: tl.constexpr,
):
    # As split_row_on_chip_softmax_kernel: the chunk's y and dy stay in registers while the row's
    # programs exchange their partial dot products, so y and dy are read once.
    row, chunk, cols, mask = claim_chunk(sync_ptr, n_cols, chunk_size, num_chunks, BLOCK_COLS)
    y_row = y_ptr + row_offset(row, inner, y_stride_outer, y_stride_inner)
    dy_row = dy_ptr + row_offset(row, inner, dy_stride_outer, dy_stride_inner)
    # y and dy wait for the row's dot in their input dtype (widened again after the wait, opaquely
    # on the GPU: see widen_opaque): two 16384-element bf16 tiles as fp32 took 255 registers a
    # thread and a stack at 4 warps (2 programs an SM).
    b_y = tl.load(y_row + col_offset(cols, y_stride_col, CONTIGUOUS), mask=mask, other=0.0)
    b_dy = tl.load(dy_row + col_offset(cols, dy_stride_col, CONTIGUOUS), mask=mask, other=0.0)
    if LOG:
        dot = tl.sum(b_dy.to(tl.float32), 0)
    else:
        dot = tl.sum(b_dy.to(tl.float32) * b_y.to(tl.float32), 0)
    tl.store(part_ptr + row.to(tl.int64) * num_chunks + chunk, dot)
    wait_for_row(sync_ptr, row, num_chunks)
    idx = tl.arange(0, CHUNKS_POW2)
    dot = tl.sum(tl.load(part_ptr + row.to(tl.int64) * num_chunks + idx, mask=idx < num_chunks, other=0.0,
                         volatile=True), 0)
    b_dx = grad_from_dot(widen_opaque(b_y, OPAQUE_WIDEN), widen_opaque(b_dy, OPAQUE_WIDEN), dot, inv_temperature, LOG)
    dx_row = dx_ptr + row_offset(row, inner, dx_stride_outer, dx_stride_inner)
    tl.store(dx_row + col_offset(cols, dx_stride_col, CONTIGUOUS), b_dx.to(dx_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _stride_groups(sizes, strides):
    """Merge adjacent dims whose strides chain (stride[i] == stride[i+1] * size[i+1]) into
    (size, stride) groups, outermost first; size-1 dims carry no stride and are dropped."""
    groups = []
    for size, stride in reversed([(sz, st) for sz, st in zip(sizes, strides) if sz != 1]):
        if groups and stride == groups[-1][1] * groups[-1][0]:
            groups[-1] = (groups[-1][0] * size, groups[-1][1])
        else:
            groups.append((size, stride))
    return groups[::-1]


def _row_layout(t: torch.Tensor, dim: int):
    """Describe the rows of ``t`` (every index but ``dim``) with at most two (size, stride) levels.

    Returns ``(t, inner, strides, side)``: row r sits at ``(r // inner) * stride_outer +
    (r % inner) * stride_inner`` and its columns ``stride_col`` apart; ``side`` says where the
    two levels come from ("both" sides of ``dim``, or all "before" / "after" it), which fixes the
    matching strides of a contiguous output. Views that need three or more levels are copied.
    """
    before = _stride_groups(t.shape[:dim], t.stride()[:dim])
    after = _stride_groups(t.shape[dim + 1:], t.stride()[dim + 1:])
    groups = before + after
    if len(groups) > 2:
        return _row_layout(t.contiguous(), dim)
    side = "both" if before and after else ("after" if after else "before")
    col_stride = t.stride(dim) if t.shape[dim] > 1 else 1
    if len(groups) == 2:
        return t, groups[1][0], (groups[0][1], col_stride, groups[1][1]), side
    return t, 1, (groups[0][1] if groups else 0, col_stride, 0), side


def _contiguous_row_strides(shape, dim: int, inner: int, side: str):
    """Strides of a contiguous tensor of ``shape`` under the row split ``inner`` of another tensor."""
    cols = shape[dim]
    inner_total = math.prod(shape[dim + 1:])
    if side == "both":
        return cols * inner_total, inner_total, 1
    unit = 1 if side == "after" else cols  # distance between consecutive rows
    return inner * unit, inner_total, unit


def _shape_rows(shape, dim):
    return math.prod(shape[:dim]) * math.prod(shape[dim + 1:]), shape[dim]


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: one object per signature
class _Recipe:
    """Everything about a launch that the input's shape, strides, dtype and options decide.

    Built once per distinct call signature and reused, so that a repeated call (a decode loop, a
    training step) costs a dictionary lookup, an allocation and the launches. The recipe's own
    identity, with the input pointer's alignment, is the compiled-kernel key (see ``_launch``).
    """

    plan: planner.Plan
    copy_input: bool  # the row dims do not merge into two (size, stride) levels: copy once
    inner: int
    in_strides: tuple
    out_strides: tuple
    contiguous: bool
    lse_shape: tuple
    opaque_widen: bool  # kernels may widen 16-bit tiles through inline PTX (not under the interpreter)


_RECIPES: dict = {}
_MAX_RECIPES = 4096  # distinct (shape, strides, dtype, options) signatures kept; then start over


def _recipe(key, t: torch.Tensor, dim: int, op: str, algorithm: str, strategy: Optional[str]) -> _Recipe:
    recipe = _RECIPES.get(key)
    if recipe is None:
        n_rows, n_cols = _shape_rows(t.shape, dim)
        chosen = planner.choose(op, n_rows, n_cols, t.dtype, t.device, algorithm, strategy)
        laid_out, inner, in_strides, side = _row_layout(t, dim)
        out_strides = _contiguous_row_strides(t.shape, dim, inner, side)
        recipe = _Recipe(chosen, laid_out is not t, inner, in_strides, out_strides,
                         in_strides[1] == 1 and out_strides[1] == 1, t.shape[:dim] + t.shape[dim + 1:],
                         planner.inline_ptx_allowed())
        if len(_RECIPES) >= _MAX_RECIPES:
            _RECIPES.clear()
        _RECIPES[key] = recipe
    return recipe


_row_on_chip_softmax = Launcher(row_on_chip_softmax_kernel)
_looped_softmax = Launcher(looped_softmax_kernel)
_split_row_partials = Launcher(split_row_partials_kernel)
_split_row_normalize = Launcher(split_row_normalize_kernel)
_split_row_on_chip_softmax = Launcher(split_row_on_chip_softmax_kernel)
_split_row_on_chip_backward = Launcher(split_row_on_chip_backward_kernel)
_row_on_chip_backward = Launcher(row_on_chip_backward_kernel)
_looped_backward = Launcher(looped_backward_kernel)
_split_row_backward_dot = Launcher(split_row_backward_dot_kernel)
_split_row_backward_apply = Launcher(split_row_backward_apply_kernel)


def _row_exchange(plan: planner.Plan, planes: int, device: torch.device):
    # split_row_on_chip's partials (``planes`` floats per chunk) and its counters: the ticket
    # counter and one arrival counter per row (see _triton.take_ticket).
    return _buffers.row_exchange(planes * plan.rows * plan.num_chunks, COUNTER_STRIDE.value * (1 + plan.rows), device)


def launch_forward(x: torch.Tensor, dim: int, op: str, temperature: float = 1.0,
                   out_dtype: Optional[torch.dtype] = None, algorithm: str = "auto",
                   strategy: Optional[str] = None) -> torch.Tensor:
    """Run ``op`` over ``dim`` of ``x``: softmax / log_softmax return y (dtype ``out_dtype``);
    logsumexp returns the fp32 log-sum-exp with ``dim`` removed. Inputs are validated by callers."""
    out_dtype = out_dtype or x.dtype
    device = x.device
    key = (x.shape, x.stride(), x.dtype, device, dim, op, out_dtype, algorithm, strategy,
           planner.interpreter_active())
    recipe = _recipe(key, x, dim, op, algorithm, strategy)
    chosen = recipe.plan
    planner.record(chosen)
    write_lse = op == "logsumexp"
    if chosen.strategy == "torch":
        return cpu.forward(x, dim, op, 1.0 / temperature, out_dtype, chosen.algorithm)
    # The output a launch does not write is passed as x: a valid pointer that is never stored to.
    y = x if write_lse else _buffers.empty(x.shape, out_dtype, device)
    lse = _buffers.empty(recipe.lse_shape, torch.float32, device) if write_lse else x
    if x.numel() == 0:
        if write_lse:
            lse.fill_(float("-inf"))
        return lse if write_lse else y
    if recipe.copy_input:
        x = x.contiguous()
        y = x if write_lse else y
    launch_key = (recipe, aligned(x))
    common = dict(LOG=op == "log_softmax", WRITE_Y=not write_lse, WRITE_LSE=write_lse, CONTIGUOUS=recipe.contiguous)
    inv_t = 1.0 / temperature
    n_cols, inner = chosen.cols, recipe.inner
    if chosen.strategy == "row_on_chip":
        _row_on_chip_softmax(
            chosen.grid, launch_key, x, y, lse, chosen.rows, n_cols, inner, *recipe.in_strides, *recipe.out_strides,
            inv_t, BLOCK_COLS=chosen.block_cols, ROWS_PER_PROGRAM=chosen.rows_per_program,
            HOLD_INPUT=chosen.hold_input, OPAQUE_WIDEN=recipe.opaque_widen, num_warps=chosen.num_warps,
            **common)
    elif chosen.strategy == "looped":
        _looped_softmax(
            chosen.grid, launch_key, x, y, lse, n_cols, inner, *recipe.in_strides, *recipe.out_strides, inv_t,
            BLOCK=chosen.block_cols, SAFE=chosen.algorithm == "safe", num_warps=chosen.num_warps, **common)
    elif chosen.strategy == "split_row_on_chip":
        parts, counters = _row_exchange(chosen, 2, device)  # (m, d) per chunk
        _split_row_on_chip_softmax(
            chosen.grid, launch_key, x, y, lse, parts, counters,
            n_cols, inner, *recipe.in_strides, *recipe.out_strides, chosen.chunk_size, chosen.num_chunks, inv_t,
            BLOCK_COLS=chosen.block_cols, CHUNKS_POW2=planner.next_power_of_2(chosen.num_chunks),
            OPAQUE_WIDEN=recipe.opaque_widen, num_warps=chosen.num_warps, **chosen.compile_options, **common)
    else:
        # One buffer for the three planes, no views of it: on the H100 machine's host each tensor
        # view cost about 5 us per call, as much as a launch.
        parts = _buffers.empty((3, chosen.rows, chosen.num_chunks), torch.float32, device)
        chunks_pow2 = planner.next_power_of_2(chosen.num_chunks)
        passes = (PARTIAL_MAX, PARTIAL_SUM) if chosen.algorithm == "safe" else (PARTIAL_ONLINE,)
        for partial_pass in passes:
            _split_row_partials(
                chosen.grid, (launch_key, partial_pass), x, parts, n_cols, inner,
                *recipe.in_strides, chosen.chunk_size, chosen.num_chunks, inv_t,
                BLOCK=chosen.block_cols, CHUNKS_POW2=chunks_pow2, CONTIGUOUS=recipe.contiguous, PASS=partial_pass,
                num_warps=chosen.num_warps)
        _split_row_normalize(
            (chosen.rows, 1 if write_lse else chosen.num_chunks), launch_key,
            x, y, lse, parts, n_cols, inner, *recipe.in_strides, *recipe.out_strides,
            chosen.chunk_size, chosen.num_chunks, inv_t,
            BLOCK=chosen.block_cols, CHUNKS_POW2=chunks_pow2, num_warps=chosen.num_warps, **common)
    return lse if write_lse else y


def launch_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, temperature: float = 1.0,
                    out_dtype: Optional[torch.dtype] = None, strategy: Optional[str] = None) -> torch.Tensor:
    """dx for y = softmax(x / T) (or log_softmax) given the upstream gradient dy."""
    op = "log_softmax_backward" if log else "softmax_backward"
    out_dtype = out_dtype or y.dtype
    # dy (from upstream) can be any view and is laid out by the recipe; y (our own output) and dx
    # are contiguous, so y's shape and dtype complete the key.
    device = y.device
    key = (dy.shape, dy.stride(), dy.dtype, y.dtype, device, dim, op, out_dtype, strategy,
           planner.interpreter_active())
    recipe = _recipe(key, dy, dim, op, "auto", strategy)
    chosen = recipe.plan
    planner.record(chosen)
    if chosen.strategy == "torch":
        return cpu.backward(y, dy, dim, log, 1.0 / temperature, out_dtype)
    dx = _buffers.empty(y.shape, out_dtype, device)
    if y.numel() == 0:
        return dx
    if recipe.copy_input:
        dy = dy.contiguous()
    y = y.contiguous()
    y_strides = dx_strides = recipe.out_strides
    launch_key = (recipe, aligned(dy), aligned(y))
    inv_t = 1.0 / temperature
    n_cols, inner, dy_strides = chosen.cols, recipe.inner, recipe.in_strides
    if chosen.strategy == "row_on_chip":
        _row_on_chip_backward(
            chosen.grid, launch_key, y, dy, dx, chosen.rows, n_cols, inner, *y_strides, *dy_strides, *dx_strides,
            inv_t, BLOCK_COLS=chosen.block_cols, ROWS_PER_PROGRAM=chosen.rows_per_program,
            CONTIGUOUS=recipe.contiguous, LOG=log, OPAQUE_WIDEN=recipe.opaque_widen,
            num_warps=chosen.num_warps)
    elif chosen.strategy == "looped":
        _looped_backward(
            chosen.grid, launch_key, y, dy, dx, n_cols, inner, *y_strides, *dy_strides, *dx_strides, inv_t,
            BLOCK=chosen.block_cols, CONTIGUOUS=recipe.contiguous, LOG=log, num_warps=chosen.num_warps)
    elif chosen.strategy == "split_row_on_chip":
        parts, counters = _row_exchange(chosen, 1, device)  # the dot per chunk
        _split_row_on_chip_backward(
            chosen.grid, launch_key, y, dy, dx, parts, counters,
            n_cols, inner, *y_strides, *dy_strides, *dx_strides, chosen.chunk_size, chosen.num_chunks, inv_t,
            BLOCK_COLS=chosen.block_cols, CHUNKS_POW2=planner.next_power_of_2(chosen.num_chunks),
            CONTIGUOUS=recipe.contiguous, LOG=log, OPAQUE_WIDEN=recipe.opaque_widen,
            num_warps=chosen.num_warps, **chosen.compile_options)
    else:
        parts = _buffers.empty((chosen.rows, chosen.num_chunks), torch.float32, device)
        _split_row_backward_dot(
            chosen.grid, launch_key, y, dy, parts, n_cols, inner, *y_strides, *dy_strides,
            chosen.chunk_size, chosen.num_chunks,
            BLOCK=chosen.block_cols, CONTIGUOUS=recipe.contiguous, LOG=log, num_warps=chosen.num_warps)
        _split_row_backward_apply(
            chosen.grid, launch_key, y, dy, dx, parts, n_cols, inner, *y_strides, *dy_strides, *dx_strides,
            chosen.chunk_size, chosen.num_chunks, inv_t,
            BLOCK=chosen.block_cols, CHUNKS_POW2=planner.next_power_of_2(chosen.num_chunks),
            CONTIGUOUS=recipe.contiguous, LOG=log, num_warps=chosen.num_warps)
    return dx


# --------------------------------------------------------------------------------------------
# Custom ops: torch.compile sees two opaque ops with fake (shape-only) implementations
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("onlinesoftmax::forward", mutates_args=())
def _forward_op(x: torch.Tensor, dim: int, op: str, temperature: float, out_dtype: Optional[torch.dtype],
                algorithm: str, strategy: Optional[str]) -> torch.Tensor:
    return launch_forward(x, dim, op, temperature, out_dtype, algorithm, strategy)


@_forward_op.register_fake
def _(x, dim, op, temperature, out_dtype, algorithm, strategy):
    if op == "logsumexp":
        return x.new_empty(x.shape[:dim] + x.shape[dim + 1:], dtype=torch.float32)
    return x.new_empty(x.shape, dtype=out_dtype or x.dtype)


@torch.library.custom_op("onlinesoftmax::backward", mutates_args=())
def _backward_op(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, temperature: float,
                 out_dtype: Optional[torch.dtype], strategy: Optional[str]) -> torch.Tensor:
    return launch_backward(y, dy, dim, log, temperature, out_dtype, strategy)


@_backward_op.register_fake
def _(y, dy, dim, log, temperature, out_dtype, strategy):
    return y.new_empty(y.shape, dtype=out_dtype or y.dtype)


_forward = op_when_compiling(_forward_op, launch_forward)
_backward = op_when_compiling(_backward_op, launch_backward)


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, log, temperature, out_dtype, algorithm, strategy):
        y = _forward(x, dim, "log_softmax" if log else "softmax", temperature, out_dtype, algorithm, strategy)
        ctx.save_for_backward(y)
        ctx.config = (dim, log, temperature, x.dtype, strategy)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dim, log, temperature, x_dtype, strategy = ctx.config
        return _backward(y, dy, dim, log, temperature, x_dtype, strategy), None, None, None, None, None, None


class _LogSumExpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, strategy):
        lse = _forward(x, dim, "logsumexp", 1.0, None, "auto", strategy)
        ctx.save_for_backward(x, lse)
        ctx.dim = dim
        # A fresh tensor even for float32: returning the saved tensor itself gave a wrong gradient
        # under torch.compile on CUDA (torch 2.11; the copy is one float per row).
        return lse.to(x.dtype, copy=True)

    @staticmethod
    def backward(ctx, dlse):
        # d lse / dx = softmax(x): one elementwise expression in torch, from the fp32 lse.
        x, lse = ctx.saved_tensors
        grad = dlse.float().unsqueeze(ctx.dim) * torch.exp(x.float() - lse.unsqueeze(ctx.dim))
        return grad.to(x.dtype), None, None


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class DimensionError(IndexError, ValueError):
    """``dim`` out of range. An IndexError like torch's, and a ValueError like our other argument errors."""


def _check(x, dim, temperature=1.0, dtype=None, algorithm="auto", strategy=None, name="softmax"):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {type(x).__name__}")
    if dtype is not None and dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype must be one of float32, float16, bfloat16 or None, got {dtype}")
    if x.dtype not in SUPPORTED_DTYPES:
        if x.dtype.is_floating_point or x.dtype.is_complex:
            raise TypeError(f"{name} supports float32, float16 and bfloat16 tensors, got {x.dtype}; "
                            "cast it, or use torch for this dtype")
        if dtype is None:
            raise TypeError(f"{name} needs a floating-point tensor, got {x.dtype}; pass dtype=torch.float32 "
                            "to compute in float32 (as torch.softmax(x, dim, dtype=...) does)")
        x = x.to(dtype)
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{name} runs on CUDA and CPU tensors, got a tensor on {x.device}")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name}: dim must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise DimensionError(f"{name}: dim {dim} is out of range for a tensor of {x.dim()} dims "
                             f"(expected in [{-ndim}, {ndim - 1}])")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"{name}: temperature must be a real number, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"{name}: temperature must be finite and > 0, got {temperature}")
    if algorithm not in planner.ALGORITHMS:
        raise ValueError(f"{name}: algorithm must be one of {planner.ALGORITHMS}, got {algorithm!r}")
    if strategy is not None and strategy not in planner.STRATEGIES:
        raise ValueError(f"{name}: strategy must be None or one of {planner.STRATEGIES}, got {strategy!r}")
    # A downcast (say float32 -> bfloat16) rounds the input first, as torch does.
    if dtype is not None and torch.finfo(dtype).bits < torch.finfo(x.dtype).bits:
        x = x.to(dtype)
    return x, dim % ndim


def _softmax_like(x, dim, temperature, dtype, algorithm, strategy, log):
    name = "log_softmax" if log else "softmax"
    x, dim = _check(x, dim, temperature, dtype, algorithm, strategy, name)
    if x.dim() == 0:
        return _softmax_like(x.reshape(1), 0, temperature, dtype, algorithm, strategy, log).reshape(())
    if not (x.requires_grad and torch.is_grad_enabled()):
        return _forward(x, dim, "log_softmax" if log else "softmax", float(temperature), dtype, algorithm, strategy)
    return _SoftmaxFunction.apply(x, dim, log, float(temperature), dtype, algorithm, strategy)


def softmax(x: torch.Tensor, dim: int = -1, *, temperature: float = 1.0, algorithm: str = "auto",
            dtype: Optional[torch.dtype] = None, strategy: Optional[str] = None) -> torch.Tensor:
    """Softmax of ``x / temperature`` along ``dim``, computed with the online normalizer.

    Parameters
    ----------
    x : Tensor
        float32, float16 or bfloat16, any shape (0-d included) and any strides, on CUDA or CPU.
        Integer input needs ``dtype``.
    dim : int
        The dimension to normalize over (negative counts from the end).
    temperature : float
        Divides the logits before the softmax; finite and > 0.
    algorithm : {"auto", "online", "safe"}
        ``"safe"``: three passes over memory (max, sum, write), as in the seeds. ``"online"``: two
        (the (m, d) recurrence, then the write). ``"auto"``: the fastest strategy for the shape,
        one pass when the row fits on chip.
    dtype : torch.dtype, optional
        Output dtype (float32, float16 or bfloat16); defaults to ``x.dtype``. Accumulation is
        float32 in every case. A narrower dtype than ``x``'s rounds the input first, like torch.
    strategy : str, optional
        Expert/testing override of the memory strategy: ``"row_on_chip"``, ``"looped"``,
        ``"split_row"``, ``"split_row_on_chip"`` or ``"torch"`` (see :mod:`onlinesoftmax.plan`).

    Returns
    -------
    Tensor
        Same shape as ``x``, contiguous, dtype ``dtype or x.dtype``.

    Notes
    -----
    Semantics follow ``torch.softmax``: ``-inf`` entries give 0, a row that is all ``-inf`` gives
    NaN, any NaN or ``+inf`` in a row makes the whole row NaN. Differentiable (Triton backward
    kernels) and traceable by ``torch.compile(fullgraph=True)``. CPU tensors run the same split
    and merge algorithm in vectorized PyTorch, or the Triton kernels when ``TRITON_INTERPRET=1``.

    Raises
    ------
    TypeError
        Non-tensor input, integer/bool/float64 input (without ``dtype``), a non-float ``dtype``.
    ValueError
        ``temperature`` <= 0 or not finite, unknown ``algorithm`` or ``strategy``, a device other
        than CUDA or CPU, ``dim`` out of range (:class:`DimensionError`, also an IndexError).

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> onlinesoftmax.softmax(torch.tensor([1.0, 2.0, 3.0]))
    tensor([0.0900, 0.2447, 0.6652])
    """
    return _softmax_like(x, dim, temperature, dtype, algorithm, strategy, log=False)


def log_softmax(x: torch.Tensor, dim: int = -1, *, temperature: float = 1.0, dtype: Optional[torch.dtype] = None,
                algorithm: str = "auto", strategy: Optional[str] = None) -> torch.Tensor:
    """Log-softmax of ``x / temperature`` along ``dim``: ``(x - m) - log(d)`` from the online normalizer.

    Same arguments, dtypes, layouts and errors as :func:`softmax`. ``-inf`` entries give ``-inf``;
    all ``-inf`` rows, NaN and ``+inf`` give NaN rows, as ``torch.log_softmax``.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> onlinesoftmax.log_softmax(torch.tensor([1.0, 2.0, 3.0]))
    tensor([-2.4076, -1.4076, -0.4076])
    """
    return _softmax_like(x, dim, temperature, dtype, algorithm, strategy, log=True)


def logsumexp(x: torch.Tensor, dim: int = -1, *, strategy: Optional[str] = None) -> torch.Tensor:
    """``log(sum(exp(x), dim))`` as ``m + log(d)`` from the online normalizer: the primitive behind softmax.

    Returns a tensor with ``dim`` removed, in ``x.dtype`` (computed in float32). Conventions of
    ``torch.logsumexp``: an all ``-inf`` (or empty) row gives ``-inf``, a ``+inf`` gives ``+inf``,
    NaN gives NaN. Errors as :func:`softmax`. Differentiable (the gradient is ``softmax(x)``).

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> onlinesoftmax.logsumexp(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    tensor([0.6931, 1.6931])
    """
    x, dim = _check(x, dim, strategy=strategy, name="logsumexp")
    if x.dim() == 0:
        return logsumexp(x.reshape(1), 0, strategy=strategy).reshape(())
    if not (x.requires_grad and torch.is_grad_enabled()):
        return _forward(x, dim, "logsumexp", 1.0, None, "auto", strategy).to(x.dtype)
    return _LogSumExpFunction.apply(x, dim, strategy)
