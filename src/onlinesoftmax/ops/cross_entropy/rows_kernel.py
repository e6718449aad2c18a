"""cross_entropy over short rows: ROWS whole rows a program (plan strategy "rows").

The other kernels give a row at least one program. Rows of a few classes (segmentation's 19-150,
token classification's 9) then cost a program each, mostly masked lanes: a bf16 training step over
524288 rows of 19 took 1.74 ms on the H200 under CUDA graphs, torch's 0.82 (and torch's module on
them as 1 x 19 x 512 x 1024, classes at dim 1, 0.27; docs/perf-cross_entropy.md, "Short rows").
Here a program holds a [ROWS, BLOCK] tile, each row whole, and the row helpers of kernels.py act
on [ROWS] vectors and [ROWS, BLOCK] tiles as they do on a row's scalars and tiles. One body
(short_rows) serves the three ops behind two entry kernels, which take the forward kernels' and the
backward kernel's arguments: the forward (loss, lse and lse_low a row; WRITE_GRAD: and the gradient
for an upstream gradient of 1, over x or into dx) and the backward (the gradient from the saved lse).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton import NEG_INF, split_lse
from .kernels import (
    class_weights,
    gradient_destination,
    gradient,
    gradient_scales,
    gradient_terms,
    row_coefficients,
    row_loss,
    target_column,
    transform,
    weighted,
)


@triton.jit
def cross_entropy_rows_forward_kernel(
    x_ptr, target_ptr, weight_ptr, denom_ptr, loss_ptr, lse_ptr, lse_low_ptr, parts_ptr, sync_ptr, out_ptr, dx_ptr,
    n_rows, n_cols, x_stride, col_stride, target_stride, ignore_index, n_classes,
    label_smoothing, z_loss, softcap, tanh_scale, inv_temperature,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, GROUPS: tl.constexpr, CONTIGUOUS: tl.constexpr,
    ROWS_UNIT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr, Z: tl.constexpr,
    Z_IN_ROW: tl.constexpr, MEAN: tl.constexpr, READ_IGNORED: tl.constexpr, WRITE_GRAD: tl.constexpr,
    OUT_OF_PLACE: tl.constexpr,
):
    # The forward kernels' tensors (parts_ptr, sync_ptr and out_ptr unused); WRITE_GRAD: the gradient
    # over the logits, or OUT_OF_PLACE into dx_ptr.
    short_rows(x_ptr, gradient_destination(x_ptr, dx_ptr, OUT_OF_PLACE), target_ptr, weight_ptr, denom_ptr,
               loss_ptr, lse_ptr, lse_low_ptr, lse_ptr, n_rows, n_cols, x_stride, col_stride, target_stride, 0,
               ignore_index, 0, n_classes, label_smoothing, z_loss, softcap, tanh_scale, inv_temperature,
               ROWS, BLOCK, GROUPS, CONTIGUOUS, ROWS_UNIT, HAS_WEIGHT, SMOOTH, SOFTCAP, Z, Z_IN_ROW, MEAN,
               READ_IGNORED, True, WRITE_GRAD, True)


@triton.jit
def cross_entropy_rows_backward_kernel(
    x_ptr, dx_ptr, target_ptr, weight_ptr, denom_ptr, lse_ptr, lse_low_ptr, grad_ptr,
    n_rows, n_cols, x_stride, col_stride, target_stride, grad_stride, ignore_index, class_offset, n_classes,
    label_smoothing, z_loss, softcap, tanh_scale, inv_temperature,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, GROUPS: tl.constexpr, CONTIGUOUS: tl.constexpr,
    ROWS_UNIT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr, Z: tl.constexpr,
    MEAN: tl.constexpr, UNIT_GRAD: tl.constexpr,
):
    # The backward kernel's tensors; dx has x's strides (or is x). UNIT_GRAD: grad_ptr unread.
    short_rows(x_ptr, dx_ptr, target_ptr, weight_ptr, denom_ptr, lse_ptr, lse_ptr, lse_low_ptr, grad_ptr, n_rows,
               n_cols, x_stride, col_stride, target_stride, grad_stride, ignore_index, class_offset, n_classes,
               label_smoothing, z_loss, softcap, tanh_scale, inv_temperature, ROWS, BLOCK, GROUPS, CONTIGUOUS,
               ROWS_UNIT, HAS_WEIGHT, SMOOTH, SOFTCAP, Z, False, MEAN, False, False, True, UNIT_GRAD)


@triton.jit
def short_rows(
    x_ptr, dx_ptr, target_ptr, weight_ptr, denom_ptr, loss_ptr, lse_ptr, lse_low_ptr, grad_ptr,
    n_rows, n_cols, x_stride, col_stride, target_stride, grad_stride, ignore_index, class_offset, n_classes,
    label_smoothing, z_loss, softcap, tanh_scale, inv_temperature,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, GROUPS: tl.constexpr, CONTIGUOUS: tl.constexpr,
    ROWS_UNIT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr, Z: tl.constexpr,
    Z_IN_ROW: tl.constexpr, MEAN: tl.constexpr, READ_IGNORED: tl.constexpr, FORWARD: tl.constexpr,
    WRITE_GRAD: tl.constexpr, UNIT_GRAD: tl.constexpr,
):
    """The program's ROWS rows: FORWARD, their loss, lse and lse_low (and WRITE_GRAD, the gradient for
    an upstream gradient of 1 into dx_ptr); else their gradient from the saved lse into dx_ptr."""
    # ROWS_UNIT: consecutive rows are consecutive elements (the classes strided: torch's class dim 1
    # read through a view), so the tile's loads run along its rows; CONTIGUOUS: along its columns.
    # The tile is [ROWS, GROUPS, BLOCK // GROUPS], column g * (BLOCK // GROUPS) + c. Triton lays a
    # warp's lanes along the tile's most contiguous dim, then along the first of the others: the
    # columns of one group, then the rows. With GROUPS > 1 a warp's lanes span several rows, and each
    # row's own values (lse, loss, its gradient's terms) are computed by fewer lanes (at 32 columns and
    # GROUPS 1, each by a whole warp: a bf16 step over 524288 x 19 took 0.142 ms on the H200 under CUDA
    # graphs, 0.058 at GROUPS 8; plan.ROWS_COLUMN_GROUPS).
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    row_in = rows < n_rows
    cols = tl.arange(0, GROUPS)[None, :, None] * (BLOCK // GROUPS) + tl.arange(0, BLOCK // GROUPS)[None, None, :]
    rows64 = tile_of(rows.to(tl.int64))
    if ROWS_UNIT:
        offs = rows64 + cols.to(tl.int64) * col_stride
    elif CONTIGUOUS:
        offs = rows64 * x_stride + cols
    else:
        offs = rows64 * x_stride + cols.to(tl.int64) * col_stride
    target = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=row_in, other=ignore_index).to(tl.int64)
    valid = row_in & (target != ignore_index)  # rows past n_rows as ignored ones
    bad = valid & ((target < 0) | (target >= n_classes))
    live = tile_of(row_in) & (cols < n_cols)
    target_col = tile_of(target_column(target - class_offset, n_cols))
    w_t, w_sum = class_weights(weight_ptr, target, valid, bad, denom_ptr, n_classes, HAS_WEIGHT, SMOOTH)
    shard_weight_ptr = weight_ptr + class_offset
    upstream = 1.0
    # The tile's load does not wait for the targets' (whether a row is ignored is a mask after it): a
    # program holds a few rows, and a load that waits for another is most of its time.
    x = tl.load(x_ptr + offs, mask=live, other=0.0)
    if FORWARD:
        read = live & tile_of(valid | READ_IGNORED)
        y = tl.where(read, transform(x, softcap, inv_temperature, SOFTCAP), NEG_INF)
        m = row_max(y)  # a NaN makes d, and so the row, NaN whether or not the maximum keeps it
        d = row_sum(tl.exp(y - tile_of(tl.where(m == NEG_INF, 0.0, m))))
        lse = m + tl.log(d)
        lse_low = split_lse(m, d)[1]
        # The target's logit from the tile itself: in place, no program has written this row yet.
        y_t = row_sum(tl.where(cols == target_col, y, 0.0))
        s = 0.0
        if SMOOTH:
            s = row_sum(tl.where(read, weighted(y, shard_weight_ptr, cols, read, HAS_WEIGHT), 0.0))
        loss = row_loss(lse, lse_low, y_t, s, w_t, w_sum, valid, bad, label_smoothing, z_loss, n_classes, SMOOTH,
                        Z_IN_ROW)
        tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=row_in)
        tl.store(lse_ptr + rows, lse, mask=row_in)
        tl.store(lse_low_ptr + rows, lse_low, mask=row_in)
    else:
        lse = tl.load(lse_ptr + rows, mask=row_in, other=0.0)
        lse_low = tl.load(lse_low_ptr + rows, mask=row_in, other=0.0)
        if not UNIT_GRAD:
            upstream = tl.load(grad_ptr + rows.to(tl.int64) * grad_stride, mask=row_in, other=0.0).to(tl.float32)
    if WRITE_GRAD or not FORWARD:
        scale, scale_z = gradient_scales(denom_ptr, upstream, MEAN)
        a, b, e = row_coefficients(lse, w_t, w_sum, scale, scale_z, label_smoothing, z_loss, n_classes, SMOOTH, Z)
        a, b, e, lse, lse_low = gradient_terms(a, b, e, lse, lse_low, valid, bad, inv_temperature)
        # An ignored row's logits as 0 (its gradient 0), even where they were read for its lse.
        y = tl.where(tile_of(valid), transform(x, softcap, inv_temperature, SOFTCAP), 0.0)
        g = gradient(y, cols, target_col, tile_of(lse), tile_of(lse_low), tile_of(a), tile_of(b), tile_of(e),
                     shard_weight_ptr, live, tanh_scale, HAS_WEIGHT, SMOOTH, SOFTCAP)
        tl.store(dx_ptr + offs, g.to(dx_ptr.dtype.element_ty), mask=live)


@triton.jit
def tile_of(v):
    """A row's values [ROWS] as the tile's [ROWS, 1, 1]."""
    return v[:, None, None]


@triton.jit
def row_max(t):
    return tl.max(tl.max(t, 2), 1)


@triton.jit
def row_sum(t):
    return tl.sum(tl.sum(t, 2), 1)
