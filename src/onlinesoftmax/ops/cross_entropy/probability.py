"""cross_entropy of probability targets (soft targets, distillation): Triton kernels.

Per row, with y = softcap(x) / T, q = (1 - eps) p + eps / C the targets mixed with the uniform
distribution, w the class weights (1 without), A = sum_c w_c q_c and the online normalizer (m, d)
of y (lse = m + log d)::

    loss = -sum_c w_c q_c (y_c - lse) + z lse^2 = A log d - B + z lse^2,   B = sum_c w_c q_c (y_c - m)
    dL/dy_c = g ((A + 2 z lse) p_c - w_c q_c),   p_c = exp((y_c - m) - log d)
    dL/dp_c = -g (1 - eps) w_c (y_c - lse)

The forward reads the logits and the targets once (B is kept relative to the running max and moved
with it: B += A (m_old - m_new)), writing five floats a row (the loss, m, log d, A, lse); where rows
are too few to fill the GPU they are cut into chunks, whose (m, d, A, B) a small kernel merges.
"mean" and "sum" are summed in a fixed order by a launch of one program, into the loss's dtype
(torch's mean and cast were two launches). The backward reads both again and writes the
gradients that autograd asks for (the logits', the targets'). torch's own path materializes the
log-probabilities and their product with the targets (four tensors of the logits' shape). -inf
logits give what torch's -inf log-probabilities give (0 * -inf is NaN).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ... import _buffers
from ..._device import cdiv, interpreter_active, next_power_of_2, plan_cache, remember, sm_count
from ..._triton import dependent_start
from ..._launch import Launcher, aligned, dependent_launch, op_when_compiling
from .kernels import edge_columns, row_tile, softcap_slope, transform
from . import plan as planner

# Columns a program takes a step, by the logits' element size; rows of up to 1024 columns share
# tiles of 1024 elements on 2 warps, longer rows step along on 8 (short rows, bf16 under CUDA
# graphs: 16384 x 129 0.0347 -> 0.0158 ms, 4007 x 369 0.0141 -> 0.0095 against tiles of 2048 on 8
# warps; docs/notes/2026-11/probe_probability_tiles-h200.log).
PROBABILITY_BLOCK = {4: 2048, 2: 4096}
PROBABILITY_TILE_ELEMENTS = 1024
PROBABILITY_WARPS = {True: 8, False: 2}  # by whether a step holds more than PROBABILITY_TILE_ELEMENTS
PROBABILITY_PROGRAMS_PER_SM = 4  # fewer rows' programs than this cut rows into chunks
# Rows on 16-byte vectors: a row held alone by a program (its tile at least
# PROBABILITY_TILE_ELEMENTS) whose start or length Triton cannot prove 16-byte aligned loads 2 or 4
# bytes at a time from tiles at its first column. Tiles on the vectors the row's offsets give
# (kernels.row_tile, as the class-index kernels'), its partial first and last vectors element-wise
# (the edges), load 16 (under CUDA graphs, bf16 8192 x 50257's forward 0.699 -> 0.487 ms and its
# backward 0.81 -> 0.61, 8192 x 1000's forward 0.0178 -> 0.0142). Not taken: by a forward whose
# rows have edges and fewer than FORWARD_EDGE_TILES tiles (three reductions more a row: bf16
# 1952 x 1151 0.0111 -> 0.0167 ms, fp32 2048 x 3001 0.0205 -> 0.0214), nor by rows of a multiple
# of 16 elements (the plain loop's loads are 16 bytes there; vectors cost the bench's bf16 8192 x
# 128256 forward 3-7%). (docs/perf-h200.md, "Probability targets: kernels of their own")
FORWARD_EDGE_TILES = {2: 2, 4: 4}  # by the logits' element size
STATS = 5  # floats a row: loss, ref (m, or 0 for an all -inf row), log d, A, lse


@triton.jit
def row_loss_stats(out_ptr, rows, live, n_rows, m, d, a, b, z_loss, Z: tl.constexpr):
    """Stores a row's (loss, ref, log d, A, lse) from its (m, d, A, B) (B relative to ref: m, or 0
    for an all -inf row) as five planes of n_rows floats."""
    ref = tl.where(m == float("-inf"), 0.0, m)
    log_d = tl.log(tl.where(live, d, 1.0))
    lse = ref + log_d
    loss = a * log_d - b
    if Z:
        loss += z_loss * lse * lse
    out = out_ptr + rows
    tl.store(out, loss, mask=live)
    tl.store(out + n_rows, ref, mask=live)
    tl.store(out + 2 * n_rows, log_d, mask=live)
    tl.store(out + 3 * n_rows, a, mask=live)
    tl.store(out + 4 * n_rows, lse, mask=live)


@triton.jit
def probability_reduce_kernel(stats_ptr, loss_ptr, n_rows, MEAN: tl.constexpr, BLOCK: tl.constexpr,
                              WAIT: tl.constexpr):
    # One program: loss_ptr <- the rows' losses (the stats' first plane) summed in row order (bitwise
    # reproducible), over the rows for "mean". (The last program of the rows' launch to arrive at a
    # counter summing them instead made the forward slower under CUDA graphs at 29 of 30 measured
    # (shape, setting) pairs, by up to 3.7 us: docs/notes/2026-11/probe_probability_reduce-h200.log.)
    # WAIT: launched programmatically dependent, it waits for the kernel before it.
    dependent_start(WAIT, False)
    total = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        total += tl.load(stats_ptr + rows, mask=rows < n_rows, other=0.0)
    loss = tl.sum(total, 0)
    if MEAN:
        loss = loss / n_rows
    tl.store(loss_ptr, loss.to(loss_ptr.dtype.element_ty))


@triton.jit
def absorb_tile(m, d, a, b, x, p, w_ptr, cols, mask, softcap, inv_temperature, keep, spread,
                HAS_WEIGHT: tl.constexpr, SOFTCAP: tl.constexpr):
    """(m, d, A, B) of ROWS rows after a (ROWS, n) tile of their logits ``x`` and targets ``p`` in
    columns ``cols`` ((1, n) or (ROWS, n)); lanes outside ``mask`` count for nothing. The class
    weights load in the tile's shape, once a row: one load a column broadcast over the rows
    measured slower (bf16 225 x 108 with weights: 3.4 -> 5.3 us a forward under CUDA graphs)."""
    y = tl.where(mask, transform(x, softcap, inv_temperature, SOFTCAP), float("-inf"))
    q = p.to(tl.float32) * keep + spread
    if HAS_WEIGHT:
        q = q * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    q = tl.where(mask, q, 0.0)
    m_new = tl.maximum(m, tl.max(y, 1))
    # The reference point: 0 while every logit so far is -inf (exp(-inf - -inf) would be NaN).
    ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    # (While m is -inf, b holds -inf or NaN already if any entry was read.)
    b += a * tl.where(m == float("-inf"), 0.0, m - ref)
    d = d * tl.exp(m - ref) + tl.sum(tl.exp(y - ref[:, None]), 1)
    b += tl.sum(tl.where(mask, q * (y - ref[:, None]), 0.0), 1)
    a += tl.sum(q, 1)
    return m_new, d, a, b


@triton.jit
def vector_tiles(n_cols, chunk_tiles, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    """The row's tiles on 16-byte vectors (row_tile's k) that this program takes: [first, stop).
    cdiv(n_cols, BLOCK) tiles hold a row's whole vectors whatever its head (BLOCK a multiple of the
    vector: the last whole one ends by the multiple of BLOCK at or after n_cols); the partial ones
    are the edges'."""
    first = 0
    stop = tl.cdiv(n_cols, BLOCK)
    if SPLIT:
        first = tl.program_id(1) * chunk_tiles
        stop = tl.minimum(first + chunk_tiles, stop)
    return first, stop


