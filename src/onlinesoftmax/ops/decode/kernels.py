"""Flash-decoding: attention of a few new queries against a long KV cache, split along the keys.

A decode step has 1-16 queries per sequence and thousands of keys, so one program per (sequence,
head) leaves most of the GPU idle while a few programs walk the whole cache. Here the keys of each
sequence are cut into splits; each program computes the attention of its KV head's query rows over
one split and writes a partial output with its log-sum-exp, and a second launch merges the
partials of each row with the (m, d) operator in log-sum-exp form:

    lse = M + log(sum_i exp(lse_i - M)),   out = sum_i exp(lse_i - lse) out_i,   M = max_i lse_i.

Bytes, per call: every visible key and value is read once (GQA: a KV head's Hq/Hkv query heads
are the rows of one program's tile, so no K/V byte is read twice); q is read once per split, and
each split of a sequence writes (rows x (D + 1)) fp32 partials that the merge reads back once.
The planner keeps the partials a small fraction of the K/V bytes (``plan.PARTIAL_BYTES_FRACTION``).

Splits are assigned on the device: ``sequence_splits`` reads the batch's lengths (``cache_seqlens``
lives on the GPU; reading it on the host would be a sync) and gives sequence ``b`` a number of
splits proportional to its length, so a batch mixing one long sequence with many short ones keeps
every program's key range about equal. Programs are numbered by a flat slot over the batch's
splits (prefix sums over the lengths); the grid is sized for the most splits the lengths can ask
for, and the programs beyond the batch's total exit at once. A sequence with a single split writes
the final output directly; the merge launch skips it.

Every program's partial is a fixed function of its key range and the merge folds a row's splits in
one fixed order, so results are bitwise reproducible run to run.
"""

from __future__ import annotations


import triton
import triton.language as tl

from ..._triton import NEG_INF, dependent_start, max_keep_nan, mma, nan_max, strides_on_vectors

LOG2E = 1.4426950408889634  # scores go to exp2 as scale * log2(e) * q.k
LN2 = tl.constexpr(0.6931471805599453)  # lse in log2 units times ln 2: natural-log lse


@triton.jit
def pick(values, index, at):
    # values[at] of a 1-D tile, as a scalar (tiles are not indexable).
    return tl.sum(tl.where(index == at, values, 0), 0)


# --------------------------------------------------------------------------------------------
# How many splits each sequence gets (shared by the split kernel and the merge)
# --------------------------------------------------------------------------------------------


@triton.jit
def sequence_splits(seqlens_ptr, stride_seqlens, batch, capacity, min_chunk_blocks, target_splits, num_splits,
                    BLOCK_N: tl.constexpr, BATCH_POW2: tl.constexpr, HAS_SEQLENS: tl.constexpr,
                    AUTO: tl.constexpr):
    """Per sequence: its length (clamped to [0, capacity], so a bad length never reads outside the
    cache or its block table), its key blocks, its splits (at least 1: an empty sequence still has
    a program, which writes its zeros), and the end of its splits in the flat slot order.

    AUTO: one chunk size for the whole batch, the total key blocks over ``target_splits`` (at
    least ``min_chunk_blocks``), so splits have about equal work whatever the lengths. Otherwise
    each sequence is cut into ``num_splits`` (fewer if it has fewer blocks).
    """
    index = tl.arange(0, BATCH_POW2)
    in_batch = index < batch
    if HAS_SEQLENS:
        lens = tl.load(seqlens_ptr + index * stride_seqlens, mask=in_batch, other=0)
        lens = tl.minimum(tl.maximum(lens, 0), capacity)
    else:
        lens = tl.where(in_batch, capacity, 0)
    blocks = tl.cdiv(lens, BLOCK_N)
    if AUTO:
        chunk = tl.maximum(tl.cdiv(tl.sum(blocks, 0), target_splits), min_chunk_blocks)
        splits = tl.cdiv(blocks, chunk)
    else:
        splits = tl.minimum(blocks, num_splits)
    splits = tl.where(in_batch, tl.maximum(splits, 1), 0)
    return index, lens, blocks, splits, tl.cumsum(splits, 0)


# --------------------------------------------------------------------------------------------
# Split kernel: one program per (KV head, row block, split)
# --------------------------------------------------------------------------------------------


