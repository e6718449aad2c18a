"""Flash attention (Dao et al., 2022, arXiv:2205.14135): the forward's Triton kernel and the tile
helpers it shares with the backward's (``backward_kernels.py``).

FlashAttention folds the online normalizer into attention: for each query row, one loop over the keys
carries the running maximum ``m``, the running sum ``l`` of ``exp(s - m)`` and the output
accumulator rescaled by ``exp(m_old - m_new)`` whenever the maximum grows, so the Sq x Sk score
matrix never reaches device memory. The kernels do this a tile at a time: a block of BLOCK_M
queries against blocks of BLOCK_N keys, the two products on the tensor cores, the statistics in
fp32, and ``exp2`` with ``log2(e)`` folded into the score scale (one multiply per score fewer).

Memory traffic of the forward, per (batch, head): Q read once, K and V read once per query block,
O and the log-sum-exp written once.

Causal masking: key ``j`` is visible to query ``i`` when ``j <= i + offset``, with ``offset = 0``
for ``"top_left"`` (SDPA's ``is_causal``) and ``offset = Sk - Sq`` for ``"bottom_right"`` (the
queries are the last Sq positions of the sequence, as when decoding). Each program's key loop is
split into the blocks every one of its rows sees completely (no mask arithmetic) and the few
blocks on the diagonal or past the last key (masked).

Loads go through Hopper's TMA (``tl.make_tensor_descriptor``) when the tensors' layout allows it
(unit stride along the head dim, 16-byte aligned strides and base, batch and head mergeable into
one dim); otherwise, and whenever the planner says so, through plain masked pointer loads. One
``USE_DESCRIPTOR`` constexpr switches between the two inside the same kernels. The forward can
also read whole key blocks through 2-D descriptors over the rows of every head
(``ROW_DESCRIPTORS``, where the heads lie one after another) and, at the head dims the planner
names, have Triton warp-specialize its key loop (``WARP_SPECIALIZE``: a producer warpgroup
loading, two consumer warpgroups computing; see the forward kernel for what that asks of it).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton import NEG_INF, known_multiple, mma, strides_on_vectors

LOG2E = 1.4426950408889634  # scores go to exp2 as scale * log2(e) * q.k
LN2 = tl.constexpr(0.6931471805599453)  # the kernels' lse leaves log2 units: lse = (m + log2 l) ln 2

# --------------------------------------------------------------------------------------------
# Shared tile helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def on_vectors(x, VEC: tl.constexpr):
    """``x``, a head dim or stride the launcher found a multiple of VEC elements (16 bytes), as the
    compiler can see it is one. Triton specializes integer arguments on divisibility by 16 alone:
    a head dim of 40 bf16 (80-byte rows) compiled to 2-byte loads and stores with a mask each, 255
    registers and spills, its forward 1.5x slower than the same tiles at head dim 48 (72 and 88
    causal: 3.6x; docs/perf-attention.md)."""
    return known_multiple(x, VEC)


@triton.jit
def qkv_on_vectors(head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks,
                   k_head_stride, stride_vb, stride_vh, stride_vs, v_head_stride, VEC: tl.constexpr):
    """on_vectors of the head dim and of Q's, K's and V's strides (strides_on_vectors), in that order."""
    stride_qb, stride_qh, stride_qs, q_head_stride = strides_on_vectors(stride_qb, stride_qh, stride_qs,
                                                                        q_head_stride, VEC)
    stride_kb, stride_kh, stride_ks, k_head_stride = strides_on_vectors(stride_kb, stride_kh, stride_ks,
                                                                        k_head_stride, VEC)
    stride_vb, stride_vh, stride_vs, v_head_stride = strides_on_vectors(stride_vb, stride_vh, stride_vs,
                                                                        v_head_stride, VEC)
    return (on_vectors(head_dim, VEC), stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh,
            stride_ks, k_head_stride, stride_vb, stride_vh, stride_vs, v_head_stride)


