"""cross_entropy: two_pass's kernel for plain rows (no class weights, label smoothing, softcap or
z-loss), one program a row reading it twice, the gradient written over the logits. The loss and
gradient terms are kernels.py's; see its docstring."""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton import NEG_INF, known_multiple, split_lse
from .kernels import (
    gradient,
    gradient_destination,
    gradient_scales,
    gradient_terms,
    load_row_target,
    merge_pair,
    row_loss,
    target_column,
    tile_normalizer,
)


@triton.jit
def cross_entropy_two_pass_plain_kernel(
    x_ptr, target_ptr, weight_ptr, denom_ptr, loss_ptr, lse_ptr, lse_low_ptr, parts_ptr, sync_ptr, out_ptr, dx_ptr,
    n_cols, x_stride, target_stride, ignore_index, inv_temperature,
    BLOCK: tl.constexpr, TAIL: tl.constexpr, ALIGN: tl.constexpr, EDGES: tl.constexpr, MEAN: tl.constexpr,
    FIRST_EVICTION: tl.constexpr, SECOND_EVICTION: tl.constexpr, OUT_OF_PLACE: tl.constexpr = False,
):
    # two_pass (one program a row: its (m, d), then the gradient over it from a second read) for
    # plain rows: no class weights, label smoothing, softcap or z-loss; contiguous rows. At 64 KB
    # tiles (32 elements a thread at 32 warps) a thread has 64 registers, and the general kernel's
    # per-element terms, tile masks and 64-bit columns spilled (8192 x 128256 bf16: 1.98 ms at its
    # own 32 KB tiles, where this kernel runs 1.75; docs/perf-cross_entropy.md). Even one more row
    # scalar in the second loop spills here (ptxas for sm_90: a 48-byte stack, one of four loads in
    # flight instead of three): without z-loss the probability's factor and the target's term are
    # the same number, ``a``, into which the temperature and a bad target's NaN are folded.
    # The tiles cover the row's whole runs of ALIGN elements (16 bytes or more, from absolute
    # multiples of it): ``n_whole`` columns from the row's column ``first``, both known multiples of
    # ALIGN, so that the one mask is constant over each vector and every access is 16 bytes wide.
    # Without EDGES the rows are whole vectors, each starting one (first 0, n_whole n_cols); with
    # EDGES the row's partial first and last runs go element by element (plain_edge_stats, then
    # plain_edge_gradient), addressed from x_row so that no 64-bit row offset stays live across the
    # loops. Each pass takes the row's whole tiles unmasked, then its last part in masked tiles of
    # TAIL (plan.PLAIN_TAIL_MAX_SHARE). The loops write a p_c alone: the target's -a goes over its
    # element after them. Compared with each lane's column inside the loop, the target took 4-5
    # registers a thread in 64-bit arithmetic (SASS for sm_90): 80 registers with edges, spills at a
    # cap of 48, one load in flight fewer (docs/perf-h200.md, "The target's term after the kernel's
    # loops"). OUT_OF_PLACE: the gradient goes to dx_ptr (x's strides), g_row its row as x_row is x's.
    # weight_ptr, parts_ptr, sync_ptr and out_ptr are not used: the tensors are the general kernel's.
    g_ptr = gradient_destination(x_ptr, dx_ptr, OUT_OF_PLACE)
    row = tl.program_id(0)
    target, valid, bad = load_row_target(target_ptr, row, target_stride, ignore_index, n_cols)
    in_row = valid & ~bad
    m = tl.full((), NEG_INF, tl.float32)
    d = tl.zeros((), tl.float32)
    if EDGES:
        base = row.to(tl.int64) * x_stride
        first = ((ALIGN - base % ALIGN) % ALIGN).to(tl.int32)  # the row's elements before its first whole run
        x_row = x_ptr + known_multiple(base + first, ALIGN)
        g_row = g_ptr + known_multiple(base + first, ALIGN)
        n_whole = known_multiple(tl.maximum(n_cols - first, 0), ALIGN)
    else:
        # Rows and their length in whole vectors, as Triton's alignment analysis can see (see row_tile).
        first = 0
        x_row = x_ptr + row.to(tl.int64) * known_multiple(x_stride, ALIGN)
        g_row = g_ptr + row.to(tl.int64) * known_multiple(x_stride, ALIGN)
        n_whole = known_multiple(n_cols, ALIGN)
    # The target's column from x_row (negative in the row's partial first run; -1 - first: none).
    target_whole = target_column(target, n_cols) - first
    lanes = tl.arange(0, BLOCK)
    tail_lanes = tl.arange(0, TAIL)
    n_tiles = tl.cdiv(n_whole, BLOCK)
    read_tiles = tl.where(valid, n_tiles, 0)  # an ignored row is not read
    # Tiles counted, not stepped over, so that each tile's start is a known multiple of its width.
    n_full = tl.where(valid, n_whole // BLOCK, 0)
    tail_from = n_full * BLOCK
    n_tail = tl.where(valid, tl.cdiv(n_whole - tail_from, TAIL), 0)
    if TAIL < BLOCK:
        for k in range(0, n_full):
            m, d = plain_tile_stats(x_row, k * BLOCK + lanes, n_whole, m, d, inv_temperature, False, FIRST_EVICTION)
        for k in range(0, n_tail):
            m, d = plain_tile_stats(x_row, tail_from + k * TAIL + tail_lanes, n_whole, m, d, inv_temperature, True,
                                    FIRST_EVICTION)
    else:  # every tile masked, in one loop (a second over whole tiles: 32 -> 54 registers at bf16 8192 x 65536)
        for k in range(0, read_tiles):
            m, d = plain_tile_stats(x_row, k * BLOCK + lanes, n_whole, m, d, inv_temperature, True, FIRST_EVICTION)
    if EDGES:
        edge_m, edge_d = plain_edge_stats(x_row, first, n_whole, n_cols, valid, inv_temperature, ALIGN)
        m, d = merge_pair(m, d, edge_m, edge_d)
    x_t = tl.load(x_row + target_whole, mask=in_row, other=0.0).to(tl.float32)
    y_t = x_t * inv_temperature
    tl.debug_barrier()  # the target's logit is read before any warp overwrites it (see the on_chip kernel)
    lse = m + tl.log(d)  # +inf or NaN in the row: NaN, as torch's cross_entropy
    lse_low = split_lse(m, d)[1]
    loss = row_loss(lse, lse_low, y_t, 0.0, 1.0, n_cols * 1.0, valid, bad, 0.0, 0.0, n_cols, False, False)
    tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
    tl.store(lse_ptr + row, lse)
    tl.store(lse_low_ptr + row, lse_low)
    scale = gradient_scales(denom_ptr, 1.0, MEAN)[0]
    if EDGES:  # before the tiles' loop, whose stores do not touch these elements
        plain_edge_gradient(x_row, g_row, first, n_whole, n_cols, scale, lse, lse_low, valid, bad,
                            inv_temperature, ALIGN)
    a = tl.where(bad, float("nan"), scale) * inv_temperature
    if TAIL < BLOCK:
        for k in range(0, n_full):
            plain_tile_gradient(x_row, g_row, k * BLOCK + lanes, n_whole, a, lse, lse_low, inv_temperature,
                                False, SECOND_EVICTION)
        for k in range(0, n_tail):
            plain_tile_gradient(x_row, g_row, tail_from + k * TAIL + tail_lanes, n_whole, a, lse, lse_low,
                                inv_temperature, True, SECOND_EVICTION)
    else:
        for k in range(0, read_tiles):
            plain_tile_gradient(x_row, g_row, k * BLOCK + lanes, n_whole, a, lse, lse_low, inv_temperature,
                                True, SECOND_EVICTION)
    for k in range(0, n_tiles - read_tiles):  # an ignored row's gradient: 0
        cols = k * BLOCK + lanes
        tl.store(g_row + cols, tl.zeros((BLOCK,), g_ptr.dtype.element_ty), mask=cols < n_whole)
    # The target's -a last, over what the loops wrote there, after every warp's stores (see above).
    tl.debug_barrier()
    g_t = a * tl.exp((x_t * inv_temperature - lse) - lse_low) - a
    tl.store(g_row + target_whole, g_t.to(g_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def plain_tile_stats(x_row, cols, n_live, m, d, inv_temperature, MASKED: tl.constexpr, EVICTION: tl.constexpr):
    """The plain kernel's (m, d) over one tile of columns ``cols`` (those from ``n_live`` masked)."""
    if MASKED:
        y = tl.load(x_row + cols, mask=cols < n_live, other=NEG_INF, eviction_policy=EVICTION)
    else:
        y = tl.load(x_row + cols, eviction_policy=EVICTION)
    y = y.to(tl.float32) * inv_temperature
    # One exponential an element against the running maximum (a NaN makes d, and the row, NaN).
    m_new = tl.maximum(m, tl.max(y, 0))
    ref = tl.where(m_new == NEG_INF, 0.0, m_new)
    return m_new, d * tl.exp(m - ref) + tl.sum(tl.exp(y - ref), 0)


@triton.jit
def plain_tile_gradient(x_row, g_row, cols, n_live, a, lse, lse_low, inv_temperature, MASKED: tl.constexpr,
                        EVICTION: tl.constexpr):
    """The plain kernel's gradient over one tile of columns ``cols``, written to g_row's (x_row's in place)."""
    if MASKED:
        live = cols < n_live
        y = tl.load(x_row + cols, mask=live, other=0.0, eviction_policy=EVICTION)
    else:
        y = tl.load(x_row + cols, eviction_policy=EVICTION)
    g = a * tl.exp((y.to(tl.float32) * inv_temperature - lse) - lse_low)  # the target's -a: after the loops
    if MASKED:
        tl.store(g_row + cols, g.to(g_row.dtype.element_ty), mask=live, eviction_policy=EVICTION)
    else:
        tl.store(g_row + cols, g.to(g_row.dtype.element_ty), eviction_policy=EVICTION)


@triton.jit
def plain_edge_columns(first, n_whole, n_cols, ALIGN: tl.constexpr):
    """The row's partial first and last runs as columns from x_row (the first whole run's): the head's
    ``first`` columns before it, the columns past its ``n_whole`` after; one tile of 2 ALIGN lanes
    and its mask, element by element. A row shorter than its head is all head."""
    lanes = tl.arange(0, 2 * ALIGN)
    is_head = lanes < ALIGN
    cols = tl.where(is_head, lanes - first, n_whole + lanes - ALIGN)
    return cols, tl.where(is_head, lanes < first, cols >= 0) & (cols + first < n_cols)


@triton.jit
def plain_edge_stats(x_row, first, n_whole, n_cols, valid, inv_temperature, ALIGN: tl.constexpr):
    """(m, d) of the row's partial runs (an ignored row's: (-inf, 0), unread)."""
    cols, mask = plain_edge_columns(first, n_whole, n_cols, ALIGN)
    mask = mask & valid
    y = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) * inv_temperature
    return tile_normalizer(tl.where(mask, y, NEG_INF))


@triton.jit
def plain_edge_gradient(x_row, g_row, first, n_whole, n_cols, scale, lse, lse_low, valid, bad,
                        inv_temperature, ALIGN: tl.constexpr):
    """The gradient of the row's partial runs, written to g_row's (no loop stores there; the target's store may)."""
    cols, mask = plain_edge_columns(first, n_whole, n_cols, ALIGN)
    a, b, e, lse_g, lse_low_g = gradient_terms(scale, scale, 0.0, lse, lse_low, valid, bad, inv_temperature)
    x = tl.load(x_row + cols, mask=mask & valid, other=0.0)
    # The target's -a is the kernel's to write, after its loops: no column here is the target (and no
    # class weights: x_row stands for their pointer).
    g = gradient(x.to(tl.float32) * inv_temperature, cols, -1 - first, lse_g, lse_low_g, a, b, e, x_row, mask,
                 1.0, False, False, False)
    tl.store(g_row + cols, g.to(g_row.dtype.element_ty), mask=mask)
