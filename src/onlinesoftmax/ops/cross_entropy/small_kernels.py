"""cross_entropy's small kernels: the denominators and the reduction of the rows' losses, and the
scaling of an in-place gradient by the upstream one (the row kernels are in kernels.py)."""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import edge_columns, reduce_rows, row_tile


@triton.jit
def cross_entropy_reduce_kernel(
    loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr,
    n_rows, n_classes, target_stride, ignore_index, z_loss,
    BLOCK: tl.constexpr, COUNT: tl.constexpr, SUM: tl.constexpr, MEAN: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, Z: tl.constexpr,
):
    # One program (see kernels.reduce_rows; the stream kernel's last row to finish runs the same).
    reduce_rows(loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr, n_rows, n_classes, target_stride,
                ignore_index, z_loss, BLOCK, COUNT, SUM, MEAN, HAS_WEIGHT, Z, False)


@triton.jit
def scale_rows_kernel(
    x_ptr, out_ptr, grad_ptr, n_cols, x_stride, col_stride, grad_stride, tiles_per_row, n_tiles,
    BLOCK: tl.constexpr, ALIGN: tl.constexpr, CONTIGUOUS: tl.constexpr, EDGES: tl.constexpr,
    PER_ROW: tl.constexpr, IN_PLACE: tl.constexpr,
):
    # out = x * upstream (one value, or one a row with PER_ROW), out having x's strides. Persistent
    # programs loop over (row, tile) pairs. In place, an upstream gradient of 1 leaves the tile
    # alone: without an early exit a "mean" loss's backward would read and write every gradient
    # element again (1.4 ms at 8192 x 128256 bf16) to multiply it by 1, and knowing it is 1 on
    # the host would cost a device synchronization.
    stop = n_tiles
    if IN_PLACE and not PER_ROW:
        stop = tl.where(tl.load(grad_ptr).to(tl.float32) == 1.0, 0, n_tiles)
    for tile in range(tl.program_id(0), stop, tl.num_programs(0)):
        row = tile // tiles_per_row
        k = tile % tiles_per_row
        upstream = tl.load(grad_ptr + row.to(tl.int64) * grad_stride).to(tl.float32)
        base = row.to(tl.int64) * x_stride
        start, offs, cols, full = row_tile(base, k, n_cols, col_stride, BLOCK, ALIGN, CONTIGUOUS, EDGES)
        if IN_PLACE and PER_ROW:  # (tl.where: the interpreter cannot AND a mask with a float comparison)
            full = tl.where(upstream != 1.0, full, False)
        x = tl.load(x_ptr + start + offs, mask=full, other=0.0)
        tl.store(out_ptr + start + offs, (x.to(tl.float32) * upstream).to(out_ptr.dtype.element_ty), mask=full)
        if EDGES:
            if k == 0:
                edge_cols, edge_mask = edge_columns(base, n_cols, ALIGN)
                if IN_PLACE and PER_ROW:
                    edge_mask = tl.where(upstream != 1.0, edge_mask, False)
                edge_x = tl.load(x_ptr + base + edge_cols, mask=edge_mask, other=0.0)
                tl.store(out_ptr + base + edge_cols, (edge_x.to(tl.float32) * upstream).to(out_ptr.dtype.element_ty),
                         mask=edge_mask)
