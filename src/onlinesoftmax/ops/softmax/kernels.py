"""softmax, log_softmax and logsumexp: the Triton kernels of every strategy (see ``plan.py``).

Every strategy computes the online normalizer (m, d) of each row (Milakov & Gimelshein, 2018): the running maximum
m and the sum d of exp(x - m), merged with the associative operator

    (m_a, d_a) (+) (m_b, d_b) = (M, d_a e^(m_a - M) + d_b e^(m_b - M)),   M = max(m_a, m_b)

and then writes y = exp(x - m) / d. The strategies differ only in where the row lives while that
happens (registers, a loop over device memory, or several programs); ``plan.py`` chooses between
them and ``op.py`` launches them.

Layout: a row is every index but the softmax dim's. The kernels address rows through two
(size, stride) levels, row r at (r // inner) * stride_outer + (r % inner) * stride_inner, so
strided, sliced and transposed tensors are read in place whenever their row dims merge into two
such levels (slices of a 3-d tensor in every dim do); other views are copied once with
``.contiguous()``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton import (
    aligned_row,
    chunk_span,
    edge_granules,
    normalized,
    write_grad_granule,
    write_normalized_granule,
    NEG_INF,
    claim_chunk,
    col_offset,
    finish_lse,
    grad_dot,
    grad_from_dot,
    known_multiple,
    max_keep_nan,
    merge_rank_pairs,
    merge_row_partials,
    nan_max,
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
def _tile_ptrs(ptr, rows, cols, inner, stride_outer, stride_col, stride_inner, CONTIGUOUS: tl.constexpr,
               ROW_ALIGN: tl.constexpr, UNIT_ROWS: tl.constexpr = 0):
    """Pointers of a [rows, cols] tile of row_on_chip's layout (rows starting at ROW_ALIGN multiples).
    UNIT_ROWS > 0: the program's UNIT_ROWS rows are consecutive elements from a multiple of 16 (the
    plan's unit_rows), addressed from the first, so that Triton sees them contiguous: loads along the
    rows, where row_offset's division hides it."""
    if UNIT_ROWS > 0:
        first = known_multiple(row_offset(tl.program_id(0) * UNIT_ROWS, inner, stride_outer, stride_inner), 16)
        return ptr + (first + tl.arange(0, UNIT_ROWS))[:, None] + col_offset(cols, stride_col, CONTIGUOUS)[None, :]
    return ptr + known_multiple(row_offset(rows, inner, stride_outer, stride_inner), ROW_ALIGN)[:, None] \
        + col_offset(cols, stride_col, CONTIGUOUS)[None, :]


