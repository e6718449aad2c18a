"""cross_entropy: Triton kernels.

Per row i with target t (y = softcap(x) / T, C classes, w the class weights, 1 without, W = sum w):

    lse  = m + log(d)                                   the online normalizer (m, d) of y
    loss = (1 - eps) w_t (lse - y_t) + eps/C (W lse - sum_c w_c y_c) + z lse^2
    dL/dy_c = a p_c - b [c = t] - e w_c,   p_c = exp((y_c - lse) - lse_low)
        b = s (1 - eps) w_t,   e = s eps / C,   a = b + e W + 2 z lse s_z

with lse_low the float32 lse's rounding error (_triton.split_lse): from a rounded lse alone, p_c
would carry up to half the lse's ulp of relative error (3.7e-6 at logits around 1000).

with s (s_z) the upstream gradient over the reduction's denominator: 1 for "sum" and "none" (times
the row's upstream gradient), 1 / sum_i w_t_i (1 / valid rows for the z term) for "mean". Ignored
rows have loss 0 and gradient 0; a target outside [0, C) that is not ignore_index gives a NaN loss
and a NaN gradient for its row (never an out-of-bounds read).

What each kernel reads and writes, and how rows off 16-byte boundaries (50257 columns) keep 16-byte
accesses (tiles from absolute 16-byte boundaries, masks constant over each vector, a row's partial
first and last runs element by element: EDGES, ALIGN), are in docs/perf-cross_entropy.md
("Kernels and what each moves", "Alignment").
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..._triton import (
    COUNTER_STRIDE,
    INTERPRETING,
    NEG_INF,
    known_multiple,
    merge_row_partials,
    nan_max,
    split_lse,
    store_row_partial,
    take_ticket,
    wait_for_row,
)
from .reductions import reduce_rows

# --------------------------------------------------------------------------------------------
# Row helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def transform(x, softcap, inv_temperature, SOFTCAP: tl.constexpr):
    """fp32 logits after the optional softcap (softcap * tanh(x / softcap)) and the temperature."""
    x = x.to(tl.float32)
    if SOFTCAP:
        # Soft-capped rows were the special-function units' time: a division by softcap per
        # element (a reciprocal each; the scalar's reciprocal once here) and tanh as one
        # exponential and a division, on top of the exponential every pass takes. libdevice's
        # tanh is a polynomial below |u| of about 0.6, an exponential above: a step of bf16 8192
        # x 128256 3.58 -> 2.56 ms keeping the logits, fp32 in place 4.36 -> 3.60, under CUDA
        # graphs (plain rows 1.88 and 3.02; docs/perf-h200.md). -inf -> -softcap, NaN stays NaN.
        u = x * (1.0 / softcap)
        if INTERPRETING:  # (Triton 3.6's interpreter has no libdevice: tanh from one exponential)
            e = tl.exp(-2.0 * tl.abs(u))
            t = (1.0 - e) / (1.0 + e)
            t = tl.where(u < 0.0, -t, t)
        else:
            t = libdevice.tanh(u)
        x = softcap * t
    return x * inv_temperature


@triton.jit
def row_tile(base, k, n_cols, col_stride, BLOCK: tl.constexpr, ALIGN: tl.constexpr, CONTIGUOUS: tl.constexpr,
             EDGES: tl.constexpr):
    """Tile ``k`` of the row whose first element is at offset ``base``: (start, offs, cols, full).

    The tile's elements are at ``ptr + start + offs`` and in columns ``cols``; ``full`` marks the
    16-byte vectors wholly inside the row, the only ones a tile loads, reduces and stores (the
    row's partial vectors are edge_columns'). Tiles are aligned to absolute multiples of ALIGN
    elements: a row with ``head = base % ALIGN`` has tile 0 start ``head`` elements before it, and
    cdiv(n_cols + head, BLOCK) tiles. Without EDGES every row starts on a vector (head 0), which
    the compiler then knows (the class weights of a tile load 16 bytes at a time too).
    """
    lanes = tl.arange(0, BLOCK)
    if CONTIGUOUS:
        head = 0
        if EDGES:
            head = (base % ALIGN).to(tl.int32)
        first = k * BLOCK - head  # the column of lane 0
        start = tl.multiple_of(base + first, ALIGN)
        offs = lanes
        cols = first + lanes
        if EDGES:
            vcols = first + (lanes // ALIGN) * ALIGN  # the column starting each lane's vector
            full = (vcols >= 0) & (vcols <= n_cols - ALIGN)
        else:  # rows of whole vectors, each starting one: a vector is in the row or past its end
            # (n_cols a known multiple of ALIGN: Triton's analysis then keeps 16-byte accesses where
            # n_cols is no multiple of 16, as 65544; else 2048 x 65544 bf16 loaded 2 bytes at a time)
            full = cols < known_multiple(n_cols, ALIGN)
    else:
        start = base
        cols = k * BLOCK + lanes
        offs = cols.to(tl.int64) * col_stride
        full = cols < n_cols
    return start, offs, cols, full


@triton.jit
def edge_columns(base, n_cols, ALIGN: tl.constexpr):
    """The row's columns in its partial first and last 16-byte vectors (those ``full`` leaves out), as
    one tile of 2 ALIGN lanes, and their mask: stored element by element, by one program a row."""
    lanes = tl.arange(0, 2 * ALIGN)
    head = (base % ALIGN).to(tl.int32)
    n_head = (ALIGN - head) % ALIGN  # elements before the row's first whole vector
    tail_start = n_cols - (n_cols + head) % ALIGN  # first column of the last partial vector
    is_head = lanes < ALIGN
    cols = tl.where(is_head, lanes, tail_start + lanes - ALIGN)
    # The tail leaves out a tiny row's head columns, which the head lanes own.
    mask = tl.where(is_head, lanes < n_head, cols >= n_head) & (cols >= 0) & (cols < n_cols)
    return cols, mask


@triton.jit
def edge_partial(x_ptr, weight_ptr, base, n_cols, read, softcap, inv_temperature, ALIGN: tl.constexpr,
                 HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr):
    """(m, d, smoothing sum) of the row's partial first and last vectors."""
    cols, mask = edge_columns(base, n_cols, ALIGN)
    mask = mask & read
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
    y = tl.where(mask, transform(x, softcap, inv_temperature, SOFTCAP), NEG_INF)
    m, d = tile_normalizer(y)
    s = 0.0
    if SMOOTH:
        s = smoothing_sum(y, weight_ptr, cols, mask, HAS_WEIGHT)
    return m, d, s