@triton.jit
def load_tile(desc, base_ptr, bh, start, n_rows, stride_row, stride_col, head_dim,
              BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    """Rows [start, start + BLOCK_ROWS) of one head as a [BLOCK_ROWS, BLOCK_D] tile, zero past the
    last row and past the head dim (the head dim is padded to a power of two)."""
    return load_part(desc, base_ptr, bh, start, n_rows, stride_row, stride_col, head_dim, 0,
                     BLOCK_ROWS, BLOCK_D, USE_DESCRIPTOR)


@triton.jit
def load_part(desc, base_ptr, bh, start, n_rows, stride_row, stride_col, head_dim, COL0: tl.constexpr,
              BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    """load_tile of head-dim columns [COL0, COL0 + BLOCK_D) (a head dim split in two parts: see the forward)."""
    if USE_DESCRIPTOR:
        # The descriptor's bounds are the head's own (rows, head_dim): TMA fills outside with zeros.
        tile = desc.load([bh, start, COL0]).reshape(BLOCK_ROWS, BLOCK_D)
    else:
        rows = start + tl.arange(0, BLOCK_ROWS)
        cols = COL0 + tl.arange(0, BLOCK_D)
        ptrs = base_ptr + rows.to(tl.int64)[:, None] * stride_row + cols[None, :] * stride_col
        tile = tl.load(ptrs, mask=(rows < n_rows)[:, None] & (cols < head_dim)[None, :], other=0.0)
    return tile


@triton.jit
def store_tile(desc, base_ptr, bh, start, n_rows, stride_row, head_dim, tile,
               BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    """Store a [BLOCK_ROWS, BLOCK_D] tile into rows [start, ...) of a head whose head dim is contiguous."""
    store_part(desc, base_ptr, bh, start, n_rows, stride_row, head_dim, tile, 0, BLOCK_ROWS, BLOCK_D, USE_DESCRIPTOR)


@triton.jit
def store_part(desc, base_ptr, bh, start, n_rows, stride_row, head_dim, tile, COL0: tl.constexpr,
               BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    """store_tile into head-dim columns [COL0, COL0 + BLOCK_D)."""
    if USE_DESCRIPTOR:
        desc.store([bh, start, COL0], tile.reshape(1, BLOCK_ROWS, BLOCK_D))
    else:
        rows = start + tl.arange(0, BLOCK_ROWS)
        cols = COL0 + tl.arange(0, BLOCK_D)
        ptrs = base_ptr + rows.to(tl.int64)[:, None] * stride_row + cols[None, :]
        tl.store(ptrs, tile, mask=(rows < n_rows)[:, None] & (cols < head_dim)[None, :])


@triton.jit
def head_descriptor(ptr, n_heads_total, n_rows, head_dim, stride_head, stride_row,
                    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    # (batch * heads, rows, head_dim) with unit stride along the head dim; a placeholder (the
    # pointer itself) when the pointer path runs, which never reads it.
    if USE_DESCRIPTOR:
        desc = tl.make_tensor_descriptor(ptr, shape=[n_heads_total, n_rows, head_dim],
                                         strides=[stride_head, stride_row, 1],
                                         block_shape=[1, BLOCK_ROWS, BLOCK_D])
    else:
        desc = ptr
    return desc


@triton.jit
def rows_descriptor(ptr, n_rows_total, head_dim, stride_row, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    # (batch * heads * rows, head_dim): every head's rows one after another, for tensors whose batch,
    # head and row dims merge (the launcher checks). A tile may run past its head's last row into
    # the next head's first: only where the kernel discards those rows (see the forward).
    return tl.make_tensor_descriptor(ptr, shape=[n_rows_total, head_dim], strides=[stride_row, 1],
                                     block_shape=[BLOCK_ROWS, BLOCK_D])


@triton.jit
def load_key_tile(desc, base_ptr, kv_bh, start, n_keys, stride_row, stride_col, head_dim, COL0: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr,
                  ROW_DESCRIPTORS: tl.constexpr):
    """Keys [start, start + BLOCK_N) of a K or V head, head-dim columns [COL0, COL0 + BLOCK_D); with
    ROW_DESCRIPTORS ``desc`` is a rows_descriptor() and the block must lie inside the head."""
    if ROW_DESCRIPTORS:
        tile = desc.load([kv_bh * n_keys + start, COL0])
    else:
        tile = load_part(desc, base_ptr, kv_bh, start, n_keys, stride_row, stride_col, head_dim, COL0,
                         BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    return tile


@triton.jit
def key_ranges(start_m, n_keys, causal_offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key loop bounds for the query block starting at ``start_m``: [0, full_stop) is seen whole by
    every row of the block, [full_stop, stop) needs the mask (diagonal, or past the last key)."""
    if CAUSAL:
        # Row start_m sees keys <= start_m + offset; the block's last row sees one block further.
        seen_by_all = tl.minimum(tl.maximum(start_m + causal_offset + 1, 0), n_keys)
        full_stop = (seen_by_all // BLOCK_N) * BLOCK_N
        stop = tl.maximum(tl.minimum(tl.maximum(start_m + BLOCK_M + causal_offset, 0), n_keys), full_stop)
    else:
        full_stop = (n_keys // BLOCK_N) * BLOCK_N
        stop = n_keys
    return full_stop, stop


@triton.jit
def visible(rows, cols, n_keys, causal_offset, CAUSAL: tl.constexpr, KEYS_FILL_BLOCKS: tl.constexpr):
    # [rows, cols] mask of the keys a query row attends to; KEYS_FILL_BLOCKS: no column reaches n_keys.
    if KEYS_FILL_BLOCKS:
        mask = cols[None, :] <= rows[:, None] + causal_offset
    else:
        mask = cols[None, :] < n_keys
        if CAUSAL:
            mask = mask & (cols[None, :] <= rows[:, None] + causal_offset)
    return mask


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------

@triton.jit
def finished_rows(m_i, l_i):
    """(1 / l, lse) of query rows from their maximum (log2 units) and sum; a row that saw no key
    (l = 0: bottom-right causal with Sq > Sk, or Sk = 0) gives 0 and lse -inf."""
    has_keys = l_i > 0.0
    return tl.where(has_keys, 1.0 / l_i, 0.0), tl.where(has_keys, (m_i + tl.math.log2(l_i)) * LN2, NEG_INF)


@triton.jit
def online_scores(qk, m_i, l_i, qk_scale, MASKED: tl.constexpr):
    """A block of raw scores [M, N] into the rows' running maximum m_i (log2 units) and sum l_i:
    (p, alpha, l, m) with p the block's exp2 weights and alpha the factor of what came before.
    scale > 0, so the scaled maximum is the maximum scaled, and the scaling and the subtraction
    fuse into one FMA per score."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if MASKED:
        # A row with no visible key so far keeps m = -inf; measuring from 0 keeps
        # exp2(-inf - -inf) = NaN out of p and alpha (both become 0).
        m_ref = tl.where(m_new == NEG_INF, 0.0, m_new)
    else:
        m_ref = m_new
    p = tl.math.exp2(qk * qk_scale - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    return p, alpha, l_i * alpha + tl.sum(p, 1), m_new


# Lengths, head counts and the causal offset are not specialized by value: Triton would otherwise
# compile a separate kernel for each of them equal to 1 (decoding, MQA, batch 1) and for each
# divisibility by 16, while the tiles are bounded by masks and TMA bounds either way.
COUNT_ARGS = ["n_heads_q", "group", "batch", "n_queries", "n_keys", "causal_offset"]


@triton.jit
def forward_key_blocks(acc, acc2, l_i, m_i, q, q2, desc_k, desc_v, desc_k2, desc_v2, k_base, v_base, kv_bh, rows,
                       start_n, stop_n, n_keys, head_dim, qk_scale, causal_offset,
                       stride_ks, stride_kd, stride_vs, stride_vd,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr, CAUSAL: tl.constexpr,
                       MASKED: tl.constexpr, USE_DESCRIPTOR: tl.constexpr, ROW_DESCRIPTORS: tl.constexpr,
                       WARP_SPECIALIZE: tl.constexpr):
    """The online loop over keys [start_n, stop_n), a block at a time; scores in log2 units. With
    BLOCK_D2 > 0 the head dim is two parts, [0, BLOCK_D) and [BLOCK_D, BLOCK_D + BLOCK_D2) (q2,
    acc2, the *2 descriptors); else those are placeholders, never read."""
    for block_start in tl.range(start_n, stop_n, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = load_key_tile(desc_k, k_base, kv_bh, block_start, n_keys, stride_ks, stride_kd, head_dim, 0,
                          BLOCK_N, BLOCK_D, USE_DESCRIPTOR, ROW_DESCRIPTORS)  # [N, D]
        qk = mma(q, tl.trans(k), None)  # [M, N]
        if BLOCK_D2 > 0:
            k2 = load_key_tile(desc_k2, k_base, kv_bh, block_start, n_keys, stride_ks, stride_kd, head_dim, BLOCK_D,
                               BLOCK_N, BLOCK_D2, USE_DESCRIPTOR, ROW_DESCRIPTORS)
            qk = mma(q2, tl.trans(k2), qk)
        if MASKED:
            cols = block_start + tl.arange(0, BLOCK_N)
            # Warp-specialized, every block comes here when causal, and its keys fill whole blocks.
            qk = tl.where(visible(rows, cols, n_keys, causal_offset, CAUSAL, WARP_SPECIALIZE), qk, NEG_INF)
        p, alpha, l_i, m_new = online_scores(qk, m_i, l_i, qk_scale, MASKED)
        v = load_key_tile(desc_v, v_base, kv_bh, block_start, n_keys, stride_vs, stride_vd, head_dim, 0,
                          BLOCK_N, BLOCK_D, USE_DESCRIPTOR, ROW_DESCRIPTORS)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None])
        if BLOCK_D2 > 0:
            v2 = load_key_tile(desc_v2, v_base, kv_bh, block_start, n_keys, stride_vs, stride_vd, head_dim, BLOCK_D,
                               BLOCK_N, BLOCK_D2, USE_DESCRIPTOR, ROW_DESCRIPTORS)
            acc2 = mma(p.to(v2.dtype), v2, acc2 * alpha[:, None])
        m_i = m_new
    return acc, acc2, l_i, m_i


@triton.jit
def qkv_descriptors(q_ptr, k_ptr, v_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
                    q_head_stride, k_head_stride, v_head_stride, stride_qs, stride_ks, stride_vs,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    USE_DESCRIPTOR: tl.constexpr):
    """Per-head descriptors of the caller's Q, K and V for tiles BLOCK_D wide along the head dim."""
    desc_q = head_descriptor(q_ptr, batch * n_heads_q, n_queries, head_dim, q_head_stride, stride_qs,
                             BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    desc_k = head_descriptor(k_ptr, batch * n_heads_kv, n_keys, head_dim, k_head_stride, stride_ks,
                             BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_v = head_descriptor(v_ptr, batch * n_heads_kv, n_keys, head_dim, v_head_stride, stride_vs,
                             BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    return desc_q, desc_k, desc_v


@triton.jit
def own_descriptor(ptr, n_heads_total, n_rows, head_dim, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                   USE_DESCRIPTOR: tl.constexpr):
    # A tensor the op allocated (O, dQ, dK, dV): contiguous (batch * heads, n_rows, head_dim).
    return head_descriptor(ptr, n_heads_total, n_rows, head_dim, n_rows * head_dim, head_dim,
                           BLOCK_ROWS, BLOCK_D, USE_DESCRIPTOR)


@triton.jit
def query_program(n_heads_q, group, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, HEAVY_FIRST: tl.constexpr = False):
    """(start_m, bh, b, h, h_kv, kv_bh) of a program of a (query blocks, batch * query heads) grid, or
    with HEAVY_FIRST of a (batch * query heads, query blocks) grid."""
    block_axis: tl.constexpr = 1 if HEAVY_FIRST else 0
    block_m = tl.program_id(block_axis)
    if CAUSAL:
        # The last query blocks have the most keys to visit: launch them first (within a head, or
        # with HEAVY_FIRST those of every head before any head's next block).
        block_m = tl.num_programs(block_axis) - 1 - block_m
    bh = tl.program_id(1 - block_axis)
    b = bh // n_heads_q
    h = bh % n_heads_q
    h_kv = h // group
    return block_m * BLOCK_M, bh, b, h, h_kv, b * (n_heads_q // group) + h_kv


@triton.jit
def key_value_bases(k_ptr, v_ptr, b, h_kv, stride_kb, stride_kh, stride_vb, stride_vh):
    """The first elements of a KV head's keys and values in the caller's tensors."""
    return (k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh,
            v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh)


@triton.jit(do_not_specialize=COUNT_ARGS)
def attention_forward_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    n_heads_q, group, batch, n_queries, n_keys, head_dim,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    q_head_stride, k_head_stride, v_head_stride,
    qk_scale, causal_offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, USE_DESCRIPTOR: tl.constexpr, ROW_DESCRIPTORS: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, BLOCK_D2: tl.constexpr = 0, VEC: tl.constexpr = 1,
):
    # BLOCK_D2 > 0: the head dim is computed as two power-of-two parts, BLOCK_D + BLOCK_D2 (80 as
    # 64 + 16, 96 as 64 + 32, 192 as 128 + 64) instead of padded to the next power of two, which
    # multiplies zeros: two products a key block for the scores and two accumulators.
    (head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
     stride_vb, stride_vh, stride_vs, v_head_stride) = qkv_on_vectors(
        head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
        stride_vb, stride_vh, stride_vs, v_head_stride, VEC)
    n_heads_kv = n_heads_q // group
    start_m, bh, b, h, h_kv, kv_bh = query_program(n_heads_q, group, BLOCK_M, CAUSAL)

    desc_q, desc_k, desc_v = qkv_descriptors(
        q_ptr, k_ptr, v_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
        q_head_stride, k_head_stride, v_head_stride, stride_qs, stride_ks, stride_vs,
        BLOCK_M, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_o = own_descriptor(o_ptr, batch * n_heads_q, n_queries, head_dim, BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    if BLOCK_D2 > 0:
        desc_q2, desc_k2, desc_v2 = qkv_descriptors(
            q_ptr, k_ptr, v_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
            q_head_stride, k_head_stride, v_head_stride, stride_qs, stride_ks, stride_vs,
            BLOCK_M, BLOCK_N, BLOCK_D2, USE_DESCRIPTOR)
        desc_o2 = own_descriptor(o_ptr, batch * n_heads_q, n_queries, head_dim, BLOCK_M, BLOCK_D2, USE_DESCRIPTOR)
    else:
        desc_q2 = desc_q
        desc_k2 = desc_k
        desc_v2 = desc_v
        desc_o2 = desc_o
    q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base, v_base = key_value_bases(k_ptr, v_ptr, b, h_kv, stride_kb, stride_kh, stride_vb, stride_vh)
    o_base = o_ptr + bh.to(tl.int64) * n_queries * head_dim

    rows = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if BLOCK_D2 > 0:
        acc2 = tl.zeros([BLOCK_M, BLOCK_D2], tl.float32)
    else:
        acc2 = acc  # a placeholder the loop never updates
    full_stop, stop = key_ranges(start_m, n_keys, causal_offset, BLOCK_M, BLOCK_N, CAUSAL)
    if ROW_DESCRIPTORS:
        desc_k_rows = rows_descriptor(k_ptr, batch * n_heads_kv * n_keys, head_dim, stride_ks, BLOCK_N, BLOCK_D)
        desc_v_rows = rows_descriptor(v_ptr, batch * n_heads_kv * n_keys, head_dim, stride_vs, BLOCK_N, BLOCK_D)
        if BLOCK_D2 > 0:
            desc_k_rows2 = rows_descriptor(k_ptr, batch * n_heads_kv * n_keys, head_dim, stride_ks, BLOCK_N, BLOCK_D2)
            desc_v_rows2 = rows_descriptor(v_ptr, batch * n_heads_kv * n_keys, head_dim, stride_vs, BLOCK_N, BLOCK_D2)
        else:
            desc_k_rows2 = desc_k_rows
            desc_v_rows2 = desc_v_rows
    else:
        desc_k_rows = desc_k
        desc_v_rows = desc_v
        desc_k_rows2 = desc_k2
        desc_v_rows2 = desc_v2
    if WARP_SPECIALIZE:
        # Triton 3.6 warp-specializes this loop on Hopper (a producer warpgroup issuing the TMA
        # loads, the query block split between two consumer warpgroups). Its pass compiles only a
        # kernel whose one loop loads through 2-D descriptors and whose other tiles do not go
        # through 3-D ones, so: Q by rows too (the last block's rows past the head, read from the
        # next head or as TMA's zeros, are computed and never stored), the output by pointers, and
        # every key block in one loop, all masked when causal. The launcher asks for n_keys to be
        # a multiple of BLOCK_N, so no key block reads past its head. (The head dim is one part.)
        q = rows_descriptor(q_ptr, batch * n_heads_q * n_queries, head_dim, stride_qs, BLOCK_M, BLOCK_D).load(
            [bh * n_queries + start_m, 0])  # [M, D]
        acc, acc2, l_i, m_i = forward_key_blocks(acc, acc2, l_i, m_i, q, q, desc_k_rows, desc_v_rows, desc_k_rows,
                                                 desc_v_rows, k_base, v_base, kv_bh, rows,
                                                 0, stop, n_keys, head_dim, qk_scale, causal_offset,
                                                 stride_ks, stride_kd, stride_vs, stride_vd,
                                                 BLOCK_N, BLOCK_D, 0, CAUSAL, CAUSAL, USE_DESCRIPTOR, True, True)
    else:
        q = load_tile(desc_q, q_base, bh, start_m, n_queries, stride_qs, stride_qd, head_dim,
                      BLOCK_M, BLOCK_D, USE_DESCRIPTOR)  # [M, D]
        if BLOCK_D2 > 0:
            q2 = load_part(desc_q2, q_base, bh, start_m, n_queries, stride_qs, stride_qd, head_dim, BLOCK_D,
                           BLOCK_M, BLOCK_D2, USE_DESCRIPTOR)
        else:
            q2 = q
        acc, acc2, l_i, m_i = forward_key_blocks(acc, acc2, l_i, m_i, q, q2, desc_k_rows, desc_v_rows, desc_k_rows2,
                                                 desc_v_rows2, k_base, v_base, kv_bh, rows,
                                                 0, full_stop, n_keys, head_dim, qk_scale, causal_offset,
                                                 stride_ks, stride_kd, stride_vs, stride_vd,
                                                 BLOCK_N, BLOCK_D, BLOCK_D2, CAUSAL, False, USE_DESCRIPTOR,
                                                 ROW_DESCRIPTORS, False)
        # The blocks on the diagonal or past the last key: rows of other heads must not enter here.
        acc, acc2, l_i, m_i = forward_key_blocks(acc, acc2, l_i, m_i, q, q2, desc_k, desc_v, desc_k2, desc_v2,
                                                 k_base, v_base, kv_bh, rows,
                                                 full_stop, stop, n_keys, head_dim, qk_scale, causal_offset,
                                                 stride_ks, stride_kd, stride_vs, stride_vd,
                                                 BLOCK_N, BLOCK_D, BLOCK_D2, CAUSAL, True, USE_DESCRIPTOR, False,
                                                 False)
    inv_l, lse = finished_rows(m_i, l_i)
    tl.store(lse_ptr + bh.to(tl.int64) * n_queries + rows, lse, mask=rows < n_queries)
    out = (acc * inv_l[:, None]).to(o_ptr.dtype.element_ty)
    store_tile(desc_o, o_base, bh, start_m, n_queries, head_dim, head_dim, out, BLOCK_M, BLOCK_D,
               USE_DESCRIPTOR and not WARP_SPECIALIZE)
    if BLOCK_D2 > 0:
        out2 = (acc2 * inv_l[:, None]).to(o_ptr.dtype.element_ty)
        store_part(desc_o2, o_base, bh, start_m, n_queries, head_dim, head_dim, out2, BLOCK_D, BLOCK_M, BLOCK_D2,
                   USE_DESCRIPTOR)


@triton.jit(do_not_specialize=COUNT_ARGS)
def attention_forward_kv_stationary_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    n_heads_q, group, batch, n_queries, n_keys, head_dim,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    qk_scale, causal_offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
    STAGES: tl.constexpr, KEY_HALVES: tl.constexpr,
):
    # Short sequences of grouped-query attention: one program a KV head holds all its keys and
    # values (one block of BLOCK_N >= n_keys) and loops over its group's query heads and their
    # query blocks, where the forward above gives each query block a program that reads K and V
    # again. Each tile is the whole softmax of its rows at once (no running rescale); Triton
    # pipelines the next tile's query loads (STAGES). Pointer loads, any strides. Where KV heads
    # are too few to fill the SMs, the grid's second axis splits a KV head's tiles over that many
    # programs, each reading K and V once (tile i to program i mod the split). KEY_HALVES (causal):
    # the keys as two halves, and a tile whose rows all end before the second skips it, merging
    # it online otherwise: the first query block of a 128-key call then does half the products.
    kv_bh = tl.program_id(0)
    n_heads_kv = n_heads_q // group
    b = kv_bh // n_heads_kv
    h_kv = kv_bh % n_heads_kv
    PART: tl.constexpr = BLOCK_N // 2 if KEY_HALVES else BLOCK_N
    tl.static_assert(PART >= 16, "key halves of fewer than 16 keys: narrower than tl.dot takes")
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    k_base, v_base = key_value_bases(k_ptr, v_ptr, b, h_kv, stride_kb, stride_kh, stride_vb, stride_vh)
    keys = tl.arange(0, PART)
    k = load_part(None, k_base, 0, 0, n_keys, stride_ks, stride_kd, head_dim, 0, PART, BLOCK_D, False)
    v = load_part(None, v_base, 0, 0, n_keys, stride_vs, stride_vd, head_dim, 0, PART, BLOCK_D, False)
    if KEY_HALVES:
        keys2 = PART + keys
        k2 = load_part(None, k_base, 0, PART, n_keys, stride_ks, stride_kd, head_dim, 0, PART, BLOCK_D, False)
        v2 = load_part(None, v_base, 0, PART, n_keys, stride_vs, stride_vd, head_dim, 0, PART, BLOCK_D, False)
    q_blocks = tl.cdiv(n_queries, BLOCK_M)
    for tile in tl.range(tl.program_id(1), group * q_blocks, tl.num_programs(1), num_stages=STAGES):
        h = h_kv * group + tile // q_blocks
        rows = (tile % q_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_queries
        q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        q = load_part(None, q_base, 0, (tile % q_blocks) * BLOCK_M, n_queries, stride_qs, stride_qd, head_dim, 0,
                      BLOCK_M, BLOCK_D, False)
        qk = mma(q, tl.trans(k), None)  # [M, N]
        qk = tl.where(visible(rows, keys, n_keys, causal_offset, CAUSAL, False), qk, NEG_INF)
        # The first block's whole softmax, written out: online_scores from m = -inf and l = 0 took
        # 4-6 more registers (sm_90) and at D256 a 56-byte spill instead of 32.
        m = tl.max(qk, 1) * qk_scale
        # A row that sees no key (bottom-right causal with more queries than keys) keeps m = -inf:
        # measuring from 0 keeps exp2(-inf - -inf) = NaN out of p; it gives 0 and lse -inf.
        m_ref = tl.where(m == NEG_INF, 0.0, m)
        p = tl.math.exp2(qk * qk_scale - m_ref[:, None])
        l_i = tl.sum(p, 1)
        acc = mma(p.to(v.dtype), v, None)
        if KEY_HALVES:
            last_row = tl.minimum((tile % q_blocks + 1) * BLOCK_M, n_queries) - 1
            if (last_row + causal_offset >= PART) & (n_keys > PART):
                qk2 = mma(q, tl.trans(k2), None)
                qk2 = tl.where(visible(rows, keys2, n_keys, causal_offset, CAUSAL, False), qk2, NEG_INF)
                p2, alpha, l_i, m = online_scores(qk2, m, l_i, qk_scale, True)
                acc = mma(p2.to(v2.dtype), v2, acc * alpha[:, None])
        inv_l, lse = finished_rows(m, l_i)
        bh = b.to(tl.int64) * n_heads_q + h
        out = (acc * inv_l[:, None]).to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + (bh * n_queries + rows[:, None]) * head_dim + dims[None, :], out,
                 mask=row_ok[:, None] & dim_ok[None, :])
        tl.store(lse_ptr + bh * n_queries + rows, lse, mask=row_ok)