@triton.jit
def row_on_chip_softmax_kernel(
    x_ptr, y_ptr, lse_ptr,
    n_rows, n_cols, inner,
    x_stride_outer, x_stride_col, x_stride_inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    inv_temperature,
    BLOCK_COLS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, CONTIGUOUS: tl.constexpr,
    LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr,
    HOLD_INPUT: tl.constexpr, OPAQUE_WIDEN: tl.constexpr, ROW_ALIGN: tl.constexpr, TAIL_COLS: tl.constexpr = 0,
    UNIT_ROWS: tl.constexpr = False,
):
    # One read and one write per element: the [rows, cols] tile stays in registers between the
    # max, the sum and the write; one program per block of rows. HOLD_INPUT keeps the tile in the
    # input dtype and widens it for each use (see split_row_on_chip_softmax_kernel). ROW_ALIGN > 1:
    # every row starts and ends on a multiple of ROW_ALIGN elements: a 16-byte boundary, or an 8- or
    # 4-byte one for rows that are not whole granules (see known_multiple, launch._row_align).
    # TAIL_COLS > 0: the row is a full power-of-two head of BLOCK_COLS and a second, smaller tile of
    # TAIL_COLS after it, so that a row just past a power of two does not idle half of a tile twice
    # its size (not with HOLD_INPUT). UNIT_ROWS: see _tile_ptrs.
    UNIT: tl.constexpr = ROWS_PER_PROGRAM if UNIT_ROWS else 0
    cols = tl.arange(0, BLOCK_COLS)
    n_cols = known_multiple(n_cols, ROW_ALIGN)
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    p_x = _tile_ptrs(x_ptr, rows, cols, inner, x_stride_outer, x_stride_col, x_stride_inner, CONTIGUOUS, ROW_ALIGN,
                     UNIT)
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
    if TAIL_COLS > 0:
        t_cols = BLOCK_COLS + tl.arange(0, TAIL_COLS)
        t_mask = (rows < n_rows)[:, None] & (t_cols < n_cols)[None, :]
        p_xt = _tile_ptrs(x_ptr, rows, t_cols, inner, x_stride_outer, x_stride_col, x_stride_inner, CONTIGUOUS,
                          ROW_ALIGN, UNIT)
        t_x = tl.load(p_xt, mask=t_mask, other=NEG_INF).to(tl.float32) * inv_temperature
        if WRITE_LSE:
            t_m = max_keep_nan(t_x, 1)
            b_m = tl.where((b_m != b_m) | (t_m != t_m), float("nan"), tl.maximum(b_m, t_m))
        else:
            b_m = tl.maximum(b_m, tl.max(t_x, 1))
        t_e = tl.exp(t_x - b_m[:, None])
    b_e = tl.exp(b_x - b_m[:, None])
    b_d = tl.sum(b_e, 1)  # an all -inf row gives NaN here, as torch.softmax does
    if TAIL_COLS > 0:
        b_d += tl.sum(t_e, 1)
    if WRITE_LSE:
        b_s = tl.sum(tl.where(mask, b_e, 0.0), 1)
        if TAIL_COLS > 0:
            b_s += tl.sum(tl.where(t_mask, t_e, 0.0), 1)
        tl.store(lse_ptr + rows, finish_lse(b_m, b_s), mask=rows < n_rows)
    if WRITE_Y:
        if HOLD_INPUT:
            b_x = widen_opaque(b_in, OPAQUE_WIDEN, 0) * inv_temperature
            b_e = tl.exp(b_x - b_m[:, None])
        if LOG:
            b_y = (b_x - b_m[:, None]) - tl.log(b_d)[:, None]
        else:
            b_y = b_e * (1.0 / b_d)[:, None]
        p_y = _tile_ptrs(y_ptr, rows, cols, inner, y_stride_outer, y_stride_col, y_stride_inner, CONTIGUOUS,
                         ROW_ALIGN, UNIT)
        tl.store(p_y, b_y.to(y_ptr.dtype.element_ty), mask=mask)
        if TAIL_COLS > 0:
            if LOG:
                t_y = (t_x - b_m[:, None]) - tl.log(b_d)[:, None]
            else:
                t_y = t_e * (1.0 / b_d)[:, None]
            p_yt = _tile_ptrs(y_ptr, rows, t_cols, inner, y_stride_outer, y_stride_col, y_stride_inner, CONTIGUOUS,
                              ROW_ALIGN, UNIT)
            tl.store(p_yt, t_y.to(y_ptr.dtype.element_ty), mask=t_mask)


