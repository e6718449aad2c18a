"""cross_entropy's reductions over rows, in a fixed order (bitwise reproducible): the denominators
of "mean" and the rows' losses summed, in one program (the stream kernel's last row, the reduce
kernel over few rows and the vocabulary shards' merge) or over programs of a chunk of rows each (the
reduce kernel over many)."""

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
    # With COUNT and SUM the mean's denominators stay in registers: read back from denom, another
    # thread's store would need a barrier first.
    lanes = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], tl.int32)
    weights = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    total_z = tl.zeros([BLOCK], tl.float32)
    if COUNT:
        for start in range(0, n_rows, BLOCK):
            count, weights, total, total_z = add_rows(
                start + lanes, count, weights, total, total_z, loss_ptr, lse_ptr, target_ptr, weight_ptr, n_rows,
                n_classes, target_stride, ignore_index, True, False, HAS_WEIGHT, Z, VOLATILE)
        n_valid = tl.sum(count, 0).to(tl.float32)
        denominator = tl.sum(weights, 0) if HAS_WEIGHT else n_valid
        store_denominators(denom_ptr, weight_ptr, n_valid, denominator, n_classes, BLOCK, HAS_WEIGHT, SMOOTH)
    if SUM:
        for start in range(0, n_rows, BLOCK):
            count, weights, total, total_z = add_rows(
                start + lanes, count, weights, total, total_z, loss_ptr, lse_ptr, target_ptr, weight_ptr, n_rows,
                n_classes, target_stride, ignore_index, False, True, HAS_WEIGHT, Z, VOLATILE)
        if COUNT:
            store_loss(total, total_z, z_loss, denominator, n_valid, out_ptr, MEAN, Z)
        else:
            store_reduced_loss(total, total_z, z_loss, denom_ptr, out_ptr, MEAN, Z)


@triton.jit
def add_rows(rows, count, weights, total, total_z, loss_ptr, lse_ptr, target_ptr, weight_ptr, n_rows, n_classes,
             target_stride, ignore_index, COUNT: tl.constexpr, SUM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
             Z: tl.constexpr, VOLATILE: tl.constexpr):
    """The lanes' (valid rows, their targets' weights, losses, z terms) plus these rows': COUNT the
    first two, SUM the last two (the z terms with Z)."""
    live = rows < n_rows
    if COUNT or (SUM and Z):
        t = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=live, other=ignore_index)
        ok = live & (t != ignore_index)
        if COUNT:
            count += ok.to(tl.int32)
            if HAS_WEIGHT:
                weights += tl.load(weight_ptr + t, mask=ok & (t >= 0) & (t < n_classes), other=0.0).to(tl.float32)
        if SUM and Z:
            lse = tl.load(lse_ptr + rows, mask=ok, other=0.0, volatile=VOLATILE)
            total_z += lse * lse
    if SUM:
        total += tl.load(loss_ptr + rows, mask=live, other=0.0, volatile=VOLATILE).to(tl.float32)
    return count, weights, total, total_z


@triton.jit
def store_denominators(denom_ptr, weight_ptr, n_valid, target_weights, n_classes, BLOCK: tl.constexpr,
                       HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr):
    """denom <- (valid rows, sum of their targets' weights, sum of all class weights), from the first two."""
    tl.store(denom_ptr, n_valid)
    if HAS_WEIGHT:
        tl.store(denom_ptr + 1, target_weights)
        lanes = tl.arange(0, BLOCK)
        w_sum = tl.zeros([BLOCK], tl.float32)
        if SMOOTH:
            for start in range(0, n_classes, BLOCK):
                w_sum += tl.load(weight_ptr + start + lanes, mask=start + lanes < n_classes, other=0.0).to(tl.float32)
        tl.store(denom_ptr + 2, tl.sum(w_sum, 0))
    else:
        tl.store(denom_ptr + 1, n_valid)
        tl.store(denom_ptr + 2, n_classes * 1.0)


