"""cross_entropy's small kernels: the denominators and the reduction of the rows' losses, the
scaling of an in-place gradient by the upstream one, and the loss from vocabulary shards'
statistics (the row kernels are in kernels.py and plain_kernel.py)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton import NEG_INF, nan_max, split_lse
from .kernels import class_weights, edge_columns, row_loss, row_tile
from .reductions import reduce_rows, reduce_rows_split, store_reduced_loss


@triton.jit
def cross_entropy_reduce_kernel(
    loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr, parts_ptr, sync_ptr,
    n_rows, n_classes, target_stride, ignore_index, z_loss,
    BLOCK: tl.constexpr, CHUNK: tl.constexpr, COUNT: tl.constexpr, SUM: tl.constexpr, MEAN: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, Z: tl.constexpr,
):
    # CHUNK 0: one program (see reductions.reduce_rows; the stream kernel's last row to finish runs the
    # same); else programs of CHUNK rows that meet in parts_ptr and sync_ptr (reductions.reduce_rows_split).
    if CHUNK == 0:
        reduce_rows(loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr, n_rows, n_classes, target_stride,
                    ignore_index, z_loss, BLOCK, COUNT, SUM, MEAN, HAS_WEIGHT, SMOOTH, Z, False)
    else:
        reduce_rows_split(loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr, parts_ptr, sync_ptr, n_rows,
                          n_classes, target_stride, ignore_index, z_loss, BLOCK, CHUNK, COUNT, SUM, MEAN, HAS_WEIGHT,
                          SMOOTH, Z)


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


@triton.jit
def cross_entropy_shard_merge_kernel(
    stats_ptr, target_ptr, weight_ptr, denom_ptr, loss_ptr, lse_ptr, lse_low_ptr, out_ptr,
    n_rows, n_shards, n_classes, target_stride, ignore_index, label_smoothing, z_loss,
    BLOCK: tl.constexpr, COUNT: tl.constexpr, REDUCE: tl.constexpr, MEAN: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, Z: tl.constexpr,
):
    # One program: every shard's (4, rows) statistics (m, d, smoothing sum, target logit; stacked in
    # class order, (shards, 4, rows)) merged into the rows' lse and loss, then the loss reduced, rows
    # and shards in a fixed order: every rank gets the same bits. In torch ops this was some forty
    # launches, the host's time of a sharded training step (shards.merge_shard_stats, shard_loss).
    if COUNT:  # denom first: the mean's denominators, and W for class weights with smoothing
        reduce_rows(loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr, n_rows, n_classes, target_stride,
                    ignore_index, 0.0, BLOCK, True, False, False, HAS_WEIGHT, SMOOTH, False, False)
        tl.debug_barrier()  # this program's threads read denom back
    lanes = tl.arange(0, BLOCK)
    plane = n_rows.to(tl.int64)
    total = tl.zeros([BLOCK], tl.float32)
    total_z = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        rows = start + lanes
        live = rows < n_rows
        m = tl.full([BLOCK], NEG_INF, tl.float32)
        for shard in range(n_shards):
            m = nan_max(m, tl.load(stats_ptr + shard * 4 * plane + rows, mask=live, other=NEG_INF))
        ref = tl.where(m == NEG_INF, 0.0, m)
        d = tl.zeros([BLOCK], tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        y_t = tl.full([BLOCK], NEG_INF, tl.float32)
        for shard in range(n_shards):
            base = stats_ptr + shard * 4 * plane + rows
            d += tl.load(base + plane, mask=live, other=0.0) * tl.exp(tl.load(base, mask=live, other=NEG_INF) - ref)
            s += tl.load(base + 2 * plane, mask=live, other=0.0)
            y_t = nan_max(y_t, tl.load(base + 3 * plane, mask=live, other=NEG_INF))
        lse, lse_low = split_lse(m, d)
        target = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=live, other=ignore_index).to(tl.int64)
        valid = live & (target != ignore_index)
        bad = valid & ((target < 0) | (target >= n_classes))
        w_t, w_sum = class_weights(weight_ptr, target, valid, bad, denom_ptr, n_classes, HAS_WEIGHT, SMOOTH)
        loss = row_loss(lse, lse_low, y_t, s, w_t, w_sum, valid, bad, label_smoothing, z_loss, n_classes, SMOOTH,
                        Z and not REDUCE)
        tl.store(lse_ptr + rows, lse, mask=live)
        tl.store(lse_low_ptr + rows, lse_low, mask=live)
        if REDUCE:
            total += loss
            if Z:
                total_z += tl.where(valid, lse * lse, 0.0)
        else:
            tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=live)
    if REDUCE:
        store_reduced_loss(total, total_z, z_loss, denom_ptr, out_ptr, MEAN, Z)
