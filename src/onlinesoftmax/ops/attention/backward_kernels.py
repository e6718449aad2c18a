"""Flash attention's backward (Dao et al., 2022): Triton kernels without atomics, so results are
bitwise reproducible. They recompute the probabilities from the forward's saved log-sum-exp
instead of storing them (``P = exp(scale * Q K^T - lse)``):

* ``attention_backward_delta_kernel``: ``delta`` (each query row's dO . O), first.
* ``attention_backward_dkdv_kernel``: one program per key block and KV head; it loops over the
  query heads of its group and over the query blocks that see its keys, accumulating dK and dV in
  registers (the GQA sum over the group happens there, in a fixed order). Where such programs are
  too few for the GPU (GQA and MQA at small batches, causal rows whose first key blocks hold most
  of the work), ``GROUP_SPLIT`` programs share a key block, each over a slice of the group into
  float32 partials (``plan.dkdv_group_split``), which ``attention_backward_sum_parts_kernel`` then
  sums in a fixed order.
* ``attention_backward_dq_kernel``: one program per query block and query head, looping over keys.
* ``attention_backward_fused_kernel``: where a head's keys fit one block, all three in one program
  per KV head: one launch instead of three, which is most of a short sequence's backward.

Masks, load paths and the tile helpers are the forward's (``kernels.py``). The dK/dV and dQ kernels
take a head dim split in two power-of-two parts as the forward does (``BLOCK_D2 > 0``: 96 as 64 +
32): every product over the head dim is two, every [*, D] tile two, and no column of padding is
multiplied.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton import NEG_INF, mma, strides_on_vectors
from .kernels import (COUNT_ARGS, head_descriptor, key_ranges, key_value_bases, load_part, load_tile, on_vectors,
                      own_descriptor, qkv_descriptors, qkv_on_vectors, query_program, store_part, store_tile,
                      visible)


@triton.jit
def attention_backward_delta_kernel(
    o_ptr, do_ptr, delta_ptr, n_heads, n_queries, head_dim,
    stride_dob, stride_doh, stride_dos, stride_dod,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, VEC: tl.constexpr = 1,
):
    # delta_i = sum_d dO_id O_id = sum_j P_ij dP_ij: the softmax backward's row dot product.
    head_dim = on_vectors(head_dim, VEC)
    stride_dob, stride_doh, stride_dos, _ = strides_on_vectors(stride_dob, stride_doh, stride_dos, 0, VEC)
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
def inputs_on_vectors(head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks,
                      k_head_stride, stride_vb, stride_vh, stride_vs, v_head_stride, stride_dob, stride_doh,
                      stride_dos, do_head_stride, VEC: tl.constexpr):
    """kernels.qkv_on_vectors, then dO's strides: the backward kernels' VEC (kernels.on_vectors)."""
    (head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
     stride_vb, stride_vh, stride_vs, v_head_stride) = qkv_on_vectors(
        head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
        stride_vb, stride_vh, stride_vs, v_head_stride, VEC)
    stride_dob, stride_doh, stride_dos, do_head_stride = strides_on_vectors(stride_dob, stride_doh, stride_dos,
                                                                            do_head_stride, VEC)
    return (head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
            stride_vb, stride_vh, stride_vs, v_head_stride, stride_dob, stride_doh, stride_dos, do_head_stride)


@triton.jit
def part_descriptors(q_ptr, k_ptr, v_ptr, do_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
                      q_head_stride, k_head_stride, v_head_stride, do_head_stride,
                      stride_qs, stride_ks, stride_vs, stride_dos,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                      USE_DESCRIPTOR: tl.constexpr):
    """Per-head descriptors of the caller's Q, K, V and dO for tiles BLOCK_D wide along the head dim."""
    desc_q, desc_k, desc_v = qkv_descriptors(
        q_ptr, k_ptr, v_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
        q_head_stride, k_head_stride, v_head_stride, stride_qs, stride_ks, stride_vs,
        BLOCK_M, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_do = head_descriptor(do_ptr, batch * n_heads_q, n_queries, head_dim, do_head_stride, stride_dos,
                              BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    return desc_q, desc_k, desc_v, desc_do


@triton.jit
def input_descriptors(q_ptr, k_ptr, v_ptr, do_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
                      q_head_stride, k_head_stride, v_head_stride, do_head_stride,
                      stride_qs, stride_ks, stride_vs, stride_dos,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                      USE_DESCRIPTOR: tl.constexpr):
    """part_descriptors of the head dim's first part, then of its second (BLOCK_D2 wide); with
    BLOCK_D2 = 0 the second four are the first's, placeholders never read."""
    desc_q, desc_k, desc_v, desc_do = part_descriptors(
        q_ptr, k_ptr, v_ptr, do_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
        q_head_stride, k_head_stride, v_head_stride, do_head_stride, stride_qs, stride_ks, stride_vs, stride_dos,
        BLOCK_M, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    if BLOCK_D2 > 0:
        desc_q2, desc_k2, desc_v2, desc_do2 = part_descriptors(
            q_ptr, k_ptr, v_ptr, do_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
            q_head_stride, k_head_stride, v_head_stride, do_head_stride, stride_qs, stride_ks, stride_vs, stride_dos,
            BLOCK_M, BLOCK_N, BLOCK_D2, USE_DESCRIPTOR)
    else:
        desc_q2 = desc_q
        desc_k2 = desc_k
        desc_v2 = desc_v
        desc_do2 = desc_do
    return desc_q, desc_k, desc_v, desc_do, desc_q2, desc_k2, desc_v2, desc_do2


@triton.jit
def store_key_value_gradients(dk, dv, dk_ptr, dv_ptr, batch, n_heads_kv, kv_bh, start_n, n_keys, head_dim, scale,
                              COL0: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                              USE_DESCRIPTOR: tl.constexpr):
    """dK (times the softmax scale) and dV of a key block, head-dim columns [COL0, COL0 + BLOCK_D),
    into the op's (batch * KV heads, keys, D)."""
    desc_dk = own_descriptor(dk_ptr, batch * n_heads_kv, n_keys, head_dim, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_dv = own_descriptor(dv_ptr, batch * n_heads_kv, n_keys, head_dim, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    dk_base = dk_ptr + kv_bh.to(tl.int64) * n_keys * head_dim
    dv_base = dv_ptr + kv_bh.to(tl.int64) * n_keys * head_dim
    store_part(desc_dk, dk_base, kv_bh, start_n, n_keys, head_dim, head_dim, (dk * scale).to(dk_ptr.dtype.element_ty),
               COL0, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    store_part(desc_dv, dv_base, kv_bh, start_n, n_keys, head_dim, head_dim, dv.to(dv_ptr.dtype.element_ty),
               COL0, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)


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
def dkdv_step(dk, dv, dk2, dv2, k, v, k2, v2, desc_q, desc_do, desc_q2, desc_do2, q_base, do_base, lse_ptr,
              delta_ptr, bh, cols, block_start, n_queries, n_keys, head_dim, qk_scale, causal_offset,
              stride_qs, stride_qd, stride_dos, stride_dod,
              BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr, CAUSAL: tl.constexpr,
              MASKED: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    # Transposed form: the key block is the tile's row dimension, so dK and dV accumulate as [N, D].
    # With BLOCK_D2 > 0 the head dim's second part (columns BLOCK_D on) is k2, v2, dk2, dv2.
    rows = block_start + tl.arange(0, BLOCK_M)
    q = load_tile(desc_q, q_base, bh, block_start, n_queries, stride_qs, stride_qd, head_dim,
                  BLOCK_M, BLOCK_D, USE_DESCRIPTOR)  # [M, D]
    lse2, delta = load_row_stats(lse_ptr, delta_ptr, bh, rows, n_queries)
    s_t = mma(k, tl.trans(q), None)  # [N, M]
    if BLOCK_D2 > 0:
        q2 = load_part(desc_q2, q_base, bh, block_start, n_queries, stride_qs, stride_qd, head_dim, BLOCK_D,
                       BLOCK_M, BLOCK_D2, USE_DESCRIPTOR)
        s_t = mma(k2, tl.trans(q2), s_t)
    p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
    if MASKED:
        p_t = tl.where(tl.trans(visible(rows, cols, n_keys, causal_offset, CAUSAL, False)), p_t, 0.0)
    do = load_tile(desc_do, do_base, bh, block_start, n_queries, stride_dos, stride_dod, head_dim,
                   BLOCK_M, BLOCK_D, USE_DESCRIPTOR)  # [M, D]
    dv = mma(p_t.to(do.dtype), do, dv)
    dp_t = mma(v, tl.trans(do), None)  # [N, M]
    if BLOCK_D2 > 0:
        do2 = load_part(desc_do2, do_base, bh, block_start, n_queries, stride_dos, stride_dod, head_dim, BLOCK_D,
                        BLOCK_M, BLOCK_D2, USE_DESCRIPTOR)
        dv2 = mma(p_t.to(do2.dtype), do2, dv2)
        dp_t = mma(v2, tl.trans(do2), dp_t)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = mma(ds_t.to(q.dtype), q, dk)
    if BLOCK_D2 > 0:
        dk2 = mma(ds_t.to(q2.dtype), q2, dk2)
    return dk, dv, dk2, dv2


@triton.jit
def dkdv_query_blocks(dk, dv, dk2, dv2, k, v, k2, v2, desc_q, desc_do, desc_q2, desc_do2, q_base, do_base, lse_ptr,
                      delta_ptr, bh, cols, start_m, stop_m, n_queries, n_keys, head_dim, qk_scale, causal_offset,
                      stride_qs, stride_qd, stride_dos, stride_dod,
                      BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr, CAUSAL: tl.constexpr,
                      MASKED: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    if MASKED and BLOCK_D2 == 0:
        # The diagonal's few query blocks are not software-pipelined: a second pipelined loop made
        # ptxas spill dK and dV at head dim 128 (sm_90, 8 warps). A split head dim's loop is: at one
        # stage Triton 3.6 compiled it to a wgmma reading shared memory out of bounds (D96 causal;
        # plan.ATTENTION_BACKWARD_SPLIT_HEAD_DIMS).
        for block_start in tl.range(start_m, stop_m, BLOCK_M, num_stages=1):
            dk, dv, dk2, dv2 = dkdv_step(dk, dv, dk2, dv2, k, v, k2, v2, desc_q, desc_do, desc_q2, desc_do2, q_base,
                                         do_base, lse_ptr, delta_ptr, bh, cols, block_start, n_queries, n_keys,
                                         head_dim, qk_scale, causal_offset, stride_qs, stride_qd, stride_dos,
                                         stride_dod, BLOCK_M, BLOCK_D, BLOCK_D2, CAUSAL, MASKED, USE_DESCRIPTOR)
    else:
        for block_start in tl.range(start_m, stop_m, BLOCK_M):
            dk, dv, dk2, dv2 = dkdv_step(dk, dv, dk2, dv2, k, v, k2, v2, desc_q, desc_do, desc_q2, desc_do2, q_base,
                                         do_base, lse_ptr, delta_ptr, bh, cols, block_start, n_queries, n_keys,
                                         head_dim, qk_scale, causal_offset, stride_qs, stride_qd, stride_dos,
                                         stride_dod, BLOCK_M, BLOCK_D, BLOCK_D2, CAUSAL, MASKED, USE_DESCRIPTOR)
    return dk, dv, dk2, dv2


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
    CAUSAL: tl.constexpr, USE_DESCRIPTOR: tl.constexpr, VEC: tl.constexpr = 1, BLOCK_D2: tl.constexpr = 0,
    GROUP_SPLIT: tl.constexpr = 1, HEAVY_FIRST: tl.constexpr = False,
):
    (head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
     stride_vb, stride_vh, stride_vs, v_head_stride, stride_dob, stride_doh, stride_dos,
     do_head_stride) = inputs_on_vectors(
        head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
        stride_vb, stride_vh, stride_vs, v_head_stride, stride_dob, stride_doh, stride_dos, do_head_stride, VEC)
    n_heads_kv = n_heads_q // group
    # The grid is (key blocks, KV programs), or with HEAVY_FIRST (KV programs, key blocks): every
    # program of the first key block (under a causal mask the one with the most queries) launches
    # before any of the next.
    block_axis: tl.constexpr = 1 if HEAVY_FIRST else 0
    start_n = tl.program_id(block_axis) * BLOCK_N
    # GROUP_SPLIT programs share a key block's group, each summing group / GROUP_SPLIT query heads
    # into float32 partials of its own (row kv_bh * GROUP_SPLIT + part): attention_backward_sum_parts_kernel sums them.
    out_rows = tl.program_id(1 - block_axis)  # kv_bh, or its part's row of the partials
    kv_bh = out_rows // GROUP_SPLIT
    part = out_rows % GROUP_SPLIT
    heads_per_part = group // GROUP_SPLIT
    b = kv_bh // n_heads_kv
    h_kv = kv_bh % n_heads_kv
    cols = start_n + tl.arange(0, BLOCK_N)

    desc_q, desc_k, desc_v, desc_do, desc_q2, desc_k2, desc_v2, desc_do2 = input_descriptors(
        q_ptr, k_ptr, v_ptr, do_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
        q_head_stride, k_head_stride, v_head_stride, do_head_stride, stride_qs, stride_ks, stride_vs, stride_dos,
        BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_D2, USE_DESCRIPTOR)
    k_base, v_base = key_value_bases(k_ptr, v_ptr, b, h_kv, stride_kb, stride_kh, stride_vb, stride_vh)
    k = load_tile(desc_k, k_base, kv_bh, start_n, n_keys, stride_ks, stride_kd, head_dim, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    v = load_tile(desc_v, v_base, kv_bh, start_n, n_keys, stride_vs, stride_vd, head_dim, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    if BLOCK_D2 > 0:
        k2 = load_part(desc_k2, k_base, kv_bh, start_n, n_keys, stride_ks, stride_kd, head_dim, BLOCK_D,
                       BLOCK_N, BLOCK_D2, USE_DESCRIPTOR)
        v2 = load_part(desc_v2, v_base, kv_bh, start_n, n_keys, stride_vs, stride_vd, head_dim, BLOCK_D,
                       BLOCK_N, BLOCK_D2, USE_DESCRIPTOR)
        dk2 = tl.zeros([BLOCK_N, BLOCK_D2], tl.float32)
        dv2 = tl.zeros([BLOCK_N, BLOCK_D2], tl.float32)
    else:  # placeholders the steps never read or update
        k2 = k
        v2 = v
        dk2 = dk
        dv2 = dv

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
    # The GQA sum over the group (or this part of it): query heads one after another, in a fixed order.
    for g in range(part * heads_per_part, (part + 1) * heads_per_part):
        h = h_kv * group + g
        bh = b * n_heads_q + h
        q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        do_base = do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        if CAUSAL:
            dk, dv, dk2, dv2 = dkdv_query_blocks(
                dk, dv, dk2, dv2, k, v, k2, v2, desc_q, desc_do, desc_q2, desc_do2, q_base, do_base, lse_ptr,
                delta_ptr, bh, cols, masked_start, full_start, n_queries, n_keys, head_dim, qk_scale, causal_offset,
                stride_qs, stride_qd, stride_dos, stride_dod, BLOCK_M, BLOCK_D, BLOCK_D2, CAUSAL, True, USE_DESCRIPTOR)
        dk, dv, dk2, dv2 = dkdv_query_blocks(
            dk, dv, dk2, dv2, k, v, k2, v2, desc_q, desc_do, desc_q2, desc_do2, q_base, do_base, lse_ptr,
            delta_ptr, bh, cols, full_start, q_stop, n_queries, n_keys, head_dim, qk_scale, causal_offset,
            stride_qs, stride_qd, stride_dos, stride_dod, BLOCK_M, BLOCK_D, BLOCK_D2, CAUSAL, False, USE_DESCRIPTOR)
    store_key_value_gradients(dk, dv, dk_ptr, dv_ptr, batch, n_heads_kv * GROUP_SPLIT, out_rows, start_n, n_keys,
                              head_dim, scale, 0, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    if BLOCK_D2 > 0:
        store_key_value_gradients(dk2, dv2, dk_ptr, dv_ptr, batch, n_heads_kv * GROUP_SPLIT, out_rows, start_n,
                                  n_keys, head_dim, scale, BLOCK_D, BLOCK_N, BLOCK_D2, USE_DESCRIPTOR)


@triton.jit
def attention_backward_sum_parts_kernel(dk_parts_ptr, dv_parts_ptr, dk_ptr, dv_ptr, head_size,
                                        SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    # dK and dV of one KV head (a program's BLOCK of its keys x head dim): the SPLIT float32 partials
    # of its group's parts (rows kv_bh * SPLIT + part) added in the parts' order, rounded once.
    kv_bh = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < head_size
    src = kv_bh * SPLIT * head_size + offs
    dk = tl.zeros([BLOCK], tl.float32)
    dv = tl.zeros([BLOCK], tl.float32)
    for part in tl.static_range(SPLIT):
        dk += tl.load(dk_parts_ptr + src + part * head_size, mask=mask, other=0.0)
        dv += tl.load(dv_parts_ptr + src + part * head_size, mask=mask, other=0.0)
    tl.store(dk_ptr + kv_bh * head_size + offs, dk.to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + kv_bh * head_size + offs, dv.to(dv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def dq_key_blocks(dq, dq2, q, q2, do, do2, lse2, delta, desc_k, desc_v, desc_k2, desc_v2, k_base, v_base, kv_bh, rows,
                  start_n, stop_n, n_keys, head_dim, qk_scale, causal_offset,
                  stride_ks, stride_kd, stride_vs, stride_vd,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr, CAUSAL: tl.constexpr,
                  MASKED: tl.constexpr, USE_DESCRIPTOR: tl.constexpr):
    for block_start in tl.range(start_n, stop_n, BLOCK_N):
        k = load_tile(desc_k, k_base, kv_bh, block_start, n_keys, stride_ks, stride_kd, head_dim,
                      BLOCK_N, BLOCK_D, USE_DESCRIPTOR)  # [N, D]
        v = load_tile(desc_v, v_base, kv_bh, block_start, n_keys, stride_vs, stride_vd, head_dim,
                      BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
        s = mma(q, tl.trans(k), None)  # [M, N]
        if BLOCK_D2 > 0:
            k2 = load_part(desc_k2, k_base, kv_bh, block_start, n_keys, stride_ks, stride_kd, head_dim, BLOCK_D,
                           BLOCK_N, BLOCK_D2, USE_DESCRIPTOR)
            s = mma(q2, tl.trans(k2), s)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            cols = block_start + tl.arange(0, BLOCK_N)
            p = tl.where(visible(rows, cols, n_keys, causal_offset, CAUSAL, False), p, 0.0)
        dp = mma(do, tl.trans(v), None)
        if BLOCK_D2 > 0:
            v2 = load_part(desc_v2, v_base, kv_bh, block_start, n_keys, stride_vs, stride_vd, head_dim, BLOCK_D,
                           BLOCK_N, BLOCK_D2, USE_DESCRIPTOR)
            dp = mma(do2, tl.trans(v2), dp)
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(k.dtype), k, dq)
        if BLOCK_D2 > 0:
            dq2 = mma(ds.to(k2.dtype), k2, dq2)
    return dq, dq2


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
    CAUSAL: tl.constexpr, USE_DESCRIPTOR: tl.constexpr, VEC: tl.constexpr = 1, BLOCK_D2: tl.constexpr = 0,
    HEAVY_FIRST: tl.constexpr = False,
):
    (head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
     stride_vb, stride_vh, stride_vs, v_head_stride, stride_dob, stride_doh, stride_dos,
     do_head_stride) = inputs_on_vectors(
        head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
        stride_vb, stride_vh, stride_vs, v_head_stride, stride_dob, stride_doh, stride_dos, do_head_stride, VEC)
    n_heads_kv = n_heads_q // group
    start_m, bh, b, h, h_kv, kv_bh = query_program(n_heads_q, group, BLOCK_M, CAUSAL, HEAVY_FIRST)

    desc_q, desc_k, desc_v, desc_do, desc_q2, desc_k2, desc_v2, desc_do2 = input_descriptors(
        q_ptr, k_ptr, v_ptr, do_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
        q_head_stride, k_head_stride, v_head_stride, do_head_stride, stride_qs, stride_ks, stride_vs, stride_dos,
        BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_D2, USE_DESCRIPTOR)
    desc_dq = own_descriptor(dq_ptr, batch * n_heads_q, n_queries, head_dim, BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    do_base = do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    k_base, v_base = key_value_bases(k_ptr, v_ptr, b, h_kv, stride_kb, stride_kh, stride_vb, stride_vh)

    rows = start_m + tl.arange(0, BLOCK_M)
    q = load_tile(desc_q, q_base, bh, start_m, n_queries, stride_qs, stride_qd, head_dim, BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    do = load_tile(desc_do, do_base, bh, start_m, n_queries, stride_dos, stride_dod, head_dim,
                   BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    lse2, delta = load_row_stats(lse_ptr, delta_ptr, bh, rows, n_queries)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if BLOCK_D2 > 0:
        q2 = load_part(desc_q2, q_base, bh, start_m, n_queries, stride_qs, stride_qd, head_dim, BLOCK_D,
                       BLOCK_M, BLOCK_D2, USE_DESCRIPTOR)
        do2 = load_part(desc_do2, do_base, bh, start_m, n_queries, stride_dos, stride_dod, head_dim, BLOCK_D,
                        BLOCK_M, BLOCK_D2, USE_DESCRIPTOR)
        dq2 = tl.zeros([BLOCK_M, BLOCK_D2], tl.float32)
    else:  # placeholders the key blocks never read or update
        q2 = q
        do2 = do
        dq2 = dq
    full_stop, stop = key_ranges(start_m, n_keys, causal_offset, BLOCK_M, BLOCK_N, CAUSAL)
    dq, dq2 = dq_key_blocks(dq, dq2, q, q2, do, do2, lse2, delta, desc_k, desc_v, desc_k2, desc_v2, k_base, v_base,
                            kv_bh, rows, 0, full_stop, n_keys, head_dim, qk_scale, causal_offset,
                            stride_ks, stride_kd, stride_vs, stride_vd, BLOCK_N, BLOCK_D, BLOCK_D2, CAUSAL, False,
                            USE_DESCRIPTOR)
    dq, dq2 = dq_key_blocks(dq, dq2, q, q2, do, do2, lse2, delta, desc_k, desc_v, desc_k2, desc_v2, k_base, v_base,
                            kv_bh, rows, full_stop, stop, n_keys, head_dim, qk_scale, causal_offset,
                            stride_ks, stride_kd, stride_vs, stride_vd, BLOCK_N, BLOCK_D, BLOCK_D2, CAUSAL, True,
                            USE_DESCRIPTOR)
    dq_base = dq_ptr + bh.to(tl.int64) * n_queries * head_dim
    store_tile(desc_dq, dq_base, bh, start_m, n_queries, head_dim, head_dim, (dq * scale).to(dq_ptr.dtype.element_ty),
               BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    if BLOCK_D2 > 0:
        desc_dq2 = own_descriptor(dq_ptr, batch * n_heads_q, n_queries, head_dim, BLOCK_M, BLOCK_D2, USE_DESCRIPTOR)
        store_part(desc_dq2, dq_base, bh, start_m, n_queries, head_dim, head_dim,
                   (dq2 * scale).to(dq_ptr.dtype.element_ty), BLOCK_D, BLOCK_M, BLOCK_D2, USE_DESCRIPTOR)


@triton.jit(do_not_specialize=COUNT_ARGS)
def attention_backward_fused_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, lse_ptr, dq_ptr, dk_ptr, dv_ptr,
    n_heads_q, group, batch, n_queries, n_keys, head_dim,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_dob, stride_doh, stride_dos, stride_dod,
    q_head_stride, k_head_stride, v_head_stride, do_head_stride,
    qk_scale, scale, causal_offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, USE_DESCRIPTOR: tl.constexpr, VEC: tl.constexpr = 1,
):
    (head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
     stride_vb, stride_vh, stride_vs, v_head_stride, stride_dob, stride_doh, stride_dos,
     do_head_stride) = inputs_on_vectors(
        head_dim, stride_qb, stride_qh, stride_qs, q_head_stride, stride_kb, stride_kh, stride_ks, k_head_stride,
        stride_vb, stride_vh, stride_vs, v_head_stride, stride_dob, stride_doh, stride_dos, do_head_stride, VEC)
    # The whole backward of a KV head whose keys fit one block (BLOCK_N >= n_keys): delta, dK, dV
    # and dQ in one program, one launch where the split backward takes three. With a single key
    # block, dQ of a query block is complete after one product (dS K): no accumulation across
    # programs, so no atomics, and dK and dV sum over the group's query heads in a fixed order.
    n_heads_kv = n_heads_q // group
    kv_bh = tl.program_id(0)
    b = kv_bh // n_heads_kv
    h_kv = kv_bh % n_heads_kv
    cols = tl.arange(0, BLOCK_N)

    desc_q, desc_k, desc_v, desc_do = part_descriptors(
        q_ptr, k_ptr, v_ptr, do_ptr, batch, n_heads_q, n_heads_kv, n_queries, n_keys, head_dim,
        q_head_stride, k_head_stride, v_head_stride, do_head_stride, stride_qs, stride_ks, stride_vs, stride_dos,
        BLOCK_M, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    desc_o = own_descriptor(o_ptr, batch * n_heads_q, n_queries, head_dim, BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    desc_dq = own_descriptor(dq_ptr, batch * n_heads_q, n_queries, head_dim, BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    k_base, v_base = key_value_bases(k_ptr, v_ptr, b, h_kv, stride_kb, stride_kh, stride_vb, stride_vh)
    k = load_tile(desc_k, k_base, kv_bh, 0, n_keys, stride_ks, stride_kd, head_dim, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    v = load_tile(desc_v, v_base, kv_bh, 0, n_keys, stride_vs, stride_vd, head_dim, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for g in range(0, group):
        h = h_kv * group + g
        bh = b * n_heads_q + h
        q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        do_base = do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        o_base = o_ptr + bh.to(tl.int64) * n_queries * head_dim
        dq_base = dq_ptr + bh.to(tl.int64) * n_queries * head_dim
        # Every query block, those that see no key too: their dQ rows are written as zeros (P = 0).
        for start_m in tl.range(0, n_queries, BLOCK_M, num_stages=1):
            rows = start_m + tl.arange(0, BLOCK_M)
            q = load_tile(desc_q, q_base, bh, start_m, n_queries, stride_qs, stride_qd, head_dim,
                          BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
            do = load_tile(desc_do, do_base, bh, start_m, n_queries, stride_dos, stride_dod, head_dim,
                           BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
            o = load_tile(desc_o, o_base, bh, start_m, n_queries, head_dim, 1, head_dim,
                          BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # as the delta kernel's
            lse = tl.load(lse_ptr + bh.to(tl.int64) * n_queries + rows, mask=rows < n_queries, other=float("inf"))
            lse2 = tl.where(lse == NEG_INF, float("inf"), lse * 1.4426950408889634)  # as load_row_stats
            p_t = tl.math.exp2(mma(k, tl.trans(q), None) * qk_scale - lse2[None, :])  # [N, M]
            p_t = tl.where(tl.trans(visible(rows, cols, n_keys, causal_offset, CAUSAL, False)), p_t, 0.0)
            dv = mma(p_t.to(do.dtype), do, dv)
            dp_t = mma(v, tl.trans(do), None)
            ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
            dk = mma(ds_t, q, dk)
            dq = mma(tl.trans(ds_t), k, None)  # [M, D]: every key's share, the row's whole dQ
            store_tile(desc_dq, dq_base, bh, start_m, n_queries, head_dim, head_dim,
                       (dq * scale).to(dq_ptr.dtype.element_ty), BLOCK_M, BLOCK_D, USE_DESCRIPTOR)
    store_key_value_gradients(dk, dv, dk_ptr, dv_ptr, batch, n_heads_kv, kv_bh, 0, n_keys, head_dim, scale,
                              0, BLOCK_N, BLOCK_D, USE_DESCRIPTOR)
