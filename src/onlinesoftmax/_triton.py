"""Shared ``@triton.jit`` helpers: the (m, d) operator, the online update, row addressing and the
streaming loops every softmax strategy is built from.

Conventions: ``m`` is a running maximum, ``d`` the sum of ``exp(x - m)`` over what has been seen.
The empty partial is ``(-inf, 0)``. All arithmetic is fp32 whatever the storage dtype.
Offsets are int64 so tensors over 2**31 elements address correctly.
"""

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# A module-level constant must be a tl.constexpr for compiled kernels to read it.
NEG_INF = tl.constexpr(float("-inf"))
# Kernels compiled while Triton's interpreter is on (read once, at import: the interpreter is chosen
# per process); True only where the interpreter lacks an operation the compiled code uses.
INTERPRETING = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def dependent_start(WAIT: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr):
    """A kernel's first step in a stream of programmatically dependent launches (_launch.dependent_launch).
    WAIT (it was launched dependent on the kernel before it): until that one has finished and its
    writes are visible. LAUNCH_DEPENDENTS: the kernel after this one, launched dependent, may be
    scheduled from now on (it waits for this one in turn)."""
    if WAIT:
        gdc_wait()
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()


@triton.jit
def mma(a, b, acc):
    """acc + a @ b on the tensor cores (fp32 accumulator). Triton 3.6's interpreter multiplies
    bfloat16 tiles in tl.dot as if they were integers (results off by 1e9); there the operands go
    through fp32, which holds every bf16 value and product exactly. Compiled kernels never take
    that branch."""
    if INTERPRETING and a.dtype == tl.bfloat16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def nan_max(a, b):
    # NaN must win the max, as in torch: logsumexp of a row holding NaN and +inf is NaN, not +inf.
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_keep_nan(x, axis):
    # tl.max skips NaN; torch's max keeps it (a NaN logit makes logsumexp NaN even beside +inf).
    has_nan = tl.max((x != x).to(tl.int32), axis)
    return tl.where(has_nan > 0, float("nan"), tl.max(x, axis))


@triton.jit
def merge_normalizers(m, d, axis):
    """Merge partials (m_i, d_i) along ``axis`` with the operator

        (m_a, d_a) (+) (m_b, d_b) = (M, d_a e^(m_a - M) + d_b e^(m_b - M)),  M = max(m_a, m_b),

    applied n ways at once: M = max_i m_i, d = sum_i d_i e^(m_i - M). Empty partials (-inf, 0)
    would give exp(-inf - -inf) = NaN when every partial is empty, so the reference point falls
    back to 0 when M is -inf (seed 002's safe_merge, without branches). Built from tl.max and
    tl.sum, whose reduction order is fixed: the result is bitwise reproducible.
    """
    m_row = max_keep_nan(m, axis)
    m_ref = tl.where(m_row == NEG_INF, 0.0, m_row)
    return m_row, tl.sum(d * tl.exp(m - tl.expand_dims(m_ref, axis)), axis)


@triton.jit
def online_update(m, d, x):
    """One step of the recurrence d_j = d_{j-1} e^(m_{j-1} - m_j) + e^(x_j - m_j), per lane.

    Only one exponential: whichever of (m, x) is larger is the reference, so the other side's
    factor is exp(-|x - m|). A new maximum contributes exp(x - x), which is 1 for finite x and NaN
    for x = +inf (torch gives NaN rows there); ``x - x`` adds exactly that.
    """
    e = tl.exp(-tl.abs(x - m))
    grows = x > m
    d = tl.where(grows, d * e + 1.0 + (x - x), d + tl.where(m == NEG_INF, 0.0, e))
    return nan_max(m, x), d


@triton.jit
def finish_lse(m, d):
    # m + log(d), with torch.logsumexp's conventions: all -inf -> -inf, +inf -> +inf, NaN -> NaN.
    return tl.where((m == NEG_INF) | (m == float("inf")), m, m + tl.log(d))