@triton.jit
def load_row_target(target_ptr, row, target_stride, ignore_index, n_classes):
    """The row's target (int64), whether it counts (not ignore_index), and whether it is out of range."""
    target = tl.load(target_ptr + row.to(tl.int64) * target_stride).to(tl.int64)
    valid = target != ignore_index
    bad = valid & ((target < 0) | (target >= n_classes))
    return target, valid, bad


@triton.jit
def target_column(target, n_cols):
    """The row's target as a column of the n_cols it has here, in int32; -1 (no column) where it is
    not among them (ignored, out of range, another shard's). Compared with every lane's column, the
    int64 target widened them all to 64 bits (ptxas for sm_90, bf16 at 32 elements a thread: 64
    registers and an 88-byte stack of spills, none in int32)."""
    return tl.where((target >= 0) & (target < n_cols), target, -1).to(tl.int32)


@triton.jit
def gradient_scales(denom_ptr, upstream, MEAN: tl.constexpr):
    """(s, s_z): the upstream gradient over the denominators of "mean" (sum of w_t, valid rows)."""
    if MEAN:
        return upstream / tl.load(denom_ptr + 1), upstream / tl.load(denom_ptr)
    return upstream, upstream


@triton.jit
def row_coefficients(lse, w_t, w_sum, scale, scale_z, label_smoothing, z_loss, n_classes,
                     SMOOTH: tl.constexpr, Z: tl.constexpr):
    """(a, b, e) of dL/dy_c = a p_c - b [c = t] - e w_c."""
    b = scale * (1.0 - label_smoothing) * w_t
    a = b
    e = scale * 0.0
    if SMOOTH:
        e = scale * label_smoothing / n_classes
        a += e * w_sum
    if Z:
        a += 2.0 * z_loss * lse * scale_z
    return a, b, e


@triton.jit
def gradient_terms(a, b, e, lse, lse_low, valid, bad, inv_temperature):
    """The row's (a, b, e, lse, lse_low) as gradient() takes them, so that its per-element work is the
    formula alone: the temperature folded into the coefficients, an ignored row's all 0 (its logits
    then read as 0: a gradient of exactly 0), a bad target's ``a`` NaN (a NaN gradient)."""
    a = tl.where(bad, float("nan"), tl.where(valid, a * inv_temperature, 0.0))
    b = tl.where(valid, b * inv_temperature, 0.0)
    e = tl.where(valid, e * inv_temperature, 0.0)
    return a, b, e, tl.where(valid, lse, 0.0), tl.where(valid, lse_low, 0.0)


@triton.jit
def gradient(y, cols, target_col, lse, lse_low, a, b, e, weight_ptr, live, tanh_scale,
             HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr):
    """dL/dx of a tile from its transformed logits ``y`` (finite outside the row: logits read as 0),
    the row's terms from gradient_terms and ``target_col`` from target_column."""
    g = a * tl.exp(y - lse - lse_low) - tl.where(cols == target_col, b, 0.0)
    if SMOOTH:
        if HAS_WEIGHT:
            g -= e * tl.load(weight_ptr + cols, mask=live, other=0.0).to(tl.float32)
        else:
            g -= e
    if SOFTCAP:
        g = g * softcap_slope(y, tanh_scale)
    return g


@triton.jit
def softcap_slope(y, tanh_scale):
    """d(softcap tanh(x / softcap)) / dx = 1 - tanh^2 from y = softcap * tanh(x / softcap) / T and
    tanh_scale = T / softcap."""
    th = y * tanh_scale
    return 1.0 - th * th