@triton.jit
def looped_softmax_kernel(
    x_ptr, y_ptr, lse_ptr,
    n_cols, inner,
    x_stride_outer, x_stride_col, x_stride_inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    inv_temperature,
    BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, SAFE: tl.constexpr,
    LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr, ALIGN: tl.constexpr,
):
    # One program per row. Online: 2 reads of x (normalizer, write). Safe: 3 (max, sum, write).
    # ALIGN > 1: rows start anywhere and are read in whole 16-byte granules (see _triton.aligned_row).
    row = tl.program_id(0)
    x_row, head = aligned_row(x_ptr, row_offset(row, inner, x_stride_outer, x_stride_inner), ALIGN)
    if SAFE:
        m = stream_max(x_row, x_stride_col, 0, n_cols, head, inv_temperature, BLOCK, CONTIGUOUS, ALIGN)
        d = stream_sum_exp(x_row, x_stride_col, 0, n_cols, head, m, inv_temperature, BLOCK, CONTIGUOUS, ALIGN)
    else:
        m, d = stream_online_normalizer(x_row, x_stride_col, 0, n_cols, head, inv_temperature, BLOCK, CONTIGUOUS, ALIGN)
    if WRITE_LSE:
        tl.store(lse_ptr + row, finish_lse(m, d))
    if WRITE_Y:
        y_row, _ = aligned_row(y_ptr, row_offset(row, inner, y_stride_outer, y_stride_inner), ALIGN)
        stream_write_normalized(x_row, y_row, x_stride_col, y_stride_col, 0, n_cols, head, m, d, inv_temperature,
                                BLOCK, CONTIGUOUS, LOG, ALIGN)


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
    ALIGN: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * chunk_size
    stop = tl.minimum(start + chunk_size, n_cols)
    x_row, head = aligned_row(x_ptr, row_offset(row, inner, x_stride_outer, x_stride_inner), ALIGN)
    # parts holds three [rows, chunks] planes: m, d (store_row_partial) and (safe algorithm) the
    # chunk maxima.
    n_parts = tl.num_programs(0).to(tl.int64) * num_chunks
    part_max_ptr = parts_ptr + 2 * n_parts
    part = row.to(tl.int64) * num_chunks + chunk
    if PASS == 0:
        m, d = stream_online_normalizer(x_row, x_stride_col, start, stop, head, inv_temperature, BLOCK, CONTIGUOUS,
                                        ALIGN)
        store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d)
    elif PASS == 1:
        tl.store(part_max_ptr + part, stream_max(x_row, x_stride_col, start, stop, head, inv_temperature, BLOCK,
                                                 CONTIGUOUS, ALIGN))
    else:
        # Every chunk sums against the row maximum, so the merge that follows only adds the d's.
        idx = tl.arange(0, CHUNKS_POW2)
        row_maxes = tl.load(part_max_ptr + row.to(tl.int64) * num_chunks + idx, mask=idx < num_chunks, other=NEG_INF)
        m = max_keep_nan(row_maxes, 0)
        store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m,
                          stream_sum_exp(x_row, x_stride_col, start, stop, head, m, inv_temperature, BLOCK,
                                         CONTIGUOUS, ALIGN))


@triton.jit
def merge_partials_kernel(parts_ptr, pair_ptr, num_chunks, CHUNKS_POW2: tl.constexpr):
    # A row's (m, d) from its chunks' partials, into the (2, rows) planes of pair_ptr: one launch
    # where torch ops took six (a sharded row's one collective sends this pair).
    row = tl.program_id(0)
    n_rows = tl.num_programs(0).to(tl.int64)
    m, d = merge_row_partials(parts_ptr, n_rows * num_chunks, row, num_chunks, CHUNKS_POW2, False)
    tl.store(pair_ptr + row, m)
    tl.store(pair_ptr + n_rows + row, d)