@triton.jit
def key_rows(table_row, stride_tp, start, keys, key_ok, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """(page, row in page) of keys [start, start + BLOCK_N): the page is a scalar when the block
    lies in one page (one block-table read per block), a [BLOCK_N] vector when pages are smaller
    than the block (one read per key, all from one cache line of the table). PAGE_SIZE 0: a
    contiguous cache, where the "page" is the sequence itself (the caller adds it)."""
    if PAGE_SIZE == 0:
        page = 0
        row = keys
    elif PAGE_SIZE % BLOCK_N == 0:
        page = tl.load(table_row + (start // PAGE_SIZE) * stride_tp).to(tl.int64)
        row = start % PAGE_SIZE + tl.arange(0, BLOCK_N)
    else:
        page = tl.load(table_row + (keys // PAGE_SIZE) * stride_tp, mask=key_ok, other=0).to(tl.int64)
        row = keys % PAGE_SIZE
    return page, row.to(tl.int64)


# Lengths and counts that vary from call to call in serving (batch size, the planner's split
# numbers) are not specialized by value: Triton would otherwise compile again for each of them
# equal to 1 or divisible by 16, while the tiles are bounded by masks either way.
COUNT_ARGS = ["batch", "capacity", "min_chunk_blocks", "target_splits", "num_splits",
              "stride_seqlens", "stride_tb", "stride_tp"]


@triton.jit(do_not_specialize=COUNT_ARGS)
def decode_split_kernel(
    q_ptr, k_ptr, v_ptr, seqlens_ptr, table_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_offset,
    batch, group, n_queries, capacity, min_chunk_blocks, target_splits, num_splits,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_seqlens, stride_tb, stride_tp,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
    qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BATCH_POW2: tl.constexpr, CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr,
    SPLIT: tl.constexpr, AUTO: tl.constexpr, WRITE_LSE: tl.constexpr, VEC: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr,
):
    """Grid (KV heads x row blocks, slots). A program's rows are its KV head's query heads x queries,
    ``row = query * group + head in group``; a row block holds BLOCK_M of them.

    The cache is addressed as (page, row in page, KV head, dim): a paged cache's pages come from
    ``table_ptr`` (B x max_blocks), a contiguous cache is one page per sequence (stride_kp is its
    batch stride). SPLIT False: program (.., b) covers sequence b whole and writes the output; SPLIT
    True: program (.., slot) covers one split and writes a partial unless its sequence has one split.
    VEC: the strides are known multiples of it (_launch.vector_width: a head dim such as 72 whose
    rows are whole 16-byte vectors, which Triton's specialization cannot see), so that rows of q, K,
    V and the output move 16 bytes at a time. LAUNCH_DEPENDENTS: the merge, launched
    programmatically dependent, may be scheduled from the start (it waits for this kernel).
    """
    dependent_start(False, LAUNCH_DEPENDENTS)
    stride_qb, stride_qs, stride_qh, _ = strides_on_vectors(stride_qb, stride_qs, stride_qh, 0, VEC)
    stride_kp, stride_ks, stride_kh, _ = strides_on_vectors(stride_kp, stride_ks, stride_kh, 0, VEC)
    stride_vp, stride_vs, stride_vh, _ = strides_on_vectors(stride_vp, stride_vs, stride_vh, 0, VEC)
    stride_ob, stride_os, stride_oh, _ = strides_on_vectors(stride_ob, stride_os, stride_oh, 0, VEC)
    n_rows = group * n_queries
    row_blocks = tl.cdiv(n_rows, BLOCK_M)
    h_kv = tl.program_id(0) // row_blocks
    row_block = tl.program_id(0) % row_blocks
    slot = tl.program_id(1)
    n_heads_kv = tl.num_programs(0) // row_blocks

    if SPLIT:
        index, lens, blocks, splits, ends = sequence_splits(
            seqlens_ptr, stride_seqlens, batch, capacity, min_chunk_blocks, target_splits, num_splits,
            BLOCK_N, BATCH_POW2, HAS_SEQLENS, AUTO)
        if slot >= tl.sum(splits, 0):
            return  # the grid is sized for the most splits any lengths could ask for
        b = tl.sum((ends <= slot).to(tl.int32), 0)
        seq_len = pick(lens, index, b)
        seq_blocks = pick(blocks, index, b)
        seq_splits = pick(splits, index, b)
        split = slot - (pick(ends, index, b) - seq_splits)
        # Whole blocks, as evenly as they divide: no split of a sequence is empty.
        key_lo = (split * seq_blocks // seq_splits) * BLOCK_N
        key_hi = ((split + 1) * seq_blocks // seq_splits) * BLOCK_N
    else:
        b = slot
        seq_splits = 1
        if HAS_SEQLENS:
            seq_len = tl.minimum(tl.maximum(tl.load(seqlens_ptr + b * stride_seqlens), 0), capacity)
        else:
            seq_len = capacity
        key_lo = 0
        key_hi = seq_len

    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    query = rows // group
    head = h_kv * group + rows % group
    # Bottom-right causal: query i of n_queries sees keys j <= seq_len - n_queries + i.
    if CAUSAL:
        row_stop = seq_len - n_queries + 1 + query
    else:
        row_stop = tl.zeros([BLOCK_M], tl.int32) + seq_len
    row_stop = tl.minimum(row_stop, key_hi)
    key_stop = tl.max(tl.where(row_ok, row_stop, 0), 0)  # no key past what some row sees is read

    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < HEAD_DIM
    b64 = b.to(tl.int64)
    q = tl.load(q_ptr + b64 * stride_qb + query[:, None] * stride_qs + head[:, None] * stride_qh
                + cols[None, :] * stride_qd, mask=row_ok[:, None] & col_ok[None, :], other=0.0)  # [M, D]
    k_head = k_ptr + h_kv.to(tl.int64) * stride_kh + cols[None, :] * stride_kd
    v_head = v_ptr + h_kv.to(tl.int64) * stride_vh + cols[None, :] * stride_vd
    if PAGE_SIZE == 0:
        k_head += b64 * stride_kp
        v_head += b64 * stride_vp
    table_row = table_ptr + b64 * stride_tb

    m_i = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in tl.range(key_lo, key_stop, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < key_stop
        page, row = key_rows(table_row, stride_tp, start, keys, key_ok, PAGE_SIZE, BLOCK_N)
        kv_mask = key_ok[:, None] & col_ok[None, :]
        # Masked keys load as zeros: past the sequence the cache may hold anything, NaN included,
        # and a NaN value row would survive its zero probability in p @ v.
        k = tl.load(k_head + (page * stride_kp + row * stride_ks)[:, None], mask=kv_mask, other=0.0)  # [N, D]
        qk = mma(q, tl.trans(k), None)  # [M, N]
        qk = tl.where(keys[None, :] < row_stop[:, None], qk, NEG_INF)
        # scale > 0: the scaled maximum is the maximum scaled, and scaling and subtracting fuse.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        # A row with no visible key yet keeps m = -inf; measuring from 0 keeps exp2(-inf - -inf)
        # = NaN out of p and alpha (both 0).
        m_ref = tl.where(m_new == NEG_INF, 0.0, m_new)
        p = tl.math.exp2(qk * qk_scale - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + (page * stride_vp + row * stride_vs)[:, None], mask=kv_mask, other=0.0)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    # A row that saw no key (an empty sequence, or causal with more queries than keys) gives zeros
    # and lse -inf, never NaN.
    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    out = acc * tl.where(has_keys, 1.0 / l_safe, 0.0)[:, None]
    lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * LN2, NEG_INF)
    if seq_splits == 1:
        o_rows = b64 * stride_ob + query.to(tl.int64) * stride_os + head * stride_oh
        tl.store(out_ptr + o_rows[:, None] + cols[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])
        if WRITE_LSE:
            tl.store(lse_ptr + b64 * stride_lb + head * stride_lh + query * stride_ls, lse, mask=row_ok)
    else:
        # Partials: (slot, KV head, row) rows of HEAD_DIM fp32, then (part_lse_offset elements on, in
        # the same buffer: one allocation and no view a call) one lse per row.
        part_rows = (slot.to(tl.int64) * n_heads_kv + h_kv) * n_rows + rows
        tl.store(part_out_ptr + part_rows[:, None] * HEAD_DIM + cols[None, :], out,
                 mask=row_ok[:, None] & col_ok[None, :])
        tl.store(part_out_ptr + part_lse_offset + part_rows, lse, mask=row_ok)


# --------------------------------------------------------------------------------------------
# Merge: the body shared by the decode merge and the public merge_attention
# --------------------------------------------------------------------------------------------


@triton.jit
def merge_partials(out_ptr, lse_ptr, out_rows, lse_rows, row_ok, col_offs, col_ok, out_part_stride,
                   lse_part_stride, part_lo, part_hi,
                   BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    """(out, lse) of BLOCK_R rows from their partials part_lo .. part_hi - 1, in that order.

    Partial i of a row is at ``out_ptr + i * out_part_stride + out_rows + col_offs`` with its lse at
    ``lse_ptr + i * lse_part_stride + lse_rows``. BLOCK_P partials are read at a time and folded
    into running (m, total, acc) with the (m, d) operator, which makes the order fixed for a given
    BLOCK_P. A partial with lse -inf weighs 0 and its output is not read (it may hold anything);
    all empty gives zeros and -inf; a NaN lse or a NaN in a weighed output propagates.
    """
    parts = tl.arange(0, BLOCK_P)
    m = tl.full([BLOCK_R], NEG_INF, tl.float32)
    total = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for first in range(part_lo, part_hi, BLOCK_P):
        part = (first + parts).to(tl.int64)
        ok = row_ok[:, None] & (part < part_hi)[None, :]  # [R, P]
        lse = tl.load(lse_ptr + part[None, :] * lse_part_stride + lse_rows[:, None], mask=ok,
                      other=NEG_INF).to(tl.float32)
        m_new = nan_max(m, max_keep_nan(lse, 1))
        m_ref = tl.where(m_new == NEG_INF, 0.0, m_new)
        alpha = tl.exp(m - m_ref)
        weight = tl.exp(lse - m_ref[:, None])  # [R, P]
        read = (ok & (lse != NEG_INF))[:, :, None] & col_ok[None, None, :]
        o = tl.load(out_ptr + part[None, :, None] * out_part_stride + out_rows[:, None, None]
                    + col_offs[None, None, :], mask=read, other=0.0).to(tl.float32)  # [R, P, D]
        acc = acc * alpha[:, None] + tl.sum(weight[:, :, None] * o, 1)
        total = total * alpha + tl.sum(weight, 1)
        m = m_new
    # total == 0 only when every partial was empty (a NaN total is not 0 and propagates).
    empty = total == 0.0
    total = tl.where(empty, 1.0, total)
    out = tl.where(empty[:, None], 0.0, acc / total[:, None])
    lse = tl.where(empty, NEG_INF, tl.where(m == NEG_INF, 0.0, m) + tl.log(total))
    return out, lse


@triton.jit(do_not_specialize=COUNT_ARGS)
def decode_merge_kernel(
    part_out_ptr, part_lse_offset, seqlens_ptr, out_ptr, lse_ptr,
    batch, group, n_queries, n_heads_q, capacity, min_chunk_blocks, target_splits, num_splits,
    stride_seqlens, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, BATCH_POW2: tl.constexpr, HAS_SEQLENS: tl.constexpr, AUTO: tl.constexpr,
    WRITE_LSE: tl.constexpr, VEC: tl.constexpr, WAIT: tl.constexpr,
):
    """Grid (row blocks of n_queries x n_heads_q output rows, head-dim blocks, batch). Finds its
    sequence's slots as the split kernel did and merges them; a one-split sequence was written by
    the split kernel, and its programs return at once. VEC as for the split kernel. WAIT: launched
    programmatically dependent on the split kernel (_launch.dependent_launch), it waits for it."""
    dependent_start(WAIT, False)
    stride_ob, stride_os, stride_oh, _ = strides_on_vectors(stride_ob, stride_os, stride_oh, 0, VEC)
    b = tl.program_id(2)
    index, lens, blocks, splits, ends = sequence_splits(
        seqlens_ptr, stride_seqlens, batch, capacity, min_chunk_blocks, target_splits, num_splits,
        BLOCK_N, BATCH_POW2, HAS_SEQLENS, AUTO)
    seq_splits = pick(splits, index, b)
    if seq_splits <= 1:
        return
    first_slot = pick(ends, index, b) - seq_splits

    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # row = query * n_heads_q + head
    row_ok = rows < n_queries * n_heads_q
    query = rows // n_heads_q
    head = rows % n_heads_q
    # The split kernel's partial row of (query, head): (KV head, query * group + head in group).
    part_rows = (head // group) * (group * n_queries) + query * group + head % group
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < HEAD_DIM
    slot_rows = n_heads_q * n_queries
    out, lse = merge_partials(part_out_ptr, part_out_ptr + part_lse_offset, part_rows.to(tl.int64) * HEAD_DIM,
                              part_rows, row_ok,
                              cols, col_ok, slot_rows * HEAD_DIM, slot_rows, first_slot, first_slot + seq_splits,
                              BLOCK_R, BLOCK_P, BLOCK_D)
    b64 = b.to(tl.int64)
    o_rows = b64 * stride_ob + query.to(tl.int64) * stride_os + head * stride_oh
    tl.store(out_ptr + o_rows[:, None] + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])
    if WRITE_LSE:
        tl.store(lse_ptr + b64 * stride_lb + head * stride_lh + query * stride_ls, lse,
                 mask=row_ok & (tl.program_id(1) == 0))


@triton.jit(do_not_specialize=["n_parts", "n_rows"])
def merge_attention_kernel(
    outs_ptr, lses_ptr, out_ptr, lse_ptr, n_parts, n_rows,
    stride_on, stride_or, stride_od, stride_ln, stride_lr,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """merge_attention: grid (row blocks, head-dim blocks) over partials (n_parts, n_rows, HEAD_DIM)
    and lses (n_parts, n_rows), any strides; out (n_rows, HEAD_DIM) and lse (n_rows) contiguous."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < HEAD_DIM
    out, lse = merge_partials(outs_ptr, lses_ptr, rows64 * stride_or, rows64 * stride_lr, row_ok,
                              cols.to(tl.int64) * stride_od, col_ok, stride_on, stride_ln, 0, n_parts,
                              BLOCK_R, BLOCK_P, BLOCK_D)
    tl.store(out_ptr + rows64[:, None] * HEAD_DIM + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])
    tl.store(lse_ptr + rows64, lse, mask=row_ok & (tl.program_id(1) == 0))
