"""Flash attention (seed 004): Triton kernels, launchers, custom ops, autograd, public function.

Seed 004 folds the online normalizer into attention: for each query row, one loop over the keys
carries the running maximum ``m``, the running sum ``l`` of ``exp(s - m)`` and the output
accumulator rescaled by ``exp(m_old - m_new)`` whenever the maximum grows, so the Sq x Sk score
matrix never reaches device memory. The kernels do this a tile at a time: a block of BLOCK_M
queries against blocks of BLOCK_N keys, the two products on the tensor cores, the statistics in
fp32, and ``exp2`` with ``log2(e)`` folded into the score scale (one multiply per score fewer).

Memory traffic of the forward, per (batch, head): Q read once, K and V read once per query block,
O and the log-sum-exp written once. The backward recomputes the probabilities from the saved
log-sum-exp instead of storing them (``P = exp(scale * Q K^T - lse)``) and runs two kernels with
no atomics, so results are bitwise reproducible:

* ``attention_backward_dkdv_kernel``: one program per key block and KV head; it loops over the
  query heads of its group and over the query blocks that see its keys, accumulating dK and dV in
  registers (the GQA sum over the group happens there, in a fixed order).
* ``attention_backward_dq_kernel``: one program per query block and query head, looping over keys.

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

import math
import os
from typing import Optional, Union

import torch
import triton
import triton.language as tl

from . import _buffers, cpu, plan as planner
from ._launch import Launcher, aligned, op_when_compiling
from ._triton import NEG_INF

LOG2E = 1.4426950408889634  # scores go to exp2 as scale * log2(e) * q.k
LN2 = tl.constexpr(0.6931471805599453)  # the kernels' lse leaves log2 units: lse = (m + log2 l) ln 2
# Triton 3.6's interpreter multiplies bfloat16 tiles in tl.dot as if they were integers (results
# off by 1e9); there the operands go through fp32, which holds every bf16 value and product exactly.
# Compiled kernels never take that branch (the constexpr is False outside the interpreter).
INTERPRETER_DOT_IN_FP32 = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

# --------------------------------------------------------------------------------------------
# Shared tile helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def mma(a, b, acc):
    """acc + a @ b on the tensor cores (fp32 accumulator)."""
    if INTERPRETER_DOT_IN_FP32 and a.dtype == tl.bfloat16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def load_tile(desc, base_ptr, bh, start, n_rows, stride_row, stride_col, head_dim,
              BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    """Rows [start, start + BLOCK_ROWS) of one head as a [BLOCK_ROWS, BLOCK_D] tile, zero past the
    last row and past the head dim (the head dim is padded to a power of two)."""
    if USE_DESCRIPTOR:
        # The descriptor's bounds are the head's own (rows, head_dim): TMA fills outside with zeros.
        tile = desc.load([bh, start, 0]).reshape(BLOCK_ROWS, BLOCK_D)
    else:
        rows = start + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_D)
        ptrs = base_ptr + rows.to(tl.int64)[:, None] * stride_row + cols[None, :] * stride_col
        tile = tl.load(ptrs, mask=(rows < n_rows)[:, None] & (cols < head_dim)[None, :], other=0.0)
    return tile


@triton.jit
def store_tile(desc, base_ptr, bh, start, n_rows, stride_row, head_dim, tile,
               BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    """Store a [BLOCK_ROWS, BLOCK_D] tile into rows [start, ...) of a head whose head dim is contiguous."""
    if USE_DESCRIPTOR:
        desc.store([bh, start, 0], tile.reshape(1, BLOCK_ROWS, BLOCK_D))
    else:
        rows = start + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_D)
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
def load_key_tile(desc, base_ptr, kv_bh, start, n_keys, stride_row, stride_col, head_dim,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, USE_DESCRIPTOR: tl.constexpr,
                  ROW_DESCRIPTORS: tl.constexpr):
    """Keys [start, start + BLOCK_N) of a K or V head; with ROW_DESCRIPTORS ``desc`` is a
    rows_descriptor() and the block must lie inside the head."""
    if ROW_DESCRIPTORS:
        tile = desc.load([kv_bh * n_keys + start, 0])
    else:
        tile = load_tile(desc, base_ptr, kv_bh, start, n_keys, stride_row, stride_col, head_dim,
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

# Lengths, head counts and the causal offset are not specialized by value: Triton would otherwise
# compile a separate kernel for each of them equal to 1 (decoding, MQA, batch 1) and for each
# divisibility by 16, while the tiles are bounded by masks and TMA bounds either way.
COUNT_ARGS = ["n_heads_q", "group", "batch", "n_queries", "n_keys", "causal_offset"]


@triton.jit
def forward_key_blocks(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_bh, rows,
                       start_n, stop_n, n_keys, head_dim, qk_scale, causal_offset,
                       stride_ks, stride_kd, stride_vs, stride_vd,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                       MASKED: tl.constexpr, USE_DESCRIPTOR: tl.constexpr, ROW_DESCRIPTORS: tl.constexpr,
                       WARP_SPECIALIZE: tl.constexpr):
    """Seed 004's loop over keys [start_n, stop_n), a block at a time; scores in log2 units."""
    for block_start in tl.range(start_n, stop_n, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = load_key_tile(desc_k, k_base, kv_bh, block_start, n_keys, stride_ks, stride_kd, head_dim,
                          BLOCK_N, BLOCK_D, USE_DESCRIPTOR, ROW_DESCRIPTORS)  # [N, D]
        qk = mma(q, tl.trans(k), None)  # [M, N]
        if MASKED:
            cols = block_start + tl.arange(0, BLOCK_N)
            # Warp-specialized, every block comes here when causal, and its keys fill whole blocks.
            qk = tl.where(visible(rows, cols, n_keys, causal_offset, CAUSAL, WARP_SPECIALIZE), qk, NEG_INF)
        # scale > 0, so the scaled maximum is the maximum scaled, and the scaling and the
        # subtraction fuse into one FMA per score.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        if MASKED:
            # A row with no visible key so far keeps m = -inf; measuring from 0 keeps
            # exp2(-inf - -inf) = NaN out of p and alpha (both become 0).
            m_ref = tl.where(m_new == NEG_INF, 0.0, m_new)
        else:
            m_ref = m_new
        p = tl.math.exp2(qk * qk_scale - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_key_tile(desc_v, v_base, kv_bh, block_start, n_keys, stride_vs, stride_vd, head_dim,
                          BLOCK_N, BLOCK_D, USE_DESCRIPTOR, ROW_DESCRIPTORS)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


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
    WARP_SPECIALIZE: tl.constexpr,
):
    n_heads_kv = n_heads_q // group
    block_m = tl.program_id(0)
    if CAUSAL:
        # The last query blocks have the most keys to visit: launch them first.
        block_m = tl.num_programs(0) - 1 - block_m
    bh = tl.program_id(1)
    b = bh // n_heads_q
    h = bh % n_heads_q
    h_kv = h // group
    kv_bh = b * n_heads_kv + h_kv
    start_m = block_m * BLOCK_M

    desc_q = head_descriptor(q_ptr, batch * n_heads_q, n_queries, head_dim, q_head_stride, stride_qs,
                             BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    desc_k = head_descriptor(k_ptr, batch * n_heads_kv, n_keys, head_dim, k_head_stride, stride_ks,
                             BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_v = head_descriptor(v_ptr, batch * n_heads_kv, n_keys, head_dim, v_head_stride, stride_vs,
                             BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    # o is ours: contiguous (batch * heads, n_queries, head_dim).
    desc_o = head_descriptor(o_ptr, batch * n_heads_q, n_queries, head_dim, n_queries * head_dim, head_dim,
                             BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    o_base = o_ptr + bh.to(tl.int64) * n_queries * head_dim

    rows = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    full_stop, stop = key_ranges(start_m, n_keys, causal_offset, BLOCK_M, BLOCK_N, CAUSAL)
    if ROW_DESCRIPTORS:
        desc_k_rows = rows_descriptor(k_ptr, batch * n_heads_kv * n_keys, head_dim, stride_ks, BLOCK_N, BLOCK_D)
        desc_v_rows = rows_descriptor(v_ptr, batch * n_heads_kv * n_keys, head_dim, stride_vs, BLOCK_N, BLOCK_D)
    else:
        desc_k_rows = desc_k
        desc_v_rows = desc_v
    if WARP_SPECIALIZE:
        # Triton 3.6 warp-specializes this loop on Hopper (a producer warpgroup issuing the TMA
        # loads, the query block split between two consumer warpgroups). Its pass compiles only a
        # kernel whose one loop loads through 2-D descriptors and whose other tiles do not go
        # through 3-D ones, so: Q by rows too (the last block's rows past the head, read from the
        # next head or as TMA's zeros, are computed and never stored), the output by pointers, and
        # every key block in one loop, all masked when causal. The launcher asks for n_keys to be
        # a multiple of BLOCK_N, so no key block reads past its head.
        q = rows_descriptor(q_ptr, batch * n_heads_q * n_queries, head_dim, stride_qs, BLOCK_M, BLOCK_D).load(
            [bh * n_queries + start_m, 0])  # [M, D]
        acc, l_i, m_i = forward_key_blocks(acc, l_i, m_i, q, desc_k_rows, desc_v_rows, k_base, v_base, kv_bh, rows,
                                           0, stop, n_keys, head_dim, qk_scale, causal_offset,
                                           stride_ks, stride_kd, stride_vs, stride_vd,
                                           BLOCK_N, BLOCK_D, CAUSAL, CAUSAL, USE_DESCRIPTOR, True, True)
    else:
        q = load_tile(desc_q, q_base, bh, start_m, n_queries, stride_qs, stride_qd, head_dim,
                      BLOCK_M, BLOCK_D, USE_DESCRIPTOR)  # [M, D]
        acc, l_i, m_i = forward_key_blocks(acc, l_i, m_i, q, desc_k_rows, desc_v_rows, k_base, v_base, kv_bh, rows,
                                           0, full_stop, n_keys, head_dim, qk_scale, causal_offset,
                                           stride_ks, stride_kd, stride_vs, stride_vd,
                                           BLOCK_N, BLOCK_D, CAUSAL, False, USE_DESCRIPTOR, ROW_DESCRIPTORS, False)
        # The blocks on the diagonal or past the last key: rows of other heads must not enter here.
        acc, l_i, m_i = forward_key_blocks(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_bh, rows,
                                           full_stop, stop, n_keys, head_dim, qk_scale, causal_offset,
                                           stride_ks, stride_kd, stride_vs, stride_vd,
                                           BLOCK_N, BLOCK_D, CAUSAL, True, USE_DESCRIPTOR, False, False)
    # A row that saw no key (l = 0: bottom-right causal with Sq > Sk, or Sk = 0) gives 0 and lse -inf.
    has_keys = l_i > 0.0
    inv_l = tl.where(has_keys, 1.0 / l_i, 0.0)
    lse = tl.where(has_keys, (m_i + tl.math.log2(l_i)) * LN2, NEG_INF)
    tl.store(lse_ptr + bh.to(tl.int64) * n_queries + rows, lse, mask=rows < n_queries)
    out = (acc * inv_l[:, None]).to(o_ptr.dtype.element_ty)
    store_tile(desc_o, o_base, bh, start_m, n_queries, head_dim, head_dim, out, BLOCK_M, BLOCK_D,
               USE_DESCRIPTOR and not WARP_SPECIALIZE)


# --------------------------------------------------------------------------------------------
# Backward: delta = rowsum(dO * O), then dK/dV per key block and dQ per query block
# --------------------------------------------------------------------------------------------


@triton.jit
def attention_backward_delta_kernel(
    o_ptr, do_ptr, delta_ptr, n_heads, n_queries, head_dim,
    stride_dob, stride_doh, stride_dos, stride_dod,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # delta_i = sum_d dO_id O_id = sum_j P_ij dP_ij: the softmax backward's row dot product.
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < n_queries)[:, None] & (cols < head_dim)[None, :]
    o = tl.load(o_ptr + bh.to(tl.int64) * n_queries * head_dim + rows.to(tl.int64)[:, None] * head_dim + cols[None, :],
                mask=mask, other=0.0)
    do_base = do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    do = tl.load(do_base + rows.to(tl.int64)[:, None] * stride_dos + cols[None, :] * stride_dod, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + bh.to(tl.int64) * n_queries + rows, delta, mask=rows < n_queries)


@triton.jit
def load_row_stats(lse_ptr, delta_ptr, bh, rows, n_queries):
    """Per query row: the log-sum-exp in log2 units and delta. Rows that saw no key (lse = -inf)
    and rows past the end get lse = +inf, so their probabilities exp2(s - lse) are exactly 0."""
    offs = bh.to(tl.int64) * n_queries + rows
    lse = tl.load(lse_ptr + offs, mask=rows < n_queries, other=float("inf"))
    lse2 = tl.where(lse == NEG_INF, float("inf"), lse * 1.4426950408889634)  # log2(e): lse in log2 units
    delta = tl.load(delta_ptr + offs, mask=rows < n_queries, other=0.0)
    return lse2, delta


@triton.jit
def dkdv_step(dk, dv, k, v, desc_q, desc_do, q_base, do_base, lse_ptr, delta_ptr, bh, cols, block_start,
              n_queries, n_keys, head_dim, qk_scale, causal_offset, stride_qs, stride_qd, stride_dos, stride_dod,
              BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
              MASKED: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    # Transposed form: the key block is the tile's row dimension, so dK and dV accumulate as [N, D].
    rows = block_start + tl.arange(0, BLOCK_M)
    q = load_tile(desc_q, q_base, bh, block_start, n_queries, stride_qs, stride_qd, head_dim,
                  BLOCK_M, BLOCK_D, USE_DESCRIPTOR)  # [M, D]
    lse2, delta = load_row_stats(lse_ptr, delta_ptr, bh, rows, n_queries)
    p_t = tl.math.exp2(mma(k, tl.trans(q), None) * qk_scale - lse2[None, :])  # [N, M]
    if MASKED:
        p_t = tl.where(tl.trans(visible(rows, cols, n_keys, causal_offset, CAUSAL, False)), p_t, 0.0)
    do = load_tile(desc_do, do_base, bh, block_start, n_queries, stride_dos, stride_dod, head_dim,
                   BLOCK_M, BLOCK_D, USE_DESCRIPTOR)  # [M, D]
    dv = mma(p_t.to(do.dtype), do, dv)
    dp_t = mma(v, tl.trans(do), None)  # [N, M]
    ds_t = p_t * (dp_t - delta[None, :])
    dk = mma(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def dkdv_query_blocks(dk, dv, k, v, desc_q, desc_do, q_base, do_base, lse_ptr, delta_ptr, bh, cols,
                      start_m, stop_m, n_queries, n_keys, head_dim, qk_scale, causal_offset,
                      stride_qs, stride_qd, stride_dos, stride_dod,
                      BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                      MASKED: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    if MASKED:
        # The diagonal's few query blocks are not software-pipelined: a second pipelined loop made
        # ptxas spill dK and dV at head dim 128 (sm_90, 8 warps).
        for block_start in tl.range(start_m, stop_m, BLOCK_M, num_stages=1):
            dk, dv = dkdv_step(dk, dv, k, v, desc_q, desc_do, q_base, do_base, lse_ptr, delta_ptr, bh, cols,
                               block_start, n_queries, n_keys, head_dim, qk_scale, causal_offset,
                               stride_qs, stride_qd, stride_dos, stride_dod,
                               BLOCK_M, BLOCK_D, CAUSAL, MASKED, USE_DESCRIPTOR)
    else:
        for block_start in tl.range(start_m, stop_m, BLOCK_M):
            dk, dv = dkdv_step(dk, dv, k, v, desc_q, desc_do, q_base, do_base, lse_ptr, delta_ptr, bh, cols,
                               block_start, n_queries, n_keys, head_dim, qk_scale, causal_offset,
                               stride_qs, stride_qd, stride_dos, stride_dod,
                               BLOCK_M, BLOCK_D, CAUSAL, MASKED, USE_DESCRIPTOR)
    return dk, dv


@triton.jit(do_not_specialize=COUNT_ARGS)
def attention_backward_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    n_heads_q, group, batch, n_queries, n_keys, head_dim,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_dob, stride_doh, stride_dos, stride_dod,
    q_head_stride, k_head_stride, v_head_stride, do_head_stride,
    qk_scale, scale, causal_offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, USE_DESCRIPTOR: tl.constexpr,
):
    n_heads_kv = n_heads_q // group
    start_n = tl.program_id(0) * BLOCK_N
    kv_bh = tl.program_id(1)
    b = kv_bh // n_heads_kv
    h_kv = kv_bh % n_heads_kv
    cols = start_n + tl.arange(0, BLOCK_N)

    desc_q = head_descriptor(q_ptr, batch * n_heads_q, n_queries, head_dim, q_head_stride, stride_qs,
                             BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    desc_do = head_descriptor(do_ptr, batch * n_heads_q, n_queries, head_dim, do_head_stride, stride_dos,
                              BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    desc_k = head_descriptor(k_ptr, batch * n_heads_kv, n_keys, head_dim, k_head_stride, stride_ks,
                             BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_v = head_descriptor(v_ptr, batch * n_heads_kv, n_keys, head_dim, v_head_stride, stride_vs,
                             BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_dk = head_descriptor(dk_ptr, batch * n_heads_kv, n_keys, head_dim, n_keys * head_dim, head_dim,
                              BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_dv = head_descriptor(dv_ptr, batch * n_heads_kv, n_keys, head_dim, n_keys * head_dim, head_dim,
                              BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    k = load_tile(desc_k, k_base, kv_bh, start_n, n_keys, stride_ks, stride_kd, head_dim, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    v = load_tile(desc_v, v_base, kv_bh, start_n, n_keys, stride_vs, stride_vd, head_dim, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # Queries that see any of these keys: i >= start_n - offset; every key: i >= start_n + N - 1 - offset.
    q_stop = tl.cdiv(n_queries, BLOCK_M) * BLOCK_M
    if CAUSAL:
        first = tl.minimum(tl.maximum(start_n - causal_offset, 0), q_stop)
        masked_start = (first // BLOCK_M) * BLOCK_M
        all_seen = tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0)
        full_start = tl.maximum(tl.minimum(tl.cdiv(all_seen, BLOCK_M) * BLOCK_M, q_stop), masked_start)
    else:
        masked_start = 0
        full_start = 0
    # The GQA sum over the group: the group's query heads one after another, in a fixed order.
    for g in range(0, group):
        h = h_kv * group + g
        bh = b * n_heads_q + h
        q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        do_base = do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        if CAUSAL:
            dk, dv = dkdv_query_blocks(dk, dv, k, v, desc_q, desc_do, q_base, do_base, lse_ptr, delta_ptr, bh, cols,
                                       masked_start, full_start, n_queries, n_keys, head_dim, qk_scale, causal_offset,
                                       stride_qs, stride_qd, stride_dos, stride_dod,
                                       BLOCK_M, BLOCK_D, CAUSAL, True, USE_DESCRIPTOR)
        dk, dv = dkdv_query_blocks(dk, dv, k, v, desc_q, desc_do, q_base, do_base, lse_ptr, delta_ptr, bh, cols,
                                   full_start, q_stop, n_queries, n_keys, head_dim, qk_scale, causal_offset,
                                   stride_qs, stride_qd, stride_dos, stride_dod,
                                   BLOCK_M, BLOCK_D, CAUSAL, False, USE_DESCRIPTOR)
    dk_base = dk_ptr + kv_bh.to(tl.int64) * n_keys * head_dim
    dv_base = dv_ptr + kv_bh.to(tl.int64) * n_keys * head_dim
    store_tile(desc_dk, dk_base, kv_bh, start_n, n_keys, head_dim, head_dim, (dk * scale).to(dk_ptr.dtype.element_ty),
               BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    store_tile(desc_dv, dv_base, kv_bh, start_n, n_keys, head_dim, head_dim, dv.to(dv_ptr.dtype.element_ty),
               BLOCK_N, BLOCK_D, USE_DESCRIPTOR)


@triton.jit
def dq_key_blocks(dq, q, do, lse2, delta, desc_k, desc_v, k_base, v_base, kv_bh, rows,
                  start_n, stop_n, n_keys, head_dim, qk_scale, causal_offset,
                  stride_ks, stride_kd, stride_vs, stride_vd,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                  MASKED: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    for block_start in tl.range(start_n, stop_n, BLOCK_N):
        k = load_tile(desc_k, k_base, kv_bh, block_start, n_keys, stride_ks, stride_kd, head_dim,
                      BLOCK_N, BLOCK_D, USE_DESCRIPTOR)  # [N, D]
        v = load_tile(desc_v, v_base, kv_bh, block_start, n_keys, stride_vs, stride_vd, head_dim,
                      BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
        p = tl.math.exp2(mma(q, tl.trans(k), None) * qk_scale - lse2[:, None])  # [M, N]
        if MASKED:
            cols = block_start + tl.arange(0, BLOCK_N)
            p = tl.where(visible(rows, cols, n_keys, causal_offset, CAUSAL, False), p, 0.0)
        dp = mma(do, tl.trans(v), None)
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(k.dtype), k, dq)
    return dq


@triton.jit(do_not_specialize=COUNT_ARGS)
def attention_backward_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    n_heads_q, group, batch, n_queries, n_keys, head_dim,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_dob, stride_doh, stride_dos, stride_dod,
    q_head_stride, k_head_stride, v_head_stride, do_head_stride,
    qk_scale, scale, causal_offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, USE_DESCRIPTOR: tl.constexpr,
):
    n_heads_kv = n_heads_q // group
    block_m = tl.program_id(0)
    if CAUSAL:
        block_m = tl.num_programs(0) - 1 - block_m
    bh = tl.program_id(1)
    b = bh // n_heads_q
    h = bh % n_heads_q
    h_kv = h // group
    kv_bh = b * n_heads_kv + h_kv
    start_m = block_m * BLOCK_M

    desc_q = head_descriptor(q_ptr, batch * n_heads_q, n_queries, head_dim, q_head_stride, stride_qs,
                             BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    desc_do = head_descriptor(do_ptr, batch * n_heads_q, n_queries, head_dim, do_head_stride, stride_dos,
                              BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    desc_k = head_descriptor(k_ptr, batch * n_heads_kv, n_keys, head_dim, k_head_stride, stride_ks,
                             BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_v = head_descriptor(v_ptr, batch * n_heads_kv, n_keys, head_dim, v_head_stride, stride_vs,
                             BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_dq = head_descriptor(dq_ptr, batch * n_heads_q, n_queries, head_dim, n_queries * head_dim, head_dim,
                              BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    do_base = do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh

    rows = start_m + tl.arange(0, BLOCK_M)
    q = load_tile(desc_q, q_base, bh, start_m, n_queries, stride_qs, stride_qd, head_dim, BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    do = load_tile(desc_do, do_base, bh, start_m, n_queries, stride_dos, stride_dod, head_dim,
                   BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    lse2, delta = load_row_stats(lse_ptr, delta_ptr, bh, rows, n_queries)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    full_stop, stop = key_ranges(start_m, n_keys, causal_offset, BLOCK_M, BLOCK_N, CAUSAL)
    dq = dq_key_blocks(dq, q, do, lse2, delta, desc_k, desc_v, k_base, v_base, kv_bh, rows,
                       0, full_stop, n_keys, head_dim, qk_scale, causal_offset,
                       stride_ks, stride_kd, stride_vs, stride_vd, BLOCK_N, BLOCK_D, CAUSAL, False, USE_DESCRIPTOR)
    dq = dq_key_blocks(dq, q, do, lse2, delta, desc_k, desc_v, k_base, v_base, kv_bh, rows,
                       full_stop, stop, n_keys, head_dim, qk_scale, causal_offset,
                       stride_ks, stride_kd, stride_vs, stride_vd, BLOCK_N, BLOCK_D, CAUSAL, True, USE_DESCRIPTOR)
    dq_base = dq_ptr + bh.to(tl.int64) * n_queries * head_dim
    store_tile(desc_dq, dq_base, bh, start_m, n_queries, head_dim, head_dim, (dq * scale).to(dq_ptr.dtype.element_ty),
               BLOCK_M, BLOCK_D, USE_DESCRIPTOR)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------



def _descriptor_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator():
    # Device-side tensor descriptors need global scratch for the descriptor itself (128 bytes per
    # program); Triton asks the allocator registered with triton.set_allocator. That registration
    # is a ContextVar: set in one thread it is absent in another (autograd runs backward in its
    # own thread), so it is checked before every launch. A user's own allocator is left alone.
    from triton.runtime import _allocation
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_descriptor_scratch)


def _head_stride(t: torch.Tensor) -> Optional[int]:
    """Stride of the merged (batch * heads) dim of a (B, H, S, D) tensor, or None if they do not merge."""
    b, h = t.shape[0], t.shape[1]
    if h == 1:
        return t.stride(0)
    if b == 1 or t.stride(0) == h * t.stride(1):
        return t.stride(1)
    return None


def descriptor_ok(*tensors: torch.Tensor) -> bool:
    """TMA's conditions: unit stride along the head dim, 16-byte aligned base and strides, no empty dim."""
    for t in tensors:
        head_stride = _head_stride(t)
        # Broadcast views (stride 0, e.g. K/V expanded over heads) are left to pointer loads.
        if t.numel() == 0 or t.stride(3) != 1 or not head_stride or t.stride(2) <= 0:
            return False
        elem = t.element_size()
        if t.data_ptr() % 16 or (head_stride * elem) % 16 or (t.stride(2) * elem) % 16:
            return False
    return True


def heads_follow_rows(*tensors: torch.Tensor) -> bool:
    """Whether each (B, H, S, D) tensor is a stack of (S, D) heads one after another, as 2-D
    descriptors over (B * H * S, D) need (on top of descriptor_ok's conditions)."""
    for t in tensors:
        batch, heads, seq = t.shape[:3]
        # Even with one row a head: its row stride is the descriptor's, so it must be the head stride.
        if batch * heads * seq >= 2**31 or _head_stride(t) != seq * t.stride(2):
            return False
    return True


def rows_ok(*tensors: torch.Tensor) -> bool:
    """Whether the tensors allow the forward's row descriptors: TMA's conditions, heads after heads."""
    return descriptor_ok(*tensors) and heads_follow_rows(*tensors)


def _strides(t: torch.Tensor):
    return tuple(t.stride())


def _head_strides(*tensors):
    return tuple(_head_stride(t) or 0 for t in tensors)


def _causal_offset(mode: str, n_queries: int, n_keys: int) -> int:
    return n_keys - n_queries if mode == "bottom_right" else 0


# Launches skip Triton's per-call argument binding (_launch.Launcher), keyed by what decides the
# kernels' specialization: the launch plan, every shape, stride and dtype, and the alignment of the
# caller's tensors (outputs come aligned from the caching allocator). A forward and backward of
# B1 H2 S128 took 1.0 ms of host time per step through Triton's path on the H100 machine's host,
# more than the GPU needs for B8 H16 S1024 (0.93 ms).
_forward_launcher = Launcher(attention_forward_kernel)
_delta_launcher = Launcher(attention_backward_delta_kernel)
_dkdv_launcher = Launcher(attention_backward_dkdv_kernel)
_dq_launcher = Launcher(attention_backward_dq_kernel)


def _layout_key(*tensors: torch.Tensor) -> tuple:
    return tuple((t.shape, t.stride(), t.dtype, aligned(t)) for t in tensors)


def launch_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str, scale: float,
                   use_descriptor: Optional[bool] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) for validated inputs; ``mode`` is "none", "top_left" or "bottom_right".
    ``use_descriptor`` overrides the layout check: False forces pointer loads everywhere."""
    batch, n_heads_q, n_queries, head_dim = q.shape
    n_heads_kv, n_keys = k.shape[1], k.shape[2]
    tma_ok = descriptor_ok(q, k, v)
    chosen = planner.attention_plan("forward", head_dim, q.dtype, mode != "none", q.device, n_queries, n_keys,
                                    tma_ok if use_descriptor is None else use_descriptor,
                                    tma_ok and use_descriptor is not False and heads_follow_rows(q, k, v))
    planner.record_attention(chosen)
    if chosen.path == "torch":
        return cpu.attention_forward(q, k, v, mode, scale)
    out = _buffers.empty((batch, n_heads_q, n_queries, head_dim), q.dtype, q.device)
    lse = _buffers.empty((batch, n_heads_q, n_queries), torch.float32, q.device)
    if out.numel() == 0:
        return out, lse
    if chosen.use_descriptor or chosen.row_descriptors:
        _ensure_allocator()
    grid = (triton.cdiv(n_queries, chosen.block_m), batch * n_heads_q)
    _forward_launcher(
        grid, (chosen, _layout_key(q, k, v)),
        q, k, v, out, lse, n_heads_q, n_heads_q // n_heads_kv, batch, n_queries, n_keys, head_dim,
        *_strides(q), *_strides(k), *_strides(v), *_head_strides(q, k, v),
        scale * LOG2E, _causal_offset(mode, n_queries, n_keys),
        BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n, BLOCK_D=chosen.block_d, CAUSAL=mode != "none",
        USE_DESCRIPTOR=chosen.use_descriptor, ROW_DESCRIPTORS=chosen.row_descriptors,
        WARP_SPECIALIZE=chosen.warp_specialize, num_warps=chosen.num_warps, num_stages=chosen.num_stages,
        **chosen.compile_options)
    return out, lse


def launch_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, mode: str, scale: float, use_descriptor: Optional[bool] = None):
    """(dq, dk, dv) from the saved forward (out, lse) and the upstream gradient ``do``."""
    batch, n_heads_q, n_queries, head_dim = q.shape
    n_heads_kv, n_keys = k.shape[1], k.shape[2]
    causal = mode != "none"
    ok = descriptor_ok(q, k, v, do) if use_descriptor is None else use_descriptor
    dkdv_plan = planner.attention_plan("backward_dkdv", head_dim, q.dtype, causal, q.device, n_queries, n_keys, ok)
    dq_plan = planner.attention_plan("backward_dq", head_dim, q.dtype, causal, q.device, n_queries, n_keys, ok)
    planner.record_attention(dkdv_plan)
    if dkdv_plan.path == "torch":
        return cpu.attention_backward(do, q, k, v, out, lse, mode, scale)
    dq = _buffers.empty(q.shape, q.dtype, q.device)
    dk = _buffers.empty(k.shape, k.dtype, k.device)
    dv = _buffers.empty(v.shape, v.dtype, v.device)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dkdv_plan.use_descriptor or dq_plan.use_descriptor:
        _ensure_allocator()
    delta = _buffers.empty((batch, n_heads_q, n_queries), torch.float32, q.device)
    delta_block = 64 if head_dim <= 128 else 32
    key = (dkdv_plan, dq_plan, _layout_key(q, k, v, do, out, lse))
    _delta_launcher(
        (triton.cdiv(n_queries, delta_block), batch * n_heads_q), key,
        out, do, delta, n_heads_q, n_queries, head_dim, *_strides(do),
        BLOCK_M=delta_block, BLOCK_D=dkdv_plan.block_d, num_warps=4)
    args = (n_heads_q, n_heads_q // n_heads_kv, batch, n_queries, n_keys, head_dim,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_head_strides(q, k, v, do),
            scale * LOG2E, scale, _causal_offset(mode, n_queries, n_keys))
    _dkdv_launcher(
        (triton.cdiv(n_keys, dkdv_plan.block_n), batch * n_heads_kv), key,
        q, k, v, do, lse, delta, dk, dv, *args,
        BLOCK_M=dkdv_plan.block_m, BLOCK_N=dkdv_plan.block_n, BLOCK_D=dkdv_plan.block_d, CAUSAL=causal,
        USE_DESCRIPTOR=dkdv_plan.use_descriptor, num_warps=dkdv_plan.num_warps, num_stages=dkdv_plan.num_stages,
        **dkdv_plan.compile_options)
    _dq_launcher(
        (triton.cdiv(n_queries, dq_plan.block_m), batch * n_heads_q), key,
        q, k, v, do, lse, delta, dq, *args,
        BLOCK_M=dq_plan.block_m, BLOCK_N=dq_plan.block_n, BLOCK_D=dq_plan.block_d, CAUSAL=causal,
        USE_DESCRIPTOR=dq_plan.use_descriptor, num_warps=dq_plan.num_warps, num_stages=dq_plan.num_stages,
        **dq_plan.compile_options)
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# Custom ops: torch.compile sees opaque forward and backward ops with shape-only fakes
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("onlinesoftmax::attention_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_forward(q, k, v, mode, scale)


@_forward_op.register_fake
def _(q, k, v, mode, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("onlinesoftmax::attention_backward", mutates_args=())
def _backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, mode: str, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_backward(do, q, k, v, out, lse, mode, scale)


@_backward_op.register_fake
def _(do, q, k, v, out, lse, mode, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_forward = op_when_compiling(_forward_op, launch_forward)
_backward = op_when_compiling(_backward_op, launch_backward)


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mode, scale):
        out, lse = _forward(q, k, v, mode, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (mode, scale)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse = ctx.saved_tensors
        mode, scale = ctx.config
        dq, dk, dv = _backward(d_out, q, k, v, out, lse, mode, scale)
        return dq, dk, dv, None, None


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------

CAUSAL_MODES = ("top_left", "bottom_right")
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 128, 192, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_BATCH_HEADS = 65535


def _causal_mode(causal) -> str:
    if causal is False or causal is None:
        return "none"
    if causal is True:
        return "top_left"
    if isinstance(causal, str) and causal in CAUSAL_MODES:
        return causal
    raise ValueError(f"attention: causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")


def _check(q, k, v, causal, scale):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"attention runs in float16 and bfloat16 (fp32 accumulation inside); got {q.dtype}: "
                        "cast the inputs with .to(torch.bfloat16) or .half(), or use "
                        "torch.nn.functional.scaled_dot_product_attention for this dtype")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type not in ("cuda", "cpu"):
        raise ValueError(f"attention runs on CUDA and CPU tensors, got a tensor on {q.device}")
    if k.shape != v.shape:
        raise ValueError(f"attention: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"attention: batch sizes differ: q has {q.shape[0]}, k and v have {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"attention: head dims differ: q has {q.shape[3]}, k and v have {k.shape[3]}")
    if q.shape[3] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"attention: head dim {q.shape[3]} is not supported; supported: {SUPPORTED_HEAD_DIMS} "
                         "(pad q, k and v with zeros along the head dim to the next supported size)")
    n_heads_q, n_heads_kv = q.shape[1], k.shape[1]
    if n_heads_kv == 0 or n_heads_q % n_heads_kv:
        raise ValueError(f"attention: the query heads ({n_heads_q}) must be a multiple of the key/value heads "
                         f"({n_heads_kv}) for grouped-query attention")
    if q.shape[0] * n_heads_q > MAX_BATCH_HEADS:
        # batch x heads is the grid's second axis (CUDA caps it at 65535); the first axis, query
        # blocks, keeps the programs that share a head's K and V adjacent for the L2.
        raise ValueError(f"attention: batch x query heads = {q.shape[0] * n_heads_q} exceeds {MAX_BATCH_HEADS}; "
                         "split the batch into several calls")
    mode = _causal_mode(causal)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[3])
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"attention: scale must be a real number or None, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"attention: scale must be finite and > 0, got {scale!r}")
    return mode, float(scale)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: Union[bool, str] = False,
              scale: Optional[float] = None, return_lse: bool = False):
    """Scaled dot-product attention in one pass over the keys (flash attention, seed 004).

    ``out = softmax(scale * q @ k^T + mask) @ v`` without forming the score matrix.

    Parameters
    ----------
    q : Tensor, shape (B, Hq, Sq, D)
    k, v : Tensor, shape (B, Hkv, Sk, D)
        float16 or bfloat16, CUDA or CPU, any strides (the SDPA layout; a (B, S, H, D) tensor
        viewed with ``.transpose(1, 2)`` is read in place). ``Hq`` must be a multiple of ``Hkv``
        (grouped-query attention; ``Hkv = 1`` is multi-query). ``D`` one of 32, 64, 80, 96, 128,
        192, 256. ``Sq`` and ``Sk`` may differ and take any value, 0 included.
    causal : bool or {"top_left", "bottom_right"}
        ``False``: no mask. ``True`` or ``"top_left"``: query ``i`` sees keys ``j <= i``, as SDPA's
        ``is_causal`` (the mask ``tril(ones(Sq, Sk))``). ``"bottom_right"``: query ``i`` sees keys
        ``j <= i + Sk - Sq``, the queries being the last ``Sq`` positions of the sequence (decoding
        with a KV cache: ``Sq = 1`` sees every key). The two agree when ``Sq == Sk``.
    scale : float, optional
        Multiplies ``q @ k^T``; finite and > 0; ``1 / sqrt(D)`` by default.
    return_lse : bool
        Also return the natural-log log-sum-exp of each query row's scaled, masked scores.

    Returns
    -------
    out : Tensor, shape (B, Hq, Sq, D), dtype of ``q``, contiguous
    lse : Tensor, shape (B, Hq, Sq), float32 (only with ``return_lse=True``)
        ``log(sum_j exp(scale * q_i . k_j))`` over the visible keys: two attentions over disjoint
        key sets merge as ``out = w_a out_a + w_b out_b``, ``w_x = exp(lse_x - logaddexp(lse_a, lse_b))``.
        Not differentiable (its gradient is taken as zero).

    Notes
    -----
    A query row with no visible key (``"bottom_right"`` with ``Sq > Sk`` for the first ``Sq - Sk``
    rows, or ``Sk = 0``) gives an output row of zeros, an ``lse`` of ``-inf`` and zero gradients,
    never NaN (SDPA returns NaN there on some backends). Accumulation and softmax statistics are
    fp32. Differentiable through Triton backward kernels without atomics (bitwise reproducible);
    traceable by ``torch.compile(fullgraph=True)`` through custom ops. CPU tensors run a blockwise
    online implementation in PyTorch, or the Triton kernels when ``TRITON_INTERPRET=1``.

    Raises
    ------
    TypeError
        Non-tensor inputs, mixed dtypes, dtypes other than float16/bfloat16 (float32: cast first),
        a non-numeric scale.
    ValueError
        Not 4-D, mismatched batch / head dim / k-v shapes, ``Hq`` not a multiple of ``Hkv``, an
        unsupported head dim, inputs on different or unsupported devices, an unknown ``causal``,
        a scale that is not finite and positive.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> q = k = v = torch.randn(1, 2, 5, 32, dtype=torch.bfloat16)
    >>> onlinesoftmax.attention(q, k, v, causal=True).shape
    torch.Size([1, 2, 5, 32])
    """
    mode, scale = _check(q, k, v, causal, scale)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _AttentionFunction.apply(q, k, v, mode, scale)
    else:
        out, lse = _forward(q, k, v, mode, scale)
    return (out, lse) if return_lse else out