@triton.jit
def split_row_normalize_kernel(
    x_ptr, y_ptr, lse_ptr, parts_ptr,
    n_cols, inner,
    x_stride_outer, x_stride_col, x_stride_inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    chunk_size, n_partials, inv_temperature,
    BLOCK: tl.constexpr, PARTIALS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr,
    LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr, ALIGN: tl.constexpr,
    RANK_MAJOR: tl.constexpr = False,
):
    # Every program merges all of its row's n_partials partials itself (a chunk's each, or a rank's
    # each in onlinesoftmax.distributed; from L2, in the same fixed tree order), which saves a
    # launch and keeps the result deterministic. RANK_MAJOR: the partials are the ranks' pairs as
    # the all_gather left them (merge_rank_pairs), read in place rather than permuted first.
    # Programs run in the reverse of the partials launch's order: the chunks that launch read
    # last are the ones still in L2, so they are read again first.
    row = tl.num_programs(0) - 1 - tl.program_id(0)
    chunk = tl.num_programs(1) - 1 - tl.program_id(1)
    if RANK_MAJOR:
        m, d = merge_rank_pairs(parts_ptr, tl.num_programs(0).to(tl.int64), row, n_partials, PARTIALS_POW2)
    else:
        n_parts = tl.num_programs(0).to(tl.int64) * n_partials  # the planes of split_row_partials_kernel
        m, d = merge_row_partials(parts_ptr, n_parts, row, n_partials, PARTIALS_POW2, False)
    if WRITE_LSE:
        tl.store(lse_ptr + row, finish_lse(m, d))
    if WRITE_Y:
        start = chunk * chunk_size
        stop = tl.minimum(start + chunk_size, n_cols)
        x_row, head = aligned_row(x_ptr, row_offset(row, inner, x_stride_outer, x_stride_inner), ALIGN)
        y_row, _ = aligned_row(y_ptr, row_offset(row, inner, y_stride_outer, y_stride_inner), ALIGN)
        stream_write_normalized(x_row, y_row, x_stride_col, y_stride_col, start, stop, head, m, d, inv_temperature,
                                BLOCK, CONTIGUOUS, LOG, ALIGN)


