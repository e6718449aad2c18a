"""cross_entropy's reductions over rows, one program each (a fixed order: bitwise reproducible): the
denominators of "mean" and the rows' losses summed, for the stream kernel's last row, the reduce
kernel and the vocabulary shards' merge."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def reduce_rows(loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr, n_rows, n_classes, target_stride,
                ignore_index, z_loss, BLOCK: tl.constexpr, COUNT: tl.constexpr, SUM: tl.constexpr,
                MEAN: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, Z: tl.constexpr,
                VOLATILE: tl.constexpr):
    # One program, rows in a fixed order: bitwise reproducible. COUNT writes denom = (valid rows, sum of
    # their targets' weights, sum of all class weights); SUM reduces the rows' losses (and the z term,
    # over valid rows) into out. VOLATILE: this launch's other programs wrote the losses and lse.
    # The sum of all class weights is label smoothing's alone (kernels.class_weights): without
    # SMOOTH it is not summed and denom[2] holds 0. (Summed in this one program, it read every
    # class's weight: 64 x 151937 bf16 with weights took 0.075 ms a step in place under CUDA
    # graphs, 0.032 without.)
    lanes = tl.arange(0, BLOCK)
    if COUNT:
        count = tl.zeros([BLOCK], tl.int32)
        weights = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_rows, BLOCK):
            rows = start + lanes
            t = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=rows < n_rows, other=ignore_index)
            ok = (rows < n_rows) & (t != ignore_index)
            count += ok.to(tl.int32)
            if HAS_WEIGHT:
                weights += tl.load(weight_ptr + t, mask=ok & (t >= 0) & (t < n_classes), other=0.0).to(tl.float32)
        n_valid = tl.sum(count, 0).to(tl.float32)
        tl.store(denom_ptr, n_valid)
        if HAS_WEIGHT:
            tl.store(denom_ptr + 1, tl.sum(weights, 0))
            w_sum = tl.zeros([BLOCK], tl.float32)
            if SMOOTH:
                for start in range(0, n_classes, BLOCK):
                    w_sum += tl.load(weight_ptr + start + lanes, mask=start + lanes < n_classes,
                                     other=0.0).to(tl.float32)
            tl.store(denom_ptr + 2, tl.sum(w_sum, 0))
        else:
            tl.store(denom_ptr + 1, n_valid)
            tl.store(denom_ptr + 2, n_classes * 1.0)
    if SUM:
        total = tl.zeros([BLOCK], tl.float32)
        total_z = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_rows, BLOCK):
            rows = start + lanes
            total += tl.load(loss_ptr + rows, mask=rows < n_rows, other=0.0, volatile=VOLATILE).to(tl.float32)
            if Z:
                t = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=rows < n_rows, other=ignore_index)
                lse = tl.load(lse_ptr + rows, mask=(rows < n_rows) & (t != ignore_index), other=0.0, volatile=VOLATILE)
                total_z += lse * lse
        store_reduced_loss(total, total_z, z_loss, denom_ptr, out_ptr, MEAN, Z)


@triton.jit
def store_reduced_loss(total, total_z, z_loss, denom_ptr, out_ptr, MEAN: tl.constexpr, Z: tl.constexpr):
    """out <- the lanes' summed losses, plus z_loss times their summed lse^2, each over its "mean"
    denominator (all rows ignored: 0 / 0 = NaN, as torch)."""
    loss = tl.sum(total, 0)
    loss_z = z_loss * tl.sum(total_z, 0)
    if MEAN:
        loss = loss / tl.load(denom_ptr + 1)
        loss_z = loss_z / tl.load(denom_ptr)
    if Z:
        loss += loss_z
    tl.store(out_ptr, loss.to(out_ptr.dtype.element_ty))