@triton.jit
def row_loss(lse, lse_low, y_t, s, w_t, w_sum, valid, bad, label_smoothing, z_loss, n_classes,
             SMOOTH: tl.constexpr, Z_IN_ROW: tl.constexpr):
    """The row's loss; the z term only where the rows are not reduced (the reduction adds it with its
    own denominator). lse - y_t is exact where they are close, lse_low then adds the lse's rounding."""
    loss = (1.0 - label_smoothing) * w_t * ((lse - y_t) + lse_low)
    if SMOOTH:
        loss += label_smoothing * ((w_sum * lse - s) + w_sum * lse_low) / n_classes
    if Z_IN_ROW:
        loss += z_loss * lse * lse
    loss = tl.where(valid, loss, 0.0)
    return tl.where(bad, float("nan"), loss)


@triton.jit
def class_weights(weight_ptr, target, valid, bad, denom_ptr, n_classes, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr):
    """(w_t, W): the target's weight and the sum of all class weights (1 and C without weights)."""
    w_t = 1.0
    w_sum = n_classes * 1.0
    if HAS_WEIGHT:
        w_t = tl.load(weight_ptr + target, mask=valid & ~bad, other=0.0).to(tl.float32)
        if SMOOTH:
            w_sum = tl.load(denom_ptr + 2)
    return w_t, w_sum


@triton.jit
def weighted(y, weight_ptr, cols, live, HAS_WEIGHT: tl.constexpr):
    """y * w_c (y without class weights)."""
    if HAS_WEIGHT:
        y = y * tl.load(weight_ptr + cols, mask=live, other=0.0).to(tl.float32)
    return y


@triton.jit
def smoothing_sum(y, weight_ptr, cols, live, HAS_WEIGHT: tl.constexpr):
    """sum_c w_c y_c over a tile's row elements."""
    return tl.sum(tl.where(live, weighted(y, weight_ptr, cols, live, HAS_WEIGHT), 0.0), 0)


@triton.jit
def tile_normalizer(y):
    """(m, d) of a tile (-inf outside the row): an all -inf tile is (-inf, 0)."""
    m = tl.max(y, 0)  # a NaN makes d, and so the row, NaN whether or not the maximum keeps it
    return m, tl.sum(tl.exp(y - tl.where(m == NEG_INF, 0.0, m)), 0)


@triton.jit
def merge_pair(m_a, d_a, m_b, d_b):
    """(m_a, d_a) (+) (m_b, d_b) for scalars, empty partials (-inf, 0) included."""
    m = nan_max(m_a, m_b)
    ref = tl.where(m == NEG_INF, 0.0, m)
    return m, d_a * tl.exp(m_a - ref) + d_b * tl.exp(m_b - ref)


@triton.jit
def target_logit(x_row, target, col_stride, in_row, softcap, inv_temperature, SOFTCAP: tl.constexpr):
    # One scalar load (usually from L2: the row is being read). In-place kernels load it before any
    # program of the row can have written its gradient there.
    x_t = tl.load(x_row + target * col_stride, mask=in_row, other=0.0)
    return tl.where(in_row, transform(x_t, softcap, inv_temperature, SOFTCAP), NEG_INF)