@triton.jit
def split_row_on_chip_softmax_kernel(
    x_ptr, y_ptr, lse_ptr, parts_ptr, sync_ptr,
    n_cols, inner,
    x_stride_outer, x_stride_col, x_stride_inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    chunk_size, num_chunks, inv_temperature,
    BLOCK_COLS: tl.constexpr, CHUNKS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr,
    LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr, OPAQUE_WIDEN: tl.constexpr,
    ALIGN: tl.constexpr,
):
    # A row too long for one program's registers, held by num_chunks programs at once: each keeps
    # its chunk in registers, publishes the chunk's (m, d), waits for the rest of the row, merges
    # the row's partials (all programs in the same fixed order) and writes from registers. One read
    # and one write per element, as row_on_chip, where split_row reads the row twice. ALIGN > 1:
    # x and y share a row layout whose rows start anywhere; chunks are cut at 16-byte boundaries
    # of memory (see _triton.aligned_row), which the plan's chunk count allows for. A row in one
    # chunk (CHUNKS_POW2 == 1: a row off 16-byte boundaries held whole, read in granules) takes no
    # ticket, partials or wait.
    if CHUNKS_POW2 == 1:
        row, chunk = tl.program_id(0), 0
    else:
        row, chunk = claim_chunk(sync_ptr, num_chunks)
    x_row, head = aligned_row(x_ptr, row_offset(row, inner, x_stride_outer, x_stride_inner), ALIGN)
    cols, whole, lo, hi = chunk_span(chunk, chunk_size, head, n_cols, BLOCK_COLS, ALIGN)
    # The chunk waits for the row in the input dtype (widened again after the wait, opaquely on the
    # GPU: see widen_opaque), as in split_row_on_chip_backward_kernel: half the registers for 2-byte
    # inputs, so more programs (and their loads) fit on an SM. The tile holds the chunk's whole
    # 16-byte granules (one mask, no select on the held tile: registers decide how many programs
    # an SM holds); a row's partial granules at its ends come as a small tile of their own.
    full = cols < whole
    b_in = tl.load(x_row + col_offset(cols, x_stride_col, CONTIGUOUS), mask=full, other=NEG_INF)
    b_x = b_in.to(tl.float32)
    # The maximum is taken of the unscaled chunk and then scaled: the same number, as rounding
    # x * (1/T) is monotone in x for T > 0, but ptxas otherwise keeps the chunk twice (scaled for
    # the maximum, unscaled for the exponentials), 96 registers a thread instead of 72 (fp32, 4
    # warps), which left 5 programs on an SM instead of 7.
    if WRITE_LSE:
        m = max_keep_nan(b_x, 0)
    else:
        # A NaN makes its chunk's d, and through the merge the whole row, NaN: tl.max will do.
        m = tl.max(b_x, 0)
    if ALIGN > 1:
        e_x, _ = edge_granules(x_row, x_stride_col, lo, hi, NEG_INF, CONTIGUOUS, ALIGN)
        e_x = e_x.to(tl.float32)
        m = nan_max(m, max_keep_nan(e_x, 0))
    m = m * inv_temperature
    m_ref = tl.where(m == NEG_INF, 0.0, m)
    # Widened again (COPY 1), not reusing b_x: the chunk then lives at 16 bits from the maximum on,
    # not as fp32 through the maximum's exchange between warps.
    b_x = widen_opaque(b_in, OPAQUE_WIDEN, 1) * inv_temperature
    d = tl.sum(tl.exp(b_x - m_ref), 0)  # an all -inf chunk is (-inf, 0)
    if ALIGN > 1:
        d += tl.sum(tl.exp(e_x * inv_temperature - m_ref), 0)
    if CHUNKS_POW2 > 1:
        n_parts = tl.num_programs(0).to(tl.int64)  # the two planes of parts: m, then d
        store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d)
        wait_for_row(sync_ptr, row, num_chunks)
        m, d = merge_row_partials(parts_ptr, n_parts, row, num_chunks, CHUNKS_POW2, True)
    b_x = widen_opaque(b_in, OPAQUE_WIDEN, 0) * inv_temperature
    if WRITE_LSE:
        if chunk == 0:
            tl.store(lse_ptr + row, finish_lse(m, d))
    if WRITE_Y:
        b_y = normalized(b_x, m, d, LOG)  # an all -inf row gives NaN, as torch.softmax does
        y_row, _ = aligned_row(y_ptr, row_offset(row, inner, y_stride_outer, y_stride_inner), ALIGN)
        tl.store(y_row + col_offset(cols, y_stride_col, CONTIGUOUS), b_y.to(y_ptr.dtype.element_ty), mask=full)
        if ALIGN > 1:  # the partial granules at the row's two ends, from x again
            if lo % ALIGN != 0:
                write_normalized_granule(x_row, y_row, x_stride_col, y_stride_col, lo - lo % ALIGN, lo, hi, m, d,
                                         inv_temperature, CONTIGUOUS, LOG, ALIGN)
            if hi % ALIGN != 0:
                write_normalized_granule(x_row, y_row, x_stride_col, y_stride_col, hi - hi % ALIGN, lo, hi, m, d,
                                         inv_temperature, CONTIGUOUS, LOG, ALIGN)


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
    OPAQUE_WIDEN: tl.constexpr, ROW_ALIGN: tl.constexpr, TAIL_COLS: tl.constexpr = 0, UNIT_ROWS: tl.constexpr = False,
):
    # ROW_ALIGN, TAIL_COLS and UNIT_ROWS as in row_on_chip_softmax_kernel.
    UNIT: tl.constexpr = ROWS_PER_PROGRAM if UNIT_ROWS else 0
    cols = tl.arange(0, BLOCK_COLS)
    n_cols = known_multiple(n_cols, ROW_ALIGN)
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    p_y = _tile_ptrs(y_ptr, rows, cols, inner, y_stride_outer, y_stride_col, y_stride_inner, CONTIGUOUS, ROW_ALIGN,
                     UNIT)
    p_dy = _tile_ptrs(dy_ptr, rows, cols, inner, dy_stride_outer, dy_stride_col, dy_stride_inner, CONTIGUOUS,
                      ROW_ALIGN, UNIT)
    # A tile of at most 32 columns may leave one element of a row to a lane: its products are
    # rounded before the sum, which is then the same on every lane (see rounded_product). Wider
    # tiles sum within each lane first (rounding every product there cost bf16 32768 x 1024 eight
    # registers a thread: ptxas for sm_90, scripts/probes/kernel_resources.py).
    ROUND_HEAD: tl.constexpr = OPAQUE_WIDEN and BLOCK_COLS <= 32
    ROUND_TAIL: tl.constexpr = OPAQUE_WIDEN and TAIL_COLS <= 32
    # In the input dtype across the row's reduction, as in split_row_on_chip_backward_kernel.
    b_y = tl.load(p_y, mask=mask, other=0.0)  # [R, C]
    b_dy = tl.load(p_dy, mask=mask, other=0.0)
    b_dot = grad_dot(b_y, b_dy, 1, LOG, ROUND_HEAD)
    if TAIL_COLS > 0:
        t_cols = BLOCK_COLS + tl.arange(0, TAIL_COLS)
        t_mask = (rows < n_rows)[:, None] & (t_cols < n_cols)[None, :]
        t_y = tl.load(_tile_ptrs(y_ptr, rows, t_cols, inner, y_stride_outer, y_stride_col, y_stride_inner,
                                 CONTIGUOUS, ROW_ALIGN, UNIT), mask=t_mask, other=0.0)
        t_dy = tl.load(_tile_ptrs(dy_ptr, rows, t_cols, inner, dy_stride_outer, dy_stride_col, dy_stride_inner,
                                  CONTIGUOUS, ROW_ALIGN, UNIT), mask=t_mask, other=0.0)
        b_dot += grad_dot(t_y, t_dy, 1, LOG, ROUND_TAIL)
    b_dx = grad_from_dot(widen_opaque(b_y, OPAQUE_WIDEN), widen_opaque(b_dy, OPAQUE_WIDEN), b_dot[:, None],
                         inv_temperature, LOG)
    p_dx = _tile_ptrs(dx_ptr, rows, cols, inner, dx_stride_outer, dx_stride_col, dx_stride_inner, CONTIGUOUS,
                      ROW_ALIGN, UNIT)
    tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if TAIL_COLS > 0:
        t_dx = grad_from_dot(t_y.to(tl.float32), t_dy.to(tl.float32), b_dot[:, None], inv_temperature, LOG)
        tl.store(_tile_ptrs(dx_ptr, rows, t_cols, inner, dx_stride_outer, dx_stride_col, dx_stride_inner,
                            CONTIGUOUS, ROW_ALIGN, UNIT), t_dx.to(dx_ptr.dtype.element_ty), mask=t_mask)