@triton.jit
def probability_forward_kernel(
    x_ptr, t_ptr, w_ptr, out_ptr, n_rows, n_cols, x_stride, t_stride, chunk_tiles,
    softcap, inv_temperature, keep, spread, z_loss,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr, EDGES: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, Z: tl.constexpr, SPLIT: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr,
):
    # Programs over (ROWS rows, a chunk of chunk_tiles tiles of BLOCK columns). Whole rows (one
    # chunk) store the rows' stats; SPLIT stores each chunk's (m, d, A, B) in four planes of
    # (chunks, n_rows) for probability_merge_kernel. LAUNCH_DEPENDENTS: the (small) kernel after
    # this one, launched programmatically dependent, may be scheduled from the start.
    dependent_start(False, LAUNCH_DEPENDENTS)
    # ALIGN > 1: one row a program, logits and targets contiguous rows (stride n_cols), tiles on
    # ALIGN-element vectors (row_tile: 16-byte loads where rows start or end off them, as GPT-2's
    # 50257; EDGES: the partial first and last vectors, element-wise, by the first chunk).
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < n_rows
    m = tl.full([ROWS], float("-inf"), tl.float32)
    d = tl.zeros([ROWS], tl.float32)
    a = tl.zeros([ROWS], tl.float32)
    b = tl.zeros([ROWS], tl.float32)
    if ALIGN > 1:
        base = tl.program_id(0).to(tl.int64) * n_cols
        first, stop = vector_tiles(n_cols, chunk_tiles, BLOCK, SPLIT)
        for k in range(first, stop):
            # (Offsets made 2-d before the loads: the tile loads in the layout absorb_tile reduces in.)
            start, offs, cols, full = row_tile(base, k, n_cols, 1, BLOCK, ALIGN, True, EDGES)
            at, cols, full = (start + offs)[None, :], cols[None, :], full[None, :]
            m, d, a, b = absorb_tile(m, d, a, b, tl.load(x_ptr + at, mask=full, other=0.0),
                                     tl.load(t_ptr + at, mask=full, other=0.0), w_ptr, cols, full, softcap,
                                     inv_temperature, keep, spread, HAS_WEIGHT, SOFTCAP)
        if EDGES:
            cols, mask = edge_columns(base, n_cols, ALIGN)
            at, cols, mask = base + cols[None, :], cols[None, :], (mask & (tl.program_id(1) == 0))[None, :]
            m, d, a, b = absorb_tile(m, d, a, b, tl.load(x_ptr + at, mask=mask, other=0.0),
                                     tl.load(t_ptr + at, mask=mask, other=0.0), w_ptr, cols, mask, softcap,
                                     inv_temperature, keep, spread, HAS_WEIGHT, SOFTCAP)
    else:
        x_row = x_ptr + rows.to(tl.int64)[:, None] * x_stride
        t_row = t_ptr + rows.to(tl.int64)[:, None] * t_stride
        first = 0
        stop = n_cols
        if SPLIT:  # (whole rows keep a loop from 0 to n_cols: odd rows ran 8-24% slower through the chunk's bounds)
            first = tl.program_id(1) * chunk_tiles * BLOCK
            stop = tl.minimum(first + chunk_tiles * BLOCK, n_cols)
        for start in range(first, stop, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = live[:, None] & (cols < stop)
            x = tl.load(x_row + cols, mask=mask, other=0.0)
            p = tl.load(t_row + cols, mask=mask, other=0.0)
            m, d, a, b = absorb_tile(m, d, a, b, x, p, w_ptr, cols, mask, softcap, inv_temperature, keep, spread,
                                     HAS_WEIGHT, SOFTCAP)
    if SPLIT:
        plane = tl.num_programs(1) * n_rows
        out = out_ptr + tl.program_id(1) * n_rows + rows
        tl.store(out, m, mask=live)
        tl.store(out + plane, d, mask=live)
        tl.store(out + 2 * plane, a, mask=live)
        tl.store(out + 3 * plane, b, mask=live)
    else:
        row_loss_stats(out_ptr, rows, live, n_rows, m, d, a, b, z_loss, Z)


@triton.jit
def probability_merge_kernel(partial_ptr, out_ptr, n_rows, n_chunks, z_loss, ROWS: tl.constexpr, Z: tl.constexpr,
                             WAIT: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr):
    # The chunks' (m, d, A, B) of ROWS rows merged in chunk order into the rows' stats: B moves to
    # the row's reference point as the forward moves it along a row. WAIT, LAUNCH_DEPENDENTS: as
    # the reduction's and the forward's.
    dependent_start(WAIT, LAUNCH_DEPENDENTS)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < n_rows
    plane = n_chunks * n_rows
    m = tl.full([ROWS], float("-inf"), tl.float32)
    for chunk in range(n_chunks):
        m = tl.maximum(m, tl.load(partial_ptr + chunk * n_rows + rows, mask=live, other=float("-inf")))
    ref = tl.where(m == float("-inf"), 0.0, m)
    d = tl.zeros([ROWS], tl.float32)
    a = tl.zeros([ROWS], tl.float32)
    b = tl.zeros([ROWS], tl.float32)
    for chunk in range(n_chunks):
        at = partial_ptr + chunk * n_rows + rows
        m_k = tl.load(at, mask=live, other=float("-inf"))
        a_k = tl.load(at + 2 * plane, mask=live, other=0.0)
        d += tl.load(at + plane, mask=live, other=0.0) * tl.exp(m_k - ref)
        b += tl.load(at + 3 * plane, mask=live, other=0.0) + a_k * (tl.where(m_k == float("-inf"), 0.0, m_k) - ref)
        a += a_k
    row_loss_stats(out_ptr, rows, live, n_rows, m, d, a, b, z_loss, Z)


@triton.jit
def tile_gradients(x, p_ptr, w_ptr, cols, mask, g, coefficient, ref, log_d, softcap, inv_temperature, keep, spread,
                   HAS_WEIGHT: tl.constexpr, SOFTCAP: tl.constexpr, LOGIT_GRAD: tl.constexpr,
                   TARGET_GRAD: tl.constexpr):
    """(the logits' gradient, the targets') of a (ROWS, n) tile of logits ``x`` (targets at
    ``p_ptr``, read for the logits' gradient alone) in columns ``cols``; the row terms (ROWS, 1)."""
    y = transform(x.to(tl.float32), softcap, inv_temperature, SOFTCAP)
    shifted = (y - ref) - log_d  # y - lse, from its two parts
    w = 1.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dx = shifted  # (a placeholder where the gradient is not asked for, as dt's)
    if LOGIT_GRAD:
        p = tl.load(p_ptr, mask=mask, other=0.0).to(tl.float32)
        dx = g * (coefficient * tl.exp(shifted) - w * (p * keep + spread))
        if SOFTCAP:
            dx = dx * softcap_slope(y, 1.0 / (inv_temperature * softcap))
        dx = dx * inv_temperature
    dt = shifted
    if TARGET_GRAD:
        dt = -g * keep * w * shifted
    return dx, dt


@triton.jit
def store_gradients(dx_ptr, dt_ptr, at, dx, dt, mask, LOGIT_GRAD: tl.constexpr, TARGET_GRAD: tl.constexpr):
    """The gradients asked for of one tile (tile_gradients'), at offsets ``at`` of both outputs."""
    if LOGIT_GRAD:
        tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if TARGET_GRAD:
        tl.store(dt_ptr + at, dt.to(dt_ptr.dtype.element_ty), mask=mask)


@triton.jit
def probability_backward_kernel(
    x_ptr, t_ptr, w_ptr, stats_ptr, grad_ptr, dx_ptr, dt_ptr, n_rows, n_cols, x_stride, t_stride, grad_stride,
    chunk_tiles, softcap, inv_temperature, keep, spread, z_loss, grad_scale,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr, EDGES: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, Z: tl.constexpr, LOGIT_GRAD: tl.constexpr, TARGET_GRAD: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # Programs over (ROWS rows, a chunk of tiles), as the forward's (ALIGN: its vectors and edges);
    # the gradients contiguous. LOGIT_GRAD, TARGET_GRAD: which gradients to write.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < n_rows
    ref = tl.load(stats_ptr + n_rows + rows, mask=live, other=0.0)[:, None]
    log_d = tl.load(stats_ptr + 2 * n_rows + rows, mask=live, other=0.0)[:, None]
    coefficient = tl.load(stats_ptr + 3 * n_rows + rows, mask=live, other=0.0)[:, None]
    if Z:
        coefficient += 2.0 * z_loss * (ref + log_d)
    g = tl.load(grad_ptr + rows.to(tl.int64) * grad_stride, mask=live, other=0.0).to(tl.float32)[:, None] * grad_scale
    if ALIGN > 1:
        base = tl.program_id(0).to(tl.int64) * n_cols
        first, stop = vector_tiles(n_cols, chunk_tiles, BLOCK, SPLIT)
        for k in range(first, stop):
            start, offs, cols, full = row_tile(base, k, n_cols, 1, BLOCK, ALIGN, True, EDGES)
            at = (start + offs)[None, :]
            dx, dt = tile_gradients(tl.load(x_ptr + at, mask=full[None, :], other=0.0), t_ptr + at, w_ptr,
                                    cols[None, :], full[None, :], g, coefficient, ref, log_d, softcap,
                                    inv_temperature, keep, spread, HAS_WEIGHT, SOFTCAP, LOGIT_GRAD, TARGET_GRAD)
            store_gradients(dx_ptr, dt_ptr, at, dx, dt, full[None, :], LOGIT_GRAD, TARGET_GRAD)
        if EDGES:
            cols, mask = edge_columns(base, n_cols, ALIGN)
            mask = (mask & (tl.program_id(1) == 0))[None, :]
            at = base + cols[None, :]
            dx, dt = tile_gradients(tl.load(x_ptr + at, mask=mask, other=0.0), t_ptr + at, w_ptr, cols[None, :], mask,
                                    g, coefficient, ref, log_d, softcap, inv_temperature, keep, spread, HAS_WEIGHT,
                                    SOFTCAP, LOGIT_GRAD, TARGET_GRAD)
            store_gradients(dx_ptr, dt_ptr, at, dx, dt, mask, LOGIT_GRAD, TARGET_GRAD)
    else:
        r64 = rows.to(tl.int64)[:, None]
        first = 0
        stop = n_cols
        if SPLIT:  # (as the forward's)
            first = tl.program_id(1) * chunk_tiles * BLOCK
            stop = tl.minimum(first + chunk_tiles * BLOCK, n_cols)
        for start in range(first, stop, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = live[:, None] & (cols < stop)
            dx, dt = tile_gradients(tl.load(x_ptr + r64 * x_stride + cols, mask=mask, other=0.0),
                                    t_ptr + r64 * t_stride + cols, w_ptr, cols, mask, g, coefficient, ref, log_d,
                                    softcap, inv_temperature, keep, spread, HAS_WEIGHT, SOFTCAP, LOGIT_GRAD,
                                    TARGET_GRAD)
            store_gradients(dx_ptr, dt_ptr, r64 * n_cols + cols, dx, dt, mask, LOGIT_GRAD, TARGET_GRAD)


_FORWARD = Launcher(probability_forward_kernel)
_MERGE = Launcher(probability_merge_kernel)
_REDUCE = Launcher(probability_reduce_kernel)
_BACKWARD = Launcher(probability_backward_kernel)
MERGE_ROWS = 128  # rows a merge program takes


class Layout(NamedTuple):
    """How a (rows, C) call is cut into programs."""

    rows: int  # rows a program holds
    block: int  # columns a tile
    num_warps: int
    chunks: int  # programs along a row (1: whole rows)
    chunk_tiles: int  # tiles a chunk
    align: int  # elements of a 16-byte vector tiles start on (1: tiles from each row's first column)
    edges: bool  # rows start or end inside a vector: their partial first and last ones element-wise


def layout(n_rows: int, n_cols: int, element_size: int, sms: int, contiguous: bool, forward: bool) -> Layout:
    """Tiles of PROBABILITY_TILE_ELEMENTS (ROWS short rows, or steps of PROBABILITY_BLOCK along a long
    one); where the rows' programs are fewer than PROBABILITY_PROGRAMS_PER_SM an SM, rows cut into
    that many chunks (a chunk at least a tile). Rows a program holds alone, of logits and targets
    that are ``contiguous`` (rows of stride C), may take tiles on 16-byte vectors, by the rules above
    FORWARD_EDGE_TILES (``forward``: the forward's, else the backward's)."""
    block = min(next_power_of_2(max(n_cols, 1)), PROBABILITY_BLOCK[min(element_size, 4)])
    rows = max(1, min(PROBABILITY_TILE_ELEMENTS // block, next_power_of_2(max(n_rows, 1))))
    steps = cdiv(max(n_cols, 1), block)
    align, edges = 1, False
    if contiguous and block >= PROBABILITY_TILE_ELEMENTS:  # (one row a program)
        vector = 16 // element_size
        edges = n_cols % vector != 0
        if edges:
            vectors = not forward or steps >= FORWARD_EDGE_TILES[element_size]
        else:
            vectors = n_cols % 16 != 0
        align, edges = (vector, edges) if vectors else (1, False)
    if interpreter_active():  # the interpreter runs programs in turn: small tiles, every path
        block, rows = min(block, 64), 1 if align > 1 else min(rows, 4)
        steps = cdiv(max(n_cols, 1), block)
    chunks = max(1, min(steps, cdiv(PROBABILITY_PROGRAMS_PER_SM * sms, cdiv(max(n_rows, 1), rows))))
    chunk_tiles = cdiv(steps, chunks)
    return Layout(rows, block, PROBABILITY_WARPS[block > PROBABILITY_TILE_ELEMENTS], cdiv(steps, chunk_tiles),
                  chunk_tiles, align, edges)


def _contiguous_rows(x: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether the (rows, C) logits and targets are rows of stride C (the gradients' layout)."""
    n_rows, n_cols = x.shape
    return n_rows <= 1 or x.stride(0) == target.stride(0) == n_cols


def _scalars(label_smoothing, z_loss, softcap, temperature, n_cols) -> tuple:
    """(softcap, inverse temperature, keep, spread, z_loss) as the kernels take them."""
    return softcap or 1.0, 1.0 / temperature, 1.0 - label_smoothing, label_smoothing / n_cols, z_loss


class ForwardCall:
    """The forward of one signature (shapes, strides, dtypes, options, alignment), prepared once:
    ``call(x, target, weight)`` -> ((STATS, rows) float32 stats (see the module's docstring), the
    loss reduced over the rows in ``loss_dtype``, or an empty tensor for "none")."""

    def __init__(self, x, target, weight, label_smoothing, z_loss, softcap, temperature, reduction, loss_dtype):
        n_rows, n_cols = x.shape
        self.shape, self.device = (STATS, n_rows), x.device
        self.layout = cut = layout(n_rows, n_cols, x.element_size(), sm_count(x.device), _contiguous_rows(x, target),
                                   forward=True)
        self.chosen = planner.Plan("probabilities", "probability_rows", n_rows, n_cols, x.dtype, block=cut.block,
                                   num_warps=cut.num_warps, num_chunks=cut.chunks, align=cut.align, edges=cut.edges)
        flags = dict(HAS_WEIGHT=weight is not None, SOFTCAP=softcap > 0, Z=z_loss > 0)
        self.reduction, self.loss_dtype = reduction, loss_dtype
        key = (n_rows, n_cols, x.stride(0), target.stride(0), x.dtype, target.dtype,
               None if weight is None else weight.dtype, aligned(x), aligned(target), cut, *flags.values())
        self.scalars = _scalars(label_smoothing, z_loss, softcap, temperature, n_cols)
        # The merge and the reduction launched programmatically dependent where the device allows.
        waits = dependent_launch(x.device)
        dependent = waits["WAIT"]
        reduced = reduction != "none"
        self.forward = _FORWARD.bind((cdiv(n_rows, cut.rows), cut.chunks), (*key, dependent), ROWS=cut.rows,
                                     BLOCK=cut.block, ALIGN=cut.align, EDGES=cut.edges, num_warps=cut.num_warps,
                                     SPLIT=cut.chunks > 1, LAUNCH_DEPENDENTS=dependent and (cut.chunks > 1 or reduced),
                                     **flags)
        self.merge = None
        if cut.chunks > 1:
            self.merge = _MERGE.bind((cdiv(n_rows, MERGE_ROWS),), (n_rows, cut.chunks, flags["Z"], dependent, reduced),
                                     ROWS=MERGE_ROWS, Z=flags["Z"], LAUNCH_DEPENDENTS=dependent and reduced,
                                     num_warps=4, **waits)
        # "none" returns this empty tensor in place of the reduced loss (no allocation a call).
        self.no_loss = None if reduced else x.new_empty(0)
        reduce_block = 16 if interpreter_active() else planner.REDUCE_BLOCK  # (the interpreter: several steps)
        self.reduce = None if not reduced else _REDUCE.bind(
            (1,), (n_rows, loss_dtype, reduction, dependent), MEAN=reduction == "mean", BLOCK=reduce_block,
            num_warps=planner.REDUCE_WARPS, **waits)
        self.args = (n_rows, n_cols, x.stride(0), target.stride(0), cut.chunk_tiles, *self.scalars)

    def __call__(self, x, target, weight):
        planner.record(self.chosen)
        stats = _buffers.empty(self.shape, torch.float32, self.device)
        n_rows = self.shape[1]
        if self.reduce is None:
            loss = self.no_loss
        else:
            loss = _buffers.empty((), self.loss_dtype, self.device)
            if n_rows == 0:  # torch's reductions of no rows: a NaN mean, a zero sum
                return stats, loss.fill_(float("nan") if self.reduction == "mean" else 0.0)
        if n_rows == 0:
            return stats, loss
        w = x if weight is None else weight
        if self.merge is None:
            self.forward(x, target, w, stats, *self.args)
        else:
            chunks = self.layout.chunks
            partials = _buffers.empty((4, chunks, n_rows), torch.float32, self.device)
            self.forward(x, target, w, partials, *self.args)
            self.merge(partials, stats, n_rows, chunks, self.scalars[4])
        if self.reduce is not None:
            self.reduce(stats, loss, n_rows)
        return stats, loss


class BackwardCall:
    """The backward of one signature: ``call(x, target, weight, stats, grad)`` -> (the logits'
    gradient or an empty tensor, the targets' or an empty tensor), from the forward's stats and the
    rows' upstream gradient (any stride, 0 for one value broadcast) times ``grad_scale``."""

    def __init__(self, x, target, weight, grad, grad_scale, label_smoothing, z_loss, softcap, temperature,
                 logit_grad, target_grad):
        n_rows, n_cols = x.shape
        cut = layout(n_rows, n_cols, x.element_size(), sm_count(x.device), _contiguous_rows(x, target),
                     forward=False)
        flags = dict(HAS_WEIGHT=weight is not None, SOFTCAP=softcap > 0, Z=z_loss > 0, LOGIT_GRAD=logit_grad,
                     TARGET_GRAD=target_grad)
        key = (n_rows, n_cols, x.stride(0), target.stride(0), grad.stride(0), x.dtype, target.dtype, grad.dtype,
               None if weight is None else weight.dtype, aligned(x), aligned(target), aligned(grad), cut,
               *flags.values())
        self.logit_grad, self.target_grad, self.rows = logit_grad, target_grad, n_rows
        self.backward = _BACKWARD.bind((cdiv(n_rows, cut.rows), cut.chunks), key, ROWS=cut.rows, BLOCK=cut.block,
                                       ALIGN=cut.align, EDGES=cut.edges, num_warps=cut.num_warps,
                                       SPLIT=cut.chunks > 1, **flags)
        self.args = (n_rows, n_cols, x.stride(0), target.stride(0), grad.stride(0), cut.chunk_tiles,
                     *_scalars(label_smoothing, z_loss, softcap, temperature, n_cols), grad_scale)

    def __call__(self, x, target, weight, stats, grad):
        dx = _buffers.empty(x.shape, x.dtype, x.device) if self.logit_grad else x.new_empty(0)
        dt = _buffers.empty(target.shape, target.dtype, target.device) if self.target_grad else x.new_empty(0)
        if self.rows:
            self.backward(x, target, x if weight is None else weight, stats, grad, dx if self.logit_grad else x,
                          dt if self.target_grad else x, *self.args)
        return dx, dt


# Prepared calls by signature (plan_cache clears them with the plans).
_FORWARD_CALLS: dict = {}
_BACKWARD_CALLS: dict = {}
plan_cache(_FORWARD_CALLS.clear)
plan_cache(_BACKWARD_CALLS.clear)


def launch_probability_forward(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                               label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                               reduction: str, loss_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """((STATS, rows) float32 stats, the reduced loss or an empty tensor) of (rows, C) logits and
    targets with unit column stride: each row's loss, m, log d, A and lse (see the module's docstring)."""
    key = (x.shape, x.stride(0), target.stride(0), x.dtype, target.dtype, None if weight is None else weight.dtype,
           x.device, aligned(x), aligned(target), label_smoothing, z_loss, softcap, temperature, reduction, loss_dtype)
    call = _FORWARD_CALLS.get(key)
    if call is None:
        call = remember(_FORWARD_CALLS, key, ForwardCall(x, target, weight, label_smoothing, z_loss, softcap,
                                                         temperature, reduction, loss_dtype))
    return call(x, target, weight)


def launch_probability_backward(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, stats: torch.Tensor,
                                grad: torch.Tensor, grad_scale: float, label_smoothing: float, z_loss: float,
                                softcap: float, temperature: float, logit_grad: bool,
                                target_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the logits' gradient, the targets' gradient), each an empty tensor where not asked for; see BackwardCall."""
    key = (x.shape, x.stride(0), target.stride(0), x.dtype, target.dtype, None if weight is None else weight.dtype,
           x.device, aligned(x), aligned(target), grad.stride(0), grad.dtype, aligned(grad), grad_scale,
           label_smoothing, z_loss, softcap, temperature, logit_grad, target_grad)
    call = _BACKWARD_CALLS.get(key)
    if call is None:
        call = remember(_BACKWARD_CALLS, key, BackwardCall(x, target, weight, grad, grad_scale, label_smoothing, z_loss,
                                                           softcap, temperature, logit_grad, target_grad))
    return call(x, target, weight, stats, grad)


# --------------------------------------------------------------------------------------------
# Custom ops (torch.compile) and autograd
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("onlinesoftmax::probability_cross_entropy_forward", mutates_args=())
def _forward_op(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, label_smoothing: float,
                z_loss: float, softcap: float, temperature: float, reduction: str,
                loss_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_probability_forward(x, target, weight, label_smoothing, z_loss, softcap, temperature, reduction,
                                      loss_dtype)


@_forward_op.register_fake
def _(x, target, weight, label_smoothing, z_loss, softcap, temperature, reduction, loss_dtype):
    return (x.new_empty((STATS, x.shape[0]), dtype=torch.float32),
            x.new_empty((0,) if reduction == "none" else (), dtype=loss_dtype))


@torch.library.custom_op("onlinesoftmax::probability_cross_entropy_backward", mutates_args=())
def _backward_op(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, stats: torch.Tensor,
                 grad: torch.Tensor, grad_scale: float, label_smoothing: float, z_loss: float, softcap: float,
                 temperature: float, logit_grad: bool, target_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_probability_backward(x, target, weight, stats, grad, grad_scale, label_smoothing, z_loss, softcap,
                                       temperature, logit_grad, target_grad)


@_backward_op.register_fake
def _(x, target, weight, stats, grad, grad_scale, label_smoothing, z_loss, softcap, temperature, logit_grad,
      target_grad):
    return (x.new_empty(x.shape) if logit_grad else x.new_empty(0),
            target.new_empty(target.shape) if target_grad else x.new_empty(0))


forward = op_when_compiling(_forward_op, launch_probability_forward)
backward = op_when_compiling(_backward_op, launch_probability_backward)


class ProbabilityCrossEntropy(torch.autograd.Function):
    """(the loss: the rows' float32 losses for "none", else reduced in ``loss_dtype``; the rows'
    float32 lse) of (rows, C) logits and probability targets, unit column stride; options
    (label_smoothing, z_loss, softcap (0: none), temperature)."""

    @staticmethod
    def forward(ctx, x, target, weight, options, reduction, loss_dtype):
        stats, loss = forward(x, target, weight, *options, reduction, loss_dtype)
        ctx.save_for_backward(x, target, weight, stats)
        ctx.options, ctx.reduction = options, reduction
        ctx.mark_non_differentiable(stats[4])
        return stats[0] if reduction == "none" else loss, stats[4]

    @staticmethod
    def backward(ctx, grad, _grad_lse):
        x, target, weight, stats = ctx.saved_tensors
        n_rows = x.shape[0]
        scale = 1.0
        if ctx.reduction != "none":  # one upstream value for every row (stride 0)
            grad, scale = grad.expand(n_rows), 1.0 / n_rows if ctx.reduction == "mean" and n_rows else 1.0
        dx, dt = backward(x, target, weight, stats, grad, scale, *ctx.options, ctx.needs_input_grad[0],
                          ctx.needs_input_grad[1])
        return (dx if ctx.needs_input_grad[0] else None, dt if ctx.needs_input_grad[1] else None,
                None, None, None, None)