@triton.jit
def last_part_partial(x_ptr, weight_ptr, base, n_tiles, n_cols, col_stride, live, m, d, s, softcap, inv_temperature,
                      BLOCK: tl.constexpr, TAIL: tl.constexpr, ALIGN: tl.constexpr, CONTIGUOUS: tl.constexpr,
                      EDGES: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr,
                      EVICTION: tl.constexpr):
    """(m, d, smoothing sum) merged, where ``live``, with the row's columns past its ``n_tiles`` whole
    tiles of BLOCK: one tile of TAIL. A branch: other programs do not reduce an empty tile (every
    program doing so, masked, made bf16 8192 x 65544 slower than a program of its own for them)."""
    if live:
        start, offs, cols, full = row_tile(base, n_tiles * (BLOCK // TAIL), n_cols, col_stride, TAIL, ALIGN,
                                           CONTIGUOUS, EDGES)
        x = tl.load(x_ptr + start + offs, mask=full, other=0.0, eviction_policy=EVICTION)
        m, d, s = merge_tile(x, full, cols, m, d, s, weight_ptr, softcap, inv_temperature, HAS_WEIGHT, SMOOTH, SOFTCAP)
    return m, d, s


@triton.jit
def merge_tile(x, full, cols, m, d, s, weight_ptr, softcap, inv_temperature, HAS_WEIGHT: tl.constexpr,
               SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr):
    """(m, d, smoothing sum) merged with a tile's: its logits ``x`` at ``cols`` (those of ``full``)."""
    y = tl.where(full, transform(x, softcap, inv_temperature, SOFTCAP), NEG_INF)
    tile_m, tile_d = tile_normalizer(y)
    m, d = merge_pair(m, d, tile_m, tile_d)
    if SMOOTH:
        s += smoothing_sum(y, weight_ptr, cols, full, HAS_WEIGHT)
    return m, d, s


@triton.jit
def tile_gradient(x_ptr, dx_ptr, base, k, n_cols, col_stride, target_col, lse, lse_low, a, b, e, valid, weight_ptr,
                  softcap, tanh_scale, inv_temperature, WIDTH: tl.constexpr, ALIGN: tl.constexpr,
                  CONTIGUOUS: tl.constexpr, EDGES: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr,
                  SOFTCAP: tl.constexpr):
    """The backward's gradient over tile ``k`` of WIDTH columns of a row, from its terms (gradient_terms)."""
    start, offs, cols, full = row_tile(base, k, n_cols, col_stride, WIDTH, ALIGN, CONTIGUOUS, EDGES)
    x = tl.load(x_ptr + start + offs, mask=full & valid, other=0.0)
    y = tl.where(full & valid, transform(x, softcap, inv_temperature, SOFTCAP), 0.0)
    g = gradient(y, cols, target_col, lse, lse_low, a, b, e, weight_ptr, full, tanh_scale, HAS_WEIGHT, SMOOTH,
                 SOFTCAP)
    tl.store(dx_ptr + start + offs, g.to(dx_ptr.dtype.element_ty), mask=full)


@triton.jit
def write_edge_gradient(x_ptr, out_ptr, base, n_cols, target_col, lse, lse_low, a, b, e, valid, weight_ptr,
                        softcap, tanh_scale, inv_temperature,
                        ALIGN: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr):
    """The gradient of the row's partial first and last vectors, element by element (no other store
    touches them, so in place they still hold the logits); the row's terms from gradient_terms."""
    cols, mask = edge_columns(base, n_cols, ALIGN)
    x = tl.load(x_ptr + base + cols, mask=mask & valid, other=0.0)
    g = gradient(transform(x, softcap, inv_temperature, SOFTCAP), cols, target_col, lse, lse_low, a, b, e,
                 weight_ptr, mask, tanh_scale, HAS_WEIGHT, SMOOTH, SOFTCAP)
    tl.store(out_ptr + base + cols, g.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gradient_destination(x_ptr, dx_ptr, OUT_OF_PLACE: tl.constexpr):
    """The logits or (OUT_OF_PLACE) dx_ptr, at x's offsets: where a forward writes the gradient."""
    if OUT_OF_PLACE:
        return dx_ptr
    else:
        return x_ptr


# --------------------------------------------------------------------------------------------
# Forward: loss and lse from one read (strategies "stream" and, with WRITE_GRAD, "two_pass")
# --------------------------------------------------------------------------------------------


@triton.jit
def cross_entropy_stream_kernel(
    x_ptr, target_ptr, weight_ptr, denom_ptr, loss_ptr, lse_ptr, lse_low_ptr, parts_ptr, sync_ptr, out_ptr, dx_ptr,
    n_cols, x_stride, col_stride, target_stride, ignore_index, class_offset, n_classes,
    label_smoothing, z_loss, softcap, tanh_scale, inv_temperature, tiles_per_chunk,
    BLOCK: tl.constexpr, TAIL: tl.constexpr, TAIL_ORDER: tl.constexpr, CHUNKS_POW2: tl.constexpr, ALIGN: tl.constexpr,
    CONTIGUOUS: tl.constexpr, EDGES: tl.constexpr, SPLIT: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr, Z: tl.constexpr, Z_IN_ROW: tl.constexpr, MEAN: tl.constexpr,
    READ_IGNORED: tl.constexpr, WRITE_GRAD: tl.constexpr, STATS: tl.constexpr,
    FIRST_EVICTION: tl.constexpr = "", SECOND_EVICTION: tl.constexpr = "", REDUCE: tl.constexpr = False,
    COUNT: tl.constexpr = False, REDUCE_BLOCK: tl.constexpr = 1024, OUT_OF_PLACE: tl.constexpr = False,
):
    # Program (row, chunk) reads tiles [chunk * tiles_per_chunk, ...) of its row (the whole row
    # where rows are many: plan.STREAM_MIN_PROGRAMS_PER_SM): each tile's maximum, then its sum,
    # merged as scalars. (Per-lane online accumulators, as the softmax's looped kernel keeps, took
    # 162 registers a thread at 8192 bf16 columns and 8 warps, ptxas for sm_90: one program an SM.)
    # A row of one chunk is finished by its program; with SPLIT, each program publishes its partial
    # and the row's last to arrive merges them in chunk order (no program waits, so any grid size
    # runs, the interpreter's one program at a time included). WRITE_GRAD (one chunk a row, "two_pass"):
    # a second pass over the row writes the gradient over the logits. STATS (distributed): the row's
    # (m, d, smoothing sum, target logit or -inf) go to loss_ptr's four planes instead of a loss.
    # FIRST_EVICTION / SECOND_EVICTION: the cache eviction hints of the first read and of the
    # second read with the gradient's stores (two_pass: keep the row in L2 for the second read,
    # then drop it; nothing reads it again in this kernel). "" is the default policy. REDUCE: the last
    # row to arrive at sync_ptr's first counter reduces the losses into out_ptr (COUNT: denominators too).
    # TAIL < BLOCK (not with WRITE_GRAD): the row's columns past its whole tiles, at most TAIL, go to
    # its last chunk as one more tile of TAIL (plan.STREAM_TAIL_MAX_SHARE), reduced before its own
    # tiles ("first"), after them ("last"), or between its first tile's load and that tile's reduction
    # ("overlap": the two loads in flight together) by TAIL_ORDER (plan.STREAM_TAIL_ORDER).
    # OUT_OF_PLACE: WRITE_GRAD's gradient goes to dx_ptr (x's strides) instead of over the logits.
    tl.static_assert(TAIL == BLOCK or not WRITE_GRAD)
    g_ptr = gradient_destination(x_ptr, dx_ptr, OUT_OF_PLACE)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    num_chunks = tl.num_programs(1)
    target, valid, bad = load_row_target(target_ptr, row, target_stride, ignore_index, n_classes)
    local_target = target - class_offset
    target_col = target_column(local_target, n_cols)
    read = valid | READ_IGNORED
    base = row.to(tl.int64) * x_stride
    head = 0
    if EDGES:
        head = (base % ALIGN).to(tl.int32)
    k_start = chunk * tiles_per_chunk
    if TAIL < BLOCK:
        n_tiles = (n_cols + head) // BLOCK  # the row's whole tiles: every row's count (the plan's condition)
    else:
        n_tiles = (n_cols + head + BLOCK - 1) // BLOCK
    k_stop = tl.minimum(k_start + tiles_per_chunk, n_tiles)
    k_stop = tl.where(read, k_stop, k_start)  # an ignored row is not read
    m = tl.full((), NEG_INF, tl.float32)
    d = tl.zeros((), tl.float32)
    s = tl.zeros((), tl.float32)
    last_chunk = (chunk == num_chunks - 1) & read
    k_first = k_start
    if TAIL < BLOCK and TAIL_ORDER != "last":
        if TAIL_ORDER == "overlap":  # the chunk's first tile loaded now, reduced after the last part
            start, offs, cols, full = row_tile(base, k_start, n_cols, col_stride, BLOCK, ALIGN, CONTIGUOUS, EDGES)
            full = full & (k_start < k_stop)
            x = tl.load(x_ptr + start + offs, mask=full, other=0.0, eviction_policy=FIRST_EVICTION)
        m, d, s = last_part_partial(x_ptr, weight_ptr + class_offset, base, n_tiles, n_cols, col_stride, last_chunk,
                                    m, d, s, softcap, inv_temperature, BLOCK, TAIL, ALIGN, CONTIGUOUS, EDGES,
                                    HAS_WEIGHT, SMOOTH, SOFTCAP, FIRST_EVICTION)
        if TAIL_ORDER == "overlap":
            m, d, s = merge_tile(x, full, cols, m, d, s, weight_ptr + class_offset, softcap, inv_temperature,
                                 HAS_WEIGHT, SMOOTH, SOFTCAP)
            k_first = k_start + 1
    for k in range(k_first, k_stop):
        start, offs, cols, full = row_tile(base, k, n_cols, col_stride, BLOCK, ALIGN, CONTIGUOUS, EDGES)
        x = tl.load(x_ptr + start + offs, mask=full, other=0.0, eviction_policy=FIRST_EVICTION)
        m, d, s = merge_tile(x, full, cols, m, d, s, weight_ptr + class_offset, softcap, inv_temperature, HAS_WEIGHT,
                             SMOOTH, SOFTCAP)
    if EDGES:
        if chunk == 0:
            edge_m, edge_d, edge_s = edge_partial(x_ptr, weight_ptr + class_offset, base, n_cols, read, softcap,
                                                  inv_temperature, ALIGN, HAS_WEIGHT, SMOOTH, SOFTCAP)
            m, d = merge_pair(m, d, edge_m, edge_d)
            s += edge_s
    if TAIL < BLOCK and TAIL_ORDER == "last":
        m, d, s = last_part_partial(x_ptr, weight_ptr + class_offset, base, n_tiles, n_cols, col_stride, last_chunk,
                                    m, d, s, softcap, inv_temperature, BLOCK, TAIL, ALIGN, CONTIGUOUS, EDGES,
                                    HAS_WEIGHT, SMOOTH, SOFTCAP, FIRST_EVICTION)
    n_rows = tl.num_programs(0).to(tl.int64)
    finish = True
    if SPLIT:
        n_parts = n_rows * num_chunks
        store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d)
        tl.store(parts_ptr + 2 * n_parts + row.to(tl.int64) * num_chunks + chunk, s)
        tl.debug_barrier()  # the partials are stored before the arrival releases them
        count_ptr = sync_ptr + COUNTER_STRIDE * (1 + row)
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel") + 1
        finish = arrived == num_chunks
        if finish:
            tl.atomic_xchg(count_ptr, 0, sem="relaxed")  # zero for the next launch
            tl.debug_barrier()  # every thread's partial loads after the acquire, as in wait_for_row
            m, d = merge_row_partials(parts_ptr, n_parts, row, num_chunks, CHUNKS_POW2, True)
            idx = tl.arange(0, CHUNKS_POW2)
            s = tl.sum(tl.load(parts_ptr + 2 * n_parts + row.to(tl.int64) * num_chunks + idx,
                               mask=idx < num_chunks, other=0.0, volatile=True), 0)
    if finish:
        in_row = valid & (local_target >= 0) & (local_target < n_cols)
        y_t = target_logit(x_ptr + base, local_target, col_stride, in_row, softcap, inv_temperature, SOFTCAP)
        if WRITE_GRAD:
            tl.debug_barrier()  # the target's logit is read before any warp overwrites it (see the on_chip kernel)
        if STATS:
            tl.store(loss_ptr + row, m)
            tl.store(loss_ptr + n_rows + row, d)
            tl.store(loss_ptr + 2 * n_rows + row, s)
            tl.store(loss_ptr + 3 * n_rows + row, y_t)
        else:
            lse = m + tl.log(d)  # +inf or NaN in the row: NaN, as torch's cross_entropy
            lse_low = split_lse(m, d)[1]
            w_t, w_sum = class_weights(weight_ptr, target, valid, bad, denom_ptr, n_classes, HAS_WEIGHT, SMOOTH)
            loss = row_loss(lse, lse_low, y_t, s, w_t, w_sum, valid, bad, label_smoothing, z_loss, n_classes, SMOOTH, Z_IN_ROW)
            tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
            tl.store(lse_ptr + row, lse)
            tl.store(lse_low_ptr + row, lse_low)
            if WRITE_GRAD:
                scale, scale_z = gradient_scales(denom_ptr, 1.0, MEAN)
                a, b, e = row_coefficients(lse, w_t, w_sum, scale, scale_z, label_smoothing, z_loss, n_classes,
                                           SMOOTH, Z)
                a, b, e, lse_g, lse_low_g = gradient_terms(a, b, e, lse, lse_low, valid, bad, inv_temperature)
                for k in range(0, (n_cols + head + BLOCK - 1) // BLOCK):
                    start, offs, cols, full = row_tile(base, k, n_cols, col_stride, BLOCK, ALIGN, CONTIGUOUS, EDGES)
                    # An ignored row is not read (its logits 0, its gradient 0), even where its lse was.
                    x = tl.load(x_ptr + start + offs, mask=full & valid, other=0.0, eviction_policy=SECOND_EVICTION)
                    # No mask on y: lanes outside the row are not stored (with row_tile's mask of
                    # plain rows, in place 8192 x 50257 bf16 0.941 -> 0.860 ms: docs/perf-cross_entropy.md).
                    y = transform(x, softcap, inv_temperature, SOFTCAP)
                    g = gradient(y, cols, target_col, lse_g, lse_low_g, a, b, e, weight_ptr, full, tanh_scale,
                                 HAS_WEIGHT, SMOOTH, SOFTCAP)
                    tl.store(g_ptr + start + offs, g.to(g_ptr.dtype.element_ty), mask=full,
                             eviction_policy=SECOND_EVICTION)
                if EDGES:
                    write_edge_gradient(x_ptr, g_ptr, base, n_cols, target_col, lse_g, lse_low_g, a, b, e, valid,
                                        weight_ptr, softcap, tanh_scale, inv_temperature, ALIGN, HAS_WEIGHT, SMOOTH,
                                        SOFTCAP)
        if REDUCE:  # (ordering as in _triton.wait_for_row: stores, barrier, releasing arrival; acquire, barrier, loads)
            tl.debug_barrier()
            arrived = tl.atomic_add(sync_ptr, 1, sem="acq_rel") + 1
            if arrived == n_rows:
                tl.atomic_xchg(sync_ptr, 0, sem="relaxed")  # zero for the next launch
                tl.debug_barrier()
                reduce_rows(loss_ptr, lse_ptr, target_ptr, weight_ptr, denom_ptr, out_ptr, n_rows, n_classes,
                            target_stride, ignore_index, z_loss, REDUCE_BLOCK, COUNT, True, MEAN, HAS_WEIGHT, SMOOTH, Z,
                            True)


# --------------------------------------------------------------------------------------------
# Forward with the gradient in place: one read, one write ("on_chip", "split_on_chip")
# --------------------------------------------------------------------------------------------


@triton.jit
def cross_entropy_on_chip_kernel(
    x_ptr, target_ptr, weight_ptr, denom_ptr, loss_ptr, lse_ptr, lse_low_ptr, parts_ptr, sync_ptr, out_ptr, dx_ptr,
    n_cols, x_stride, col_stride, target_stride, ignore_index, n_classes,
    label_smoothing, z_loss, softcap, tanh_scale, inv_temperature, num_chunks,
    BLOCK: tl.constexpr, CHUNKS_POW2: tl.constexpr, ALIGN: tl.constexpr, CONTIGUOUS: tl.constexpr,
    EDGES: tl.constexpr, SPLIT: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr,
    SOFTCAP: tl.constexpr, Z: tl.constexpr, Z_IN_ROW: tl.constexpr, MEAN: tl.constexpr,
    READ_IGNORED: tl.constexpr, OUT_OF_PLACE: tl.constexpr = False,
):
    # A program holds one tile of BLOCK columns of its row in registers (the whole row without
    # SPLIT). With SPLIT, num_chunks programs hold one row: each publishes its tile's (m, d) (and
    # smoothing sum), waits at the row's counter until all have, merges them in chunk order and
    # writes its tile's gradient over the logits from registers, as the softmax's
    # split_row_on_chip kernel does (tickets: see _triton.take_ticket). Chunk 0 writes the loss,
    # the lse and the row's partial first and last vectors (EDGES). OUT_OF_PLACE: the gradient goes
    # to dx_ptr (x's strides) instead of over the logits.
    g_ptr = gradient_destination(x_ptr, dx_ptr, OUT_OF_PLACE)
    if SPLIT:
        ticket = take_ticket(sync_ptr)
        row = ticket // num_chunks
        chunk = ticket % num_chunks
    else:
        row = tl.program_id(0)
        chunk = 0
    target, valid, bad = load_row_target(target_ptr, row, target_stride, ignore_index, n_classes)
    read = valid | READ_IGNORED
    base = row.to(tl.int64) * x_stride
    start, offs, cols, full = row_tile(base, chunk, n_cols, col_stride, BLOCK, ALIGN, CONTIGUOUS, EDGES)
    # The tile waits for its row in the input dtype and is converted again after the wait. (ptxas for
    # sm_90, bf16, 16 elements a thread: 32 registers; converting through _triton.widen_opaque, as
    # the softmax's split_row_on_chip does, took 52.)
    live = full & read
    b_in = tl.load(x_ptr + start + offs, mask=live, other=0.0)  # [BLOCK]
    y = tl.where(live, transform(b_in, softcap, inv_temperature, SOFTCAP), NEG_INF)
    m, d = tile_normalizer(y)
    s = 0.0
    if SMOOTH:
        s = smoothing_sum(y, weight_ptr, cols, live, HAS_WEIGHT)
    in_row = valid & ~bad
    y_t = 0.0
    if chunk == 0:  # before the row's wait: no program of the row has written yet
        y_t = target_logit(x_ptr + base, target, col_stride, in_row, softcap, inv_temperature, SOFTCAP)
        if EDGES:
            edge_m, edge_d, edge_s = edge_partial(x_ptr, weight_ptr, base, n_cols, read, softcap, inv_temperature,
                                                  ALIGN, HAS_WEIGHT, SMOOTH, SOFTCAP)
            m, d = merge_pair(m, d, edge_m, edge_d)
            s += edge_s
    # The target's logit is read by one lane's thread and overwritten with its gradient by another's:
    # without a barrier between, another warp could store first and the loss read the gradient (bf16
    # 37 x 3001 on the H100: a loss of 12.0625 or 12.5 for 12.375, now and then).
    tl.debug_barrier()
    if SPLIT:
        n_parts = tl.num_programs(0).to(tl.int64)  # rows x chunks: planes m, d, smoothing sum
        store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d)
        if SMOOTH:
            tl.store(parts_ptr + 2 * n_parts + row.to(tl.int64) * num_chunks + chunk, s)
        wait_for_row(sync_ptr, row, num_chunks)
        m, d = merge_row_partials(parts_ptr, n_parts, row, num_chunks, CHUNKS_POW2, True)
        if SMOOTH:
            if chunk == 0:
                idx = tl.arange(0, CHUNKS_POW2)
                s = tl.sum(tl.load(parts_ptr + 2 * n_parts + row.to(tl.int64) * num_chunks + idx,
                                   mask=idx < num_chunks, other=0.0, volatile=True), 0)
    lse = m + tl.log(d)
    lse_low = split_lse(m, d)[1]
    w_t, w_sum = class_weights(weight_ptr, target, valid, bad, denom_ptr, n_classes, HAS_WEIGHT, SMOOTH)
    scale, scale_z = gradient_scales(denom_ptr, 1.0, MEAN)
    a, b, e = row_coefficients(lse, w_t, w_sum, scale, scale_z, label_smoothing, z_loss, n_classes, SMOOTH, Z)
    a, b, e, lse_g, lse_low_g = gradient_terms(a, b, e, lse, lse_low, valid, bad, inv_temperature)
    # An ignored row's logits as 0 (its gradient 0), even where they were read for its lse.
    y = tl.where(valid, transform(b_in, softcap, inv_temperature, SOFTCAP), 0.0)
    g = gradient(y, cols, target_column(target, n_cols), lse_g, lse_low_g, a, b, e, weight_ptr, live, tanh_scale,
                 HAS_WEIGHT, SMOOTH, SOFTCAP)
    tl.store(g_ptr + start + offs, g.to(g_ptr.dtype.element_ty), mask=full)
    if chunk == 0:
        loss = row_loss(lse, lse_low, y_t, s, w_t, w_sum, valid, bad, label_smoothing, z_loss, n_classes, SMOOTH, Z_IN_ROW)
        tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
        tl.store(lse_ptr + row, lse)
        tl.store(lse_low_ptr + row, lse_low)
        if EDGES:
            write_edge_gradient(x_ptr, g_ptr, base, n_cols, target_column(target, n_cols), lse_g, lse_low_g, a, b, e,
                                valid, weight_ptr, softcap, tanh_scale, inv_temperature, ALIGN, HAS_WEIGHT, SMOOTH,
                                SOFTCAP)


# --------------------------------------------------------------------------------------------
# Backward from the saved lse: one read of the logits, one write of the gradient
# --------------------------------------------------------------------------------------------


@triton.jit
def cross_entropy_backward_kernel(
    x_ptr, dx_ptr, target_ptr, weight_ptr, denom_ptr, lse_ptr, lse_low_ptr, grad_ptr,
    n_cols, x_stride, col_stride, target_stride, grad_stride, ignore_index, class_offset, n_classes,
    label_smoothing, z_loss, softcap, tanh_scale, inv_temperature, tiles_per_row, n_tiles,
    BLOCK: tl.constexpr, TAIL: tl.constexpr, ALIGN: tl.constexpr, CONTIGUOUS: tl.constexpr, EDGES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr, Z: tl.constexpr, MEAN: tl.constexpr,
    UNIT_GRAD: tl.constexpr, SKIP_UNIT: tl.constexpr = False,
):
    # Elementwise: program (row, k) writes tile k of the row. dx has x's strides (or is x: each element
    # is read before the same program writes it). An ignored row is not read. UNIT_GRAD: grad_ptr unread.
    # TAIL < BLOCK: the grid holds the rows' whole tiles, and the row's last program writes its columns
    # past them too, at most TAIL (plan.STREAM_TAIL_MAX_SHARE). SKIP_UNIT: dx holds a forward's gradient
    # for an upstream gradient of 1, left alone where grad (0-d) is 1; persistent programs loop over
    # the n_tiles (row, tile) pairs, so that leaving it costs a handful of programs (as scale_rows_kernel).
    if SKIP_UNIT:
        stop = tl.where(tl.load(grad_ptr).to(tl.float32) == 1.0, 0, n_tiles)
        for tile in range(tl.program_id(0), stop, tl.num_programs(0)):
            backward_tile(x_ptr, dx_ptr, target_ptr, weight_ptr, denom_ptr, lse_ptr, lse_low_ptr, grad_ptr,
                          tile // tiles_per_row, tile % tiles_per_row, tiles_per_row, n_cols, x_stride, col_stride,
                          target_stride, grad_stride, ignore_index, class_offset, n_classes, label_smoothing,
                          z_loss, softcap, tanh_scale, inv_temperature, BLOCK, TAIL, ALIGN, CONTIGUOUS, EDGES,
                          HAS_WEIGHT, SMOOTH, SOFTCAP, Z, MEAN, UNIT_GRAD)
    else:
        backward_tile(x_ptr, dx_ptr, target_ptr, weight_ptr, denom_ptr, lse_ptr, lse_low_ptr, grad_ptr,
                      tl.program_id(0), tl.program_id(1), tl.num_programs(1), n_cols, x_stride, col_stride,
                      target_stride, grad_stride, ignore_index, class_offset, n_classes, label_smoothing, z_loss,
                      softcap, tanh_scale, inv_temperature, BLOCK, TAIL, ALIGN, CONTIGUOUS, EDGES, HAS_WEIGHT,
                      SMOOTH, SOFTCAP, Z, MEAN, UNIT_GRAD)


@triton.jit
def backward_tile(x_ptr, dx_ptr, target_ptr, weight_ptr, denom_ptr, lse_ptr, lse_low_ptr, grad_ptr, row, k, n_tiles,
                  n_cols, x_stride, col_stride, target_stride, grad_stride, ignore_index, class_offset, n_classes,
                  label_smoothing, z_loss, softcap, tanh_scale, inv_temperature,
                  BLOCK: tl.constexpr, TAIL: tl.constexpr, ALIGN: tl.constexpr, CONTIGUOUS: tl.constexpr,
                  EDGES: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr,
                  Z: tl.constexpr, MEAN: tl.constexpr, UNIT_GRAD: tl.constexpr):
    """The backward kernel's tile ``k`` of ``row`` (of ``n_tiles`` a row; the last takes the row's tail too)."""
    target, valid, bad = load_row_target(target_ptr, row, target_stride, ignore_index, n_classes)
    target_col = target_column(target - class_offset, n_cols)
    lse = tl.load(lse_ptr + row)
    lse_low = tl.load(lse_low_ptr + row)
    upstream = 1.0 if UNIT_GRAD else tl.load(grad_ptr + row.to(tl.int64) * grad_stride).to(tl.float32)
    w_t, w_sum = class_weights(weight_ptr, target, valid, bad, denom_ptr, n_classes, HAS_WEIGHT, SMOOTH)
    scale, scale_z = gradient_scales(denom_ptr, upstream, MEAN)
    a, b, e = row_coefficients(lse, w_t, w_sum, scale, scale_z, label_smoothing, z_loss, n_classes, SMOOTH, Z)
    a, b, e, lse, lse_low = gradient_terms(a, b, e, lse, lse_low, valid, bad, inv_temperature)
    base = row.to(tl.int64) * x_stride
    tile_gradient(x_ptr, dx_ptr, base, k, n_cols, col_stride, target_col, lse, lse_low, a, b, e, valid,
                  weight_ptr + class_offset, softcap, tanh_scale, inv_temperature, BLOCK, ALIGN, CONTIGUOUS, EDGES,
                  HAS_WEIGHT, SMOOTH, SOFTCAP)
    if TAIL < BLOCK:
        if k == n_tiles - 1:  # a branch: the other programs do not compute an empty tile
            tile_gradient(x_ptr, dx_ptr, base, n_tiles * (BLOCK // TAIL), n_cols, col_stride, target_col, lse,
                          lse_low, a, b, e, valid, weight_ptr + class_offset, softcap, tanh_scale, inv_temperature,
                          TAIL, ALIGN, CONTIGUOUS, EDGES, HAS_WEIGHT, SMOOTH, SOFTCAP)
    if EDGES:
        if k == 0:
            write_edge_gradient(x_ptr, dx_ptr, base, n_cols, target_col, lse, lse_low, a, b, e, valid,
                                weight_ptr + class_offset, softcap, tanh_scale, inv_temperature,
                                ALIGN, HAS_WEIGHT, SMOOTH, SOFTCAP)