@triton.jit
def split_lse(m, d):
    """(lse, low): finish_lse(m, d) and its rounding error, (m + log d) - lse exactly (TwoSum), 0
    where m is not finite.

    A gradient exp(x - lse) from a float32 lse carries the lse's rounding, up to half its ulp
    (3e-5 relative at lse ~ 800); exp((x - lse) - low) is as exact as exp(x - m) / d.
    """
    log_d = tl.log(d)
    lse = m + log_d
    log_d_part = lse - m
    low = (m - (lse - log_d_part)) + (log_d - log_d_part)
    finite = (m != NEG_INF) & (m != float("inf")) & (m == m)
    return tl.where(finite, lse, m), tl.where(finite, low, 0.0)


@triton.jit
def row_offset(row, inner, stride_outer, stride_inner):
    """Element offset of row ``row`` in a (outer, cols, inner) view: row = outer_index * inner + inner_index."""
    row = row.to(tl.int64)
    return (row // inner) * stride_outer + (row % inner) * stride_inner


@triton.jit
def col_offset(cols, stride, CONTIGUOUS: tl.constexpr):
    # A literal unit stride lets Triton prove contiguity and issue 16-byte loads.
    offs = cols.to(tl.int64) * stride
    if CONTIGUOUS:
        offs = cols
    return offs


@triton.jit
def load_scaled(row_ptr, cols, stride, limit, inv_temperature, CONTIGUOUS: tl.constexpr):
    x = tl.load(row_ptr + col_offset(cols, stride, CONTIGUOUS), mask=cols < limit, other=NEG_INF)
    return x.to(tl.float32) * inv_temperature


@triton.jit
def store_row_partial(parts_ptr, n_parts, row, chunk, num_chunks, m, d):
    """Store chunk ``chunk``'s (m, d) of ``row`` in ``parts``: an m plane, then a d plane, of
    ``n_parts`` = rows x num_chunks entries each, a row's chunks side by side."""
    part = row.to(tl.int64) * num_chunks + chunk
    tl.store(parts_ptr + part, m)
    tl.store(parts_ptr + n_parts + part, d)


@triton.jit
def merge_row_partials(parts_ptr, n_parts, row, num_chunks, CHUNKS_POW2: tl.constexpr, VOLATILE: tl.constexpr):
    """(m, d) of ``row`` from its chunks' partials (laid out as store_row_partial writes them),
    merged in one fixed order. VOLATILE: partials stored by other programs of the same launch
    (read around the non-coherent L1, after wait_for_row)."""
    idx = tl.arange(0, CHUNKS_POW2)
    row_parts = row.to(tl.int64) * num_chunks + idx
    part_mask = idx < num_chunks
    return merge_normalizers(tl.load(parts_ptr + row_parts, mask=part_mask, other=NEG_INF, volatile=VOLATILE),
                             tl.load(parts_ptr + n_parts + row_parts, mask=part_mask, other=0.0, volatile=VOLATILE), 0)


@triton.jit
def merge_rank_pairs(pairs_ptr, n_rows, row, n_ranks, RANKS_POW2: tl.constexpr):
    """(m, d) of ``row`` from every rank's pair planes as an all_gather lays them out, (n_ranks,
    2, n_rows): a rank's m plane, then its d plane. Merged in rank order, as merge_row_partials
    merges chunks (the same values give the same bits)."""
    rank = tl.arange(0, RANKS_POW2)
    at = rank.to(tl.int64) * 2 * n_rows + row
    live = rank < n_ranks
    return merge_normalizers(tl.load(pairs_ptr + at, mask=live, other=NEG_INF),
                             tl.load(pairs_ptr + at + n_rows, mask=live, other=0.0), 0)


# Rows that do not start on a 16-byte boundary (a row of 50257 bf16 elements starts at a different
# alignment in every row) are read and written in whole 16-byte granules: Triton issues 16-byte
# accesses only where it can prove both the address and the mask uniform across each access, which
# an element mask like ``cols < n_cols`` with an odd n_cols never is (one 2-byte load an element:
# bf16 rows of 50257 ran at 0.11x of torch on the H100). The kernels address such a row from the
# granule boundary at or below its start (``aligned_row``), load every granule that holds one of
# its elements (``granule_masks``: the other elements of such a granule are the same 16 bytes of
# memory, inside the tensor's allocation, and are masked out after the load), store whole granules
# with a vector store and the partial granules at the two ends element by element. ALIGN is the
# number of elements in 16 bytes where this applies, 1 elsewhere (every mask is then per element,
# as before).


@triton.jit
def known_multiple(n, MULTIPLE: tl.constexpr):
    """``n`` (a scalar or a tensor of integers that the caller knows are multiples of MULTIPLE) in a
    form Triton's alignment analysis knows them of: rows of whole 16-byte granules whose length or
    stride is no multiple of 16 elements then get 16-byte accesses (see _row_granule in
    ops/softmax/launch.py). MULTIPLE 1 leaves ``n`` alone."""
    if MULTIPLE == 1:
        return n
    return (n // MULTIPLE) * MULTIPLE


@triton.jit
def strides_on_vectors(stride_0, stride_1, stride_2, stride_3, VEC: tl.constexpr):
    """known_multiple of four strides (the attention and decode kernels' batch, head and row strides
    and a merged-head stride, 0 where there is none) for a head dim whose rows the launcher found
    whole vectors of VEC elements (_launch.vector_width)."""
    return (known_multiple(stride_0, VEC), known_multiple(stride_1, VEC), known_multiple(stride_2, VEC),
            known_multiple(stride_3, VEC))


@triton.jit
def aligned_row(base_ptr, row_off, ALIGN: tl.constexpr):
    """(pointer, head): row ``row_off`` of a 16-byte-aligned tensor addressed from the granule
    boundary at or below its start; its columns sit at [head, head + n_cols) from that pointer."""
    if ALIGN == 1:
        return base_ptr + row_off, tl.full([], 0, tl.int32)
    head = row_off % ALIGN
    return base_ptr + tl.multiple_of(row_off - head, ALIGN), head.to(tl.int32)


@triton.jit
def granule_masks(cols, lo, hi, ALIGN: tl.constexpr):
    """(load, full, valid) over ``cols`` (consecutive, from a multiple of ALIGN) for the valid
    range [lo, hi): granules holding a valid element, granules entirely valid, valid elements."""
    if ALIGN == 1:
        # Every caller's tile starts at or after lo: one comparison a lane (registers are scarce
        # in the kernels that hold a chunk, so none is spent on what cannot fail).
        valid = cols < hi
        return valid, valid, valid
    granule = (cols // ALIGN) * ALIGN
    return (granule + ALIGN > lo) & (granule < hi), (granule >= lo) & (granule + ALIGN <= hi), (cols >= lo) & (cols < hi)


@triton.jit
def load_granules(row_ptr, cols, stride, lo, hi, other, CONTIGUOUS: tl.constexpr, ALIGN: tl.constexpr):
    """Row elements at ``cols`` within [lo, hi), ``other`` elsewhere, read in whole granules."""
    load, _, valid = granule_masks(cols, lo, hi, ALIGN)
    if INTERPRETING:
        # Triton 3.6's interpreter has no 16-bit scalar for tl.where; it has no vector loads either.
        return tl.load(row_ptr + col_offset(cols, stride, CONTIGUOUS), mask=valid, other=other)
    x = tl.load(row_ptr + col_offset(cols, stride, CONTIGUOUS), mask=load, other=other)
    if ALIGN > 1:
        x = tl.where(valid, x, other)
    return x


@triton.jit
def edge_granules(row_ptr, stride, lo, hi, other, CONTIGUOUS: tl.constexpr, ALIGN: tl.constexpr):
    """(values, mask): the elements of [lo, hi) in its partial granules, the first and the last
    (``other`` elsewhere), as one [2 * ALIGN] tile: exactly what a tile loaded under
    granule_masks' ``full`` leaves out. A range inside one granule is the first's alone."""
    first = lo - lo % ALIGN
    last = hi - hi % ALIGN
    lanes = tl.arange(0, 2 * ALIGN)
    in_last = lanes >= ALIGN
    cols = tl.where(in_last, last + lanes - ALIGN, first + lanes)
    taken = tl.where(in_last, (hi % ALIGN != 0) & ((last != first) | (lo % ALIGN == 0)), lo % ALIGN != 0)
    mask = taken & (cols >= lo) & (cols < hi)
    return tl.load(row_ptr + col_offset(cols, stride, CONTIGUOUS), mask=mask, other=other), mask


@triton.jit
def stream_online_normalizer(row_ptr, stride, start, stop, head, inv_temperature,
                             BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, ALIGN: tl.constexpr):
    """(m, d) of row[start:stop] in one pass: per-lane online updates, lanes merged at the end.
    ``row_ptr`` and ``head`` as ``aligned_row`` gives them; ``start`` a multiple of 16."""
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    d = tl.zeros([BLOCK], tl.float32)
    for block_start in range(start, stop + head, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        x = load_granules(row_ptr, cols, stride, start + head, stop + head, NEG_INF, CONTIGUOUS, ALIGN)
        m, d = online_update(m, d, x.to(tl.float32) * inv_temperature)
    return merge_normalizers(m, d, 0)


@triton.jit
def stream_max(row_ptr, stride, start, stop, head, inv_temperature,
               BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, ALIGN: tl.constexpr):
    """Safe softmax, pass 1: the maximum of row[start:stop]."""
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    for block_start in range(start, stop + head, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        x = load_granules(row_ptr, cols, stride, start + head, stop + head, NEG_INF, CONTIGUOUS, ALIGN)
        m = nan_max(m, x.to(tl.float32) * inv_temperature)
    return max_keep_nan(m, 0)


@triton.jit
def stream_sum_exp(row_ptr, stride, start, stop, head, m, inv_temperature,
                   BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, ALIGN: tl.constexpr):
    """Safe softmax, pass 2: sum of exp(x - m) over row[start:stop] for a known maximum m."""
    m_ref = tl.where(m == NEG_INF, 0.0, m)
    d = tl.zeros([BLOCK], tl.float32)
    for block_start in range(start, stop + head, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        x = load_granules(row_ptr, cols, stride, start + head, stop + head, NEG_INF, CONTIGUOUS, ALIGN)
        d += tl.exp(x.to(tl.float32) * inv_temperature - m_ref)
    # An all -inf row sums to 0 here; the write pass turns (-inf, 0) into NaN, as torch does.
    return tl.sum(d, 0)


@triton.jit
def normalized(x, m, d, LOG: tl.constexpr):
    # y = exp(x - m) / d, or (x - m) - log(d) for log-softmax, from the scaled logits x.
    if LOG:
        return (x - m) - tl.log(d)
    return tl.exp(x - m) * (1.0 / d)


@triton.jit
def write_normalized_granule(x_row, y_row, x_stride, y_stride, granule, lo, hi, m, d, inv_temperature,
                             CONTIGUOUS: tl.constexpr, LOG: tl.constexpr, ALIGN: tl.constexpr):
    """The valid elements of one partial granule, element by element (the edges of a row or chunk)."""
    cols = granule + tl.arange(0, ALIGN)
    mask = (cols >= lo) & (cols < hi)
    x = tl.load(x_row + col_offset(cols, x_stride, CONTIGUOUS), mask=mask, other=0.0).to(tl.float32) * inv_temperature
    tl.store(y_row + col_offset(cols, y_stride, CONTIGUOUS), normalized(x, m, d, LOG).to(y_row.dtype.element_ty),
             mask=mask)


@triton.jit
def stream_write_normalized(x_row, y_row, x_stride, y_stride, start, stop, head, m, d, inv_temperature,
                            BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr, ALIGN: tl.constexpr):
    """Last pass: y = exp(x - m) / d, or (x - m) - log(d) for log-softmax, over row[start:stop].
    ``x_row`` and ``y_row`` share ``head`` (the same row layout) when ALIGN > 1."""
    lo = start + head
    hi = stop + head
    for block_start in range(start, hi, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        load, full, _ = granule_masks(cols, lo, hi, ALIGN)
        x = tl.load(x_row + col_offset(cols, x_stride, CONTIGUOUS), mask=load, other=NEG_INF)
        y = normalized(x.to(tl.float32) * inv_temperature, m, d, LOG)
        tl.store(y_row + col_offset(cols, y_stride, CONTIGUOUS), y.to(y_row.dtype.element_ty), mask=full)
    if ALIGN > 1:
        if lo % ALIGN != 0:
            write_normalized_granule(x_row, y_row, x_stride, y_stride, lo - lo % ALIGN, lo, hi, m, d, inv_temperature,
                                     CONTIGUOUS, LOG, ALIGN)
        if hi % ALIGN != 0:
            write_normalized_granule(x_row, y_row, x_stride, y_stride, hi - hi % ALIGN, lo, hi, m, d, inv_temperature,
                                     CONTIGUOUS, LOG, ALIGN)


@triton.jit
def stream_grad_dot(y_row, dy_row, y_stride, dy_stride, start, stop, head,
                    BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr, ALIGN: tl.constexpr):
    """Backward reduction over row[start:stop]: sum(dy * y) for softmax, sum(dy) for log-softmax."""
    acc = tl.zeros([BLOCK], tl.float32)
    for block_start in range(start, stop + head, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        dy = load_granules(dy_row, cols, dy_stride, start + head, stop + head, 0.0, CONTIGUOUS, ALIGN)
        if LOG:
            acc += dy.to(tl.float32)
        else:
            y = load_granules(y_row, cols, y_stride, start + head, stop + head, 0.0, CONTIGUOUS, ALIGN)
            acc += dy.to(tl.float32) * y.to(tl.float32)
    return tl.sum(acc, 0)


@triton.jit
def widen_opaque(x, OPAQUE: tl.constexpr, COPY: tl.constexpr = 0):
    """``x`` as fp32 (the same values as ``x.to(tl.float32)``). With OPAQUE, a 16-bit ``x`` is
    converted by inline PTX, which the compiler cannot merge with an earlier conversion of the same
    value: a tile converted once before a wait and again after it stays in registers at 16 bits
    across the wait (half the registers). COPY 1 converts with other instructions than COPY 0, so
    that neither LLVM nor ptxas merges the two either: for a tile widened once before a wait and
    once after it in straight-line code. The interpreter runs no PTX: pass OPAQUE=False there."""
    # Two 16-bit values per 32-bit register in, two fp32 out (a bf16 is an fp32's top half).
    if OPAQUE and x.dtype == tl.bfloat16:
        if COPY == 0:
            asm: tl.constexpr = "shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000;"
        else:  # byte permutes: low half to the top with zeros below, high half kept with zeros below
            asm: tl.constexpr = "prmt.b32 $0, $2, 0, 0x1044; prmt.b32 $1, $2, 0, 0x3244;"
        return tl.inline_asm_elementwise(asm, "=r,=r,r", [x], dtype=tl.float32, is_pure=True, pack=2)
    elif OPAQUE and x.dtype == tl.float16:
        if COPY == 0:
            asm: tl.constexpr = "{ .reg .f16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }"
        else:  # halves taken by shifts rather than a register split
            asm: tl.constexpr = ("{ .reg .b32 t; .reg .b16 lo, hi; cvt.u16.u32 lo, $2; shr.b32 t, $2, 16; "
                                 "cvt.u16.u32 hi, t; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }")
        return tl.inline_asm_elementwise(asm, "=r,=r,r", [x], dtype=tl.float32, is_pure=True, pack=2)
    else:
        return x.to(tl.float32)


@triton.jit
def rounded_product(a, b, PTX: tl.constexpr):
    """``a * b`` in fp32, rounded before any add (with PTX: ``mul.rn``, which neither LLVM nor ptxas
    fuses into an add). For products summed across lanes: a lane holding one element of the
    reduced axis adds its partner's product to its own in the first butterfly step, and where its
    own is fused into that add (an FMA of the unrounded product) the two lanes end with sums a bit
    apart; the lanes then write their copies of the row's sum to one shared-memory slot for the
    next layout, and which copy the row gets is the hardware's pick (compute-sanitizer racecheck
    reports it; triton-lang/triton#7264). Rounded products add the same on every lane. The
    interpreter (PTX False) rounds every product anyway."""
    if PTX:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a.to(tl.float32), b.to(tl.float32)],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return a.to(tl.float32) * b.to(tl.float32)


@triton.jit
def grad_dot(y, dy, AXIS: tl.constexpr, LOG: tl.constexpr, ROUND: tl.constexpr = False):
    """The backward's reduction of a tile along AXIS, as grad_from_dot takes it: sum(dy * y) for
    softmax, sum(dy) for log-softmax (``y`` unread). ROUND: products rounded before the sum (see
    rounded_product; False multiplies in fp32 as the interpreter does)."""
    if LOG:
        dot = tl.sum(dy.to(tl.float32), AXIS)
    else:
        dot = tl.sum(rounded_product(dy, y, ROUND), AXIS)
    return dot


@triton.jit
def grad_from_dot(y, dy, dot, inv_temperature, LOG: tl.constexpr):
    # softmax: dx = y (dy - <dy, y>); log-softmax: dx = dy - exp(y) <dy, 1>; both times d(x/T)/dx.
    if LOG:
        dx = dy - tl.exp(y) * dot
    else:
        dx = y * (dy - dot)
    return dx * inv_temperature


@triton.jit
def write_grad_granule(y_row, dy_row, dx_row, y_stride, dy_stride, dx_stride, granule, lo, hi, dot, inv_temperature,
                       CONTIGUOUS: tl.constexpr, LOG: tl.constexpr, ALIGN: tl.constexpr):
    """dx of the valid elements of one partial granule, element by element."""
    cols = granule + tl.arange(0, ALIGN)
    mask = (cols >= lo) & (cols < hi)
    y = tl.load(y_row + col_offset(cols, y_stride, CONTIGUOUS), mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_row + col_offset(cols, dy_stride, CONTIGUOUS), mask=mask, other=0.0).to(tl.float32)
    dx = grad_from_dot(y, dy, dot, inv_temperature, LOG)
    tl.store(dx_row + col_offset(cols, dx_stride, CONTIGUOUS), dx.to(dx_row.dtype.element_ty), mask=mask)


@triton.jit
def stream_write_grad(y_row, dy_row, dx_row, y_stride, dy_stride, dx_stride, start, stop, head, dot, inv_temperature,
                      BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, LOG: tl.constexpr, ALIGN: tl.constexpr):
    """dx over row[start:stop]; y, dy and dx share ``head`` (the same row layout) when ALIGN > 1."""
    lo = start + head
    hi = stop + head
    for block_start in range(start, hi, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        load, full, _ = granule_masks(cols, lo, hi, ALIGN)
        y = tl.load(y_row + col_offset(cols, y_stride, CONTIGUOUS), mask=load, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + col_offset(cols, dy_stride, CONTIGUOUS), mask=load, other=0.0).to(tl.float32)
        dx = grad_from_dot(y, dy, dot, inv_temperature, LOG)
        tl.store(dx_row + col_offset(cols, dx_stride, CONTIGUOUS), dx.to(dx_row.dtype.element_ty), mask=full)
    if ALIGN > 1:
        if lo % ALIGN != 0:
            write_grad_granule(y_row, dy_row, dx_row, y_stride, dy_stride, dx_stride, lo - lo % ALIGN, lo, hi, dot,
                               inv_temperature, CONTIGUOUS, LOG, ALIGN)
        if hi % ALIGN != 0:
            write_grad_granule(y_row, dy_row, dx_row, y_stride, dy_stride, dx_stride, hi - hi % ALIGN, lo, hi, dot,
                               inv_temperature, CONTIGUOUS, LOG, ALIGN)


# Programs of one row that exchange partials through device memory (split_row_on_chip) meet at
# int32 counters in ``sync_ptr``, each on its own 128-byte line (COUNTER_STRIDE apart): counter 0
# hands out tickets, counter 1 + row counts the row's arrivals. On the H100, padding the row
# counters apart took bf16 256x151936 from 1754 to 1983 GB/s and 16x262144 from 1292 to 1522
# (scripts/tune/sweep_split_on_chip.py sync): polls of neighbouring rows no longer queue on one line. The
# counters are zero when a launch starts and every launch leaves them zero (the last ticket and
# each row's last arrival reset them), so one buffer serves a stream's launches one after another
# (see _buffers.row_exchange). No program waits on a counter after its job is done: resetting
# costs no extra round trip through L2.


COUNTER_STRIDE = tl.constexpr(32)


@triton.jit
def take_ticket(sync_ptr):
    # Work goes by arrival order, not by program id: a program only ever waits for programs that
    # started before it or for the rest of its own row, so the launch progresses whenever one
    # row's programs fit on the GPU at once, whatever order the hardware starts programs in.
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    if ticket == tl.num_programs(0) - 1:  # every other ticket is taken: ready for the next launch
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed")
    return ticket


@triton.jit
def claim_chunk(sync_ptr, num_chunks):
    """Take a ticket; return this program's row and chunk."""
    ticket = take_ticket(sync_ptr)
    return ticket // num_chunks, ticket % num_chunks


@triton.jit
def chunk_span(chunk, chunk_size, head, n_cols, BLOCK_COLS: tl.constexpr, ALIGN: tl.constexpr):
    """(cols, whole, lo, hi) of a chunk, counted from ``aligned_row``'s pointer: its valid range
    [lo, hi), and a tile of columns from the first 16-byte boundary at or after lo whose lanes
    ``cols < whole`` are the whole granules of the range (one comparison a lane, uniform over each
    granule: vector loads and stores). Chunks start on multiples of chunk_size (a multiple of 16),
    so only a row's first and last chunk have partial granules (see edge_granules)."""
    start = chunk * chunk_size
    if ALIGN == 1:  # (the same arithmetic, in 32 bits: registers are scarce in these kernels)
        hi = tl.minimum(start + chunk_size, n_cols)
        return start + tl.arange(0, BLOCK_COLS), hi, start, hi
    lo = tl.maximum(start, head)
    hi = tl.minimum(start + chunk_size, head + n_cols)
    first_whole = tl.multiple_of(lo + (ALIGN - lo % ALIGN) % ALIGN, ALIGN)
    whole = tl.multiple_of(hi - hi % ALIGN, ALIGN)
    return first_whole + tl.arange(0, BLOCK_COLS), whole, lo, hi


@triton.jit
def wait_for_row(sync_ptr, row, num_chunks):
    """Arrive at ``row``'s counter and wait until all ``num_chunks`` programs of the row have.

    The last to arrive zeroes the counter, which is what the others wait for (a counter that
    one's own arrival made nonzero can only return to zero that way). Stores made before the call
    (the partials) are visible to every program of the row after it: the barrier orders the
    program's stores before its releasing atomic, the acquiring atomics chain the row's arrivals
    to the reset, and the partials must then be read with ``volatile=True`` loads (not through
    the non-coherent L1)."""
    tl.debug_barrier()
    count_ptr = sync_ptr + COUNTER_STRIDE * (1 + row)
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel") + 1
    if arrived == num_chunks:
        tl.atomic_xchg(count_ptr, 0, sem="acq_rel")
    else:
        while arrived != 0:
            arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
    tl.debug_barrier()