@triton.jit
def reduce_rows_split(loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr, parts_ptr, sync_ptr, n_rows,
                      n_classes, target_stride, ignore_index, z_loss, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                      COUNT: tl.constexpr, SUM: tl.constexpr, MEAN: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                      SMOOTH: tl.constexpr, Z: tl.constexpr):
    """reduce_rows over programs of CHUNK rows (a multiple of BLOCK): each writes its four partials
    (valid rows, their targets' weights, losses, z terms) to parts, and the last to arrive sums them
    in program order, a fixed order as reduce_rows'. One program over 524288 rows took 91 µs of a
    bf16 short-row step of 244 (H200; docs/perf-cross_entropy.md, "Short rows")."""
    program = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], tl.int32)
    weights = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    total_z = tl.zeros([BLOCK], tl.float32)
    for start in range(program * CHUNK, tl.minimum(program * CHUNK + CHUNK, n_rows), BLOCK):
        count, weights, total, total_z = add_rows(
            start + lanes, count, weights, total, total_z, loss_ptr, lse_ptr, target_ptr, weight_ptr, n_rows,
            n_classes, target_stride, ignore_index, COUNT, SUM, HAS_WEIGHT, Z, False)
    part = parts_ptr + 4 * program
    tl.store(part, tl.sum(count, 0).to(tl.float32))  # exact: CHUNK rows are far fewer than 2^24
    tl.store(part + 1, tl.sum(weights, 0))
    tl.store(part + 2, tl.sum(total, 0))
    tl.store(part + 3, tl.sum(total_z, 0))
    # (ordering as in _triton.wait_for_row: stores, barrier, releasing arrival; acquire, barrier, loads)
    tl.debug_barrier()
    n_programs = tl.num_programs(0)
    if tl.atomic_add(sync_ptr, 1, sem="acq_rel") + 1 == n_programs:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed")  # zero for the next launch
        tl.debug_barrier()
        counts = tl.zeros([BLOCK], tl.int32)
        target_weights = tl.zeros([BLOCK], tl.float32)
        losses = tl.zeros([BLOCK], tl.float32)
        z_terms = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_programs, BLOCK):
            slots = parts_ptr + 4 * (start + lanes)
            live = start + lanes < n_programs
            counts += tl.load(slots, mask=live, other=0.0, volatile=True).to(tl.int32)
            target_weights += tl.load(slots + 1, mask=live, other=0.0, volatile=True)
            losses += tl.load(slots + 2, mask=live, other=0.0, volatile=True)
            z_terms += tl.load(slots + 3, mask=live, other=0.0, volatile=True)
        n_valid = tl.sum(counts, 0).to(tl.float32)
        denominator = tl.sum(target_weights, 0) if HAS_WEIGHT else n_valid
        if COUNT:
            store_denominators(denom_ptr, weight_ptr, n_valid, denominator, n_classes, BLOCK, HAS_WEIGHT, SMOOTH)
        elif MEAN:
            n_valid = tl.load(denom_ptr)
            denominator = tl.load(denom_ptr + 1)
        if SUM:
            store_loss(losses, z_terms, z_loss, denominator, n_valid, out_ptr, MEAN, Z)


@triton.jit
def store_reduced_loss(total, total_z, z_loss, denom_ptr, out_ptr, MEAN: tl.constexpr, Z: tl.constexpr):
    """out <- the lanes' summed losses, plus z_loss times their summed lse^2, each over its "mean"
    denominator (all rows ignored: 0 / 0 = NaN, as torch)."""
    denominator, z_denominator = 1.0, 1.0  # (denom is empty for "sum")
    if MEAN:
        denominator, z_denominator = tl.load(denom_ptr + 1), tl.load(denom_ptr)
    store_loss(total, total_z, z_loss, denominator, z_denominator, out_ptr, MEAN, Z)


@triton.jit
def store_loss(total, total_z, z_loss, denominator, z_denominator, out_ptr, MEAN: tl.constexpr, Z: tl.constexpr):
    """store_reduced_loss with its denominators given."""
    loss = tl.sum(total, 0)
    loss_z = z_loss * tl.sum(total_z, 0)
    if MEAN:
        loss = loss / denominator
        loss_z = loss_z / z_denominator
    if Z:
        loss += loss_z
    tl.store(out_ptr, loss.to(out_ptr.dtype.element_ty))