@triton.jit
def looped_backward_kernel(
    y_ptr, dy_ptr, dx_ptr,
    n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    dx_stride_outer, dx_stride_col, dx_stride_inner,
    inv_temperature,
    BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr, ALIGN: tl.constexpr,
):
    # ALIGN > 1: y, dy and dx share one row layout whose rows start anywhere (see _triton.aligned_row).
    row = tl.program_id(0)
    y_row, head = aligned_row(y_ptr, row_offset(row, inner, y_stride_outer, y_stride_inner), ALIGN)
    dy_row, _ = aligned_row(dy_ptr, row_offset(row, inner, dy_stride_outer, dy_stride_inner), ALIGN)
    dx_row, _ = aligned_row(dx_ptr, row_offset(row, inner, dx_stride_outer, dx_stride_inner), ALIGN)
    dot = stream_grad_dot(y_row, dy_row, y_stride_col, dy_stride_col, 0, n_cols, head, BLOCK, CONTIGUOUS, LOG, ALIGN)
    stream_write_grad(y_row, dy_row, dx_row, y_stride_col, dy_stride_col, dx_stride_col, 0, n_cols, head, dot,
                      inv_temperature, BLOCK, CONTIGUOUS, LOG, ALIGN)


@triton.jit
def split_row_backward_dot_kernel(
    y_ptr, dy_ptr, part_ptr,
    n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    chunk_size, num_chunks,
    BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr, ALIGN: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * chunk_size
    stop = tl.minimum(start + chunk_size, n_cols)
    y_row, head = aligned_row(y_ptr, row_offset(row, inner, y_stride_outer, y_stride_inner), ALIGN)
    dy_row, _ = aligned_row(dy_ptr, row_offset(row, inner, dy_stride_outer, dy_stride_inner), ALIGN)
    dot = stream_grad_dot(y_row, dy_row, y_stride_col, dy_stride_col, start, stop, head, BLOCK, CONTIGUOUS, LOG,
                          ALIGN)
    tl.store(part_ptr + row.to(tl.int64) * num_chunks + chunk, dot)


@triton.jit
def split_row_backward_apply_kernel(
    y_ptr, dy_ptr, dx_ptr, part_ptr,
    n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    dx_stride_outer, dx_stride_col, dx_stride_inner,
    chunk_size, n_partials, inv_temperature,
    BLOCK: tl.constexpr, PARTIALS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr,
    ALIGN: tl.constexpr,
):
    # Reverse order, as in split_row_normalize_kernel: what the dot launch read last is in L2.
    row = tl.num_programs(0) - 1 - tl.program_id(0)
    chunk = tl.num_programs(1) - 1 - tl.program_id(1)
    # The row's n_partials dot products (a chunk's each, or a rank's each), summed in index order.
    idx = tl.arange(0, PARTIALS_POW2)
    dot = tl.sum(tl.load(part_ptr + row.to(tl.int64) * n_partials + idx, mask=idx < n_partials, other=0.0), 0)
    start = chunk * chunk_size
    stop = tl.minimum(start + chunk_size, n_cols)
    y_row, head = aligned_row(y_ptr, row_offset(row, inner, y_stride_outer, y_stride_inner), ALIGN)
    dy_row, _ = aligned_row(dy_ptr, row_offset(row, inner, dy_stride_outer, dy_stride_inner), ALIGN)
    dx_row, _ = aligned_row(dx_ptr, row_offset(row, inner, dx_stride_outer, dx_stride_inner), ALIGN)
    stream_write_grad(y_row, dy_row, dx_row, y_stride_col, dy_stride_col, dx_stride_col, start, stop, head, dot,
                      inv_temperature, BLOCK, CONTIGUOUS, LOG, ALIGN)


@triton.jit
def split_row_on_chip_backward_kernel(
    y_ptr, dy_ptr, dx_ptr, part_ptr, sync_ptr,
    n_cols, inner,
    y_stride_outer, y_stride_col, y_stride_inner,
    dy_stride_outer, dy_stride_col, dy_stride_inner,
    dx_stride_outer, dx_stride_col, dx_stride_inner,
    chunk_size, num_chunks, inv_temperature,
    BLOCK_COLS: tl.constexpr, CHUNKS_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr,
    OPAQUE_WIDEN: tl.constexpr, ALIGN: tl.constexpr, TAIL_COLS: tl.constexpr = 0,
):
    # As split_row_on_chip_softmax_kernel: the chunk's y and dy stay in registers while the row's
    # programs exchange their partial dot products, so y and dy are read once (one chunk: as there).
    # TAIL_COLS > 0 (one chunk only): the row is held as a head tile of BLOCK_COLS and a tail tile
    # after it, as row_on_chip_backward_kernel's, where one power-of-two tile would be half idle.
    if CHUNKS_POW2 == 1:
        row, chunk = tl.program_id(0), 0
    else:
        row, chunk = claim_chunk(sync_ptr, num_chunks)
    y_row, head = aligned_row(y_ptr, row_offset(row, inner, y_stride_outer, y_stride_inner), ALIGN)
    dy_row, _ = aligned_row(dy_ptr, row_offset(row, inner, dy_stride_outer, dy_stride_inner), ALIGN)
    cols, whole, lo, hi = chunk_span(chunk, chunk_size, head, n_cols, BLOCK_COLS, ALIGN)
    # y and dy wait for the row's dot in their input dtype (widened again after the wait, opaquely
    # on the GPU: see widen_opaque): two 16384-element bf16 tiles as fp32 took 255 registers a
    # thread and a stack at 4 warps (2 programs an SM).
    # Whole granules in the held tiles, the row's partial granules in a small tile (see the forward).
    full = cols < whole
    b_y = tl.load(y_row + col_offset(cols, y_stride_col, CONTIGUOUS), mask=full, other=0.0)
    b_dy = tl.load(dy_row + col_offset(cols, dy_stride_col, CONTIGUOUS), mask=full, other=0.0)
    dot = grad_dot(b_y, b_dy, 0, LOG)
    if TAIL_COLS > 0:
        t_cols = chunk_span(chunk, chunk_size, head, n_cols, TAIL_COLS, ALIGN)[0] + BLOCK_COLS
        t_full = t_cols < whole
        t_y = tl.load(y_row + col_offset(t_cols, y_stride_col, CONTIGUOUS), mask=t_full, other=0.0)
        t_dy = tl.load(dy_row + col_offset(t_cols, dy_stride_col, CONTIGUOUS), mask=t_full, other=0.0)
        dot += grad_dot(t_y, t_dy, 0, LOG)
    if ALIGN > 1:
        e_dy, _ = edge_granules(dy_row, dy_stride_col, lo, hi, 0.0, CONTIGUOUS, ALIGN)
        e_y = e_dy  # log-softmax's sum reads dy alone
        if not LOG:
            e_y, _ = edge_granules(y_row, y_stride_col, lo, hi, 0.0, CONTIGUOUS, ALIGN)
        dot += grad_dot(e_y, e_dy, 0, LOG)
    if CHUNKS_POW2 > 1:
        tl.store(part_ptr + row.to(tl.int64) * num_chunks + chunk, dot)
        wait_for_row(sync_ptr, row, num_chunks)
        idx = tl.arange(0, CHUNKS_POW2)
        dot = tl.sum(tl.load(part_ptr + row.to(tl.int64) * num_chunks + idx, mask=idx < num_chunks, other=0.0,
                             volatile=True), 0)
    b_dx = grad_from_dot(widen_opaque(b_y, OPAQUE_WIDEN), widen_opaque(b_dy, OPAQUE_WIDEN), dot, inv_temperature, LOG)
    dx_row, _ = aligned_row(dx_ptr, row_offset(row, inner, dx_stride_outer, dx_stride_inner), ALIGN)
    tl.store(dx_row + col_offset(cols, dx_stride_col, CONTIGUOUS), b_dx.to(dx_ptr.dtype.element_ty), mask=full)
    if TAIL_COLS > 0:
        t_dx = grad_from_dot(widen_opaque(t_y, OPAQUE_WIDEN), widen_opaque(t_dy, OPAQUE_WIDEN), dot, inv_temperature,
                             LOG)
        tl.store(dx_row + col_offset(t_cols, dx_stride_col, CONTIGUOUS), t_dx.to(dx_ptr.dtype.element_ty),
                 mask=t_full)
    if ALIGN > 1:  # the partial granules at the row's two ends, from y and dy again
        if lo % ALIGN != 0:
            write_grad_granule(y_row, dy_row, dx_row, y_stride_col, dy_stride_col, dx_stride_col, lo - lo % ALIGN, lo,
                               hi, dot, inv_temperature, CONTIGUOUS, LOG, ALIGN)
        if hi % ALIGN != 0:
            write_grad_granule(y_row, dy_row, dx_row, y_stride_col, dy_stride_col, dx_stride_col, hi - hi % ALIGN, lo,
                               hi, dot, inv_temperature, CONTIGUOUS, LOG, ALIGN)
