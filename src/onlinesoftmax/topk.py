"""Fused softmax + top-k (seed 001, "Softmax and TopK fusion"): kernels, launchers, custom ops,
autograd, public function.

One read of x per row: each program streams its columns in blocks, keeping the online normalizer
(m, d) per lane and a running list of the K_POW2 best candidates. Unfused, torch reads x, writes
and re-reads the probabilities, and sorts: 3 passes over V elements plus the sort's traffic.

Candidates are packed 64-bit keys: the high word is the float's bits made order-preserving as a
signed int32, the low word is ``2**31 - 1 - column``, so integer comparison orders by value and
then prefers the lower column (ties: the lower index wins). The list stays sorted descending;
its k-th key is the threshold. The common block costs the online update, one max reduction and
one compare against the threshold. A block holding elements above it (survivors) hands them to
the list as a sorted list: short lists (k <= 16) take the best survivors one at a time, longer
ones pack up to K_POW2 survivors by a prefix sum through scratch and sort them; a block with more
survivors than that takes its ``tl.topk``. The list absorbs a sorted list by a bitonic merge (the
elementwise max of the list and the other list reversed is the top K_POW2 of the union, and
bitonic).

The plan's default, a lane selection, skips that per-block work (``lane_keep=0`` forces the
running list): the stream keeps, per lane, only the online (m, d), the lane's best one or two
elements and the best of the rest (elementwise selects, no reduction or branch per block); the
list is the top k of what the lanes kept. That is the chunk's top k unless some lane holds more
of them than it kept, which a runner-up at or above the k-th value reveals; then the chunk is
streamed again into the running list above, where only elements at or above the lanes' k-th
value (a lower bound of the chunk's k-th) can enter, one by one (a second read). The plan keeps
one per lane on short chunks at k <= 16 and at every k above 64 (the list is then one tl.topk
over the lanes' best), two otherwise (up to k = 64, plan.TOPK_LANE_KEEP2_MAX_K), where a second
read would cost the launch's tail. A second read may instead load only the suspect lanes' other
elements and insert those into the kept list (plan.TopkPlan.second_read = "lanes"), which the
plan chooses where second reads are common: keeping one per lane, or two at k > 16
(plan.TOPK_CHUNK_READ_MAX_K).

Few rows ("split"): each row is cut into chunks whose (m, d) and candidate lists go to scratch,
and a second launch merges them per row with fixed-order reductions (deterministic: no atomics).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from . import _buffers, cpu, plan as planner
from ._launch import Launcher, aligned, op_when_compiling
from ._triton import NEG_INF, col_offset, finish_lse, load_scaled, merge_normalizers, online_update

# Below every packed key of a real element (whose low word is at least 2**31 - 1 - column > 0).
EMPTY_KEY = tl.constexpr(-(2 ** 63))
MAX_COLS = 2 ** 31 - 1

# --------------------------------------------------------------------------------------------
# Key packing and the candidate list
# --------------------------------------------------------------------------------------------


@triton.jit
def pack_keys(x, cols):
    # -0.0 and +0.0 must tie (then the lower index wins), so both become +0.0 first.
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # monotone in x as a signed int
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)


@triton.jit
def unpack_keys(keys):
    ordered = (keys >> 32).to(tl.int32)
    x = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    cols = 0x7FFFFFFF - (keys & 0x7FFFFFFF).to(tl.int32)
    return x, cols


@triton.jit
def list_threshold(candidates, k, K_POW2: tl.constexpr):
    # The list's k-th key (the list is sorted descending; the slots after k only pad it to a power
    # of two, and an element below the k-th best can never be chosen). "Filling" while the k-th
    # slot is empty, so that any element (even -inf) enters.
    kth = tl.max(tl.where(tl.arange(0, K_POW2) == k - 1, candidates, EMPTY_KEY), 0)
    threshold, _ = unpack_keys(kth)
    return threshold, kth == EMPTY_KEY


@triton.jit
def merge_sorted_lists(best_desc, other_asc):
    # max(a_i, b_i) of a descending and an ascending list is the top half of their union, and a
    # bitonic sequence: log2(K_POW2) compare-exchange stages sort it (a full sort takes ~log2^2 / 2).
    return tl.bitonic_merge(tl.maximum(best_desc, other_asc), descending=True)


@triton.jit
def write_topk(candidates, m, d, row, k, values_ptr, indices_ptr, lse_ptr, out_stride_row,
               K_POW2: tl.constexpr, WRITE_LSE: tl.constexpr):
    x, cols = unpack_keys(candidates)
    # torch.softmax gives an all-NaN row when the row holds NaN or +inf, or is all -inf; every
    # probability then ties, and the lower index wins: indices 0..k-1.
    nan_row = (m != m) | (m == float("inf")) | (m == NEG_INF)
    slot = tl.arange(0, K_POW2)
    values = tl.where(nan_row, float("nan"), tl.exp(x - m) / d)
    indices = tl.where(nan_row, slot, cols).to(tl.int64)
    out = row.to(tl.int64) * out_stride_row + slot
    tl.store(values_ptr + out, values.to(values_ptr.dtype.element_ty), mask=slot < k)
    tl.store(indices_ptr + out, indices, mask=slot < k)
    if WRITE_LSE:
        tl.store(lse_ptr + row, finish_lse(m, d))


# --------------------------------------------------------------------------------------------
# Forward kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def insert_one_by_one(candidates, keys, count, K_POW2: tl.constexpr):
    # The best ``count`` of ``keys`` enter the list one at a time: one max reduction and a
    # log2(K_POW2)-stage merge each (cheaper than a block top-k while count is small).
    slot = tl.arange(0, K_POW2)
    for _ in range(count):
        best = tl.max(keys, 0)
        candidates = merge_sorted_lists(candidates, tl.where(slot == K_POW2 - 1, best, EMPTY_KEY))
        keys = tl.where(keys == best, EMPTY_KEY, keys)
    return candidates


@triton.jit
def scan_survivors(x_row, start, stop, k, x_stride_col, inv_temperature, scratch, m, d, floor,
                   BLOCK: tl.constexpr, K_POW2: tl.constexpr, FEW_SURVIVORS: tl.constexpr,
                   COMPACT: tl.constexpr, CONTIGUOUS: tl.constexpr, UPDATE_NORMALIZER: tl.constexpr,
                   RESCAN: tl.constexpr):
    """Stream x[row, start:stop] keeping the exact sorted top-K_POW2 list (its first k entries
    exact); with UPDATE_NORMALIZER, also the per-lane online (m, d).

    RESCAN (the second read after the lanes' selection): only elements at or above ``floor``, a
    lower bound of the chunk's k-th value, can be chosen, so few survive, and they enter one by one.
    That leaves the compaction and block top-k code, and its registers, out of the lane kernels."""
    slot = tl.arange(0, K_POW2)
    candidates = tl.full([K_POW2], EMPTY_KEY, tl.int64)  # sorted descending
    threshold, filling = list_threshold(candidates, k, K_POW2)
    for block_start in range(start, stop, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        b_x = load_scaled(x_row, cols, x_stride_col, stop, inv_temperature, CONTIGUOUS)  # [BLOCK]
        if UPDATE_NORMALIZER:
            m, d = online_update(m, d, b_x)
        block_max = tl.max(b_x, 0)
        if RESCAN:
            enter = (block_max > threshold) | (filling & (block_max >= floor))
        else:
            enter = (block_max > threshold) | filling
        # Strict >: an equal value seen later has a higher index and loses the tie anyway.
        if enter:
            in_chunk = cols < stop
            if RESCAN:
                in_chunk = in_chunk & (b_x >= floor)
            survivors = tl.where(filling, in_chunk, (b_x > threshold) & in_chunk)
            keys = tl.where(survivors, pack_keys(b_x, cols), EMPTY_KEY)  # [BLOCK]
            n_survivors = tl.sum(survivors.to(tl.int32), 0)
            # COMPACT (long lists): blocks with at most K_POW2 survivors pack them into K_POW2
            # slots and merge once. Else (short lists) insert them one at a time.
            if RESCAN:
                few = True
            elif COMPACT:
                few = n_survivors <= K_POW2
            else:
                few = tl.minimum(n_survivors, k) <= FEW_SURVIVORS
            if few:
                if COMPACT and not RESCAN:
                    # A prefix sum gives each survivor its slot; the scatter and gather go through
                    # this program's scratch, between barriers; the few are sorted and merged.
                    slot_of = tl.cumsum(survivors.to(tl.int32), 0) - 1
                    tl.store(scratch + slot_of, keys, mask=survivors)
                    tl.debug_barrier()
                    packed = tl.load(scratch + slot, mask=slot < n_survivors, other=EMPTY_KEY)
                    tl.debug_barrier()  # every thread has read before the next block scatters
                    candidates = merge_sorted_lists(candidates, tl.sort(packed))
                else:
                    candidates = insert_one_by_one(candidates, keys, tl.minimum(n_survivors, k), K_POW2)
            else:
                # Many survivors (the first blocks): the block's own top-K_POW2 by a sorting network.
                candidates = merge_sorted_lists(candidates, tl.flip(tl.topk(keys, K_POW2), 0))
            threshold, filling = list_threshold(candidates, k, K_POW2)
    return m, d, candidates


@triton.jit
def scan_lanes(x_row, start, stop, x_stride_col, inv_temperature,
               BLOCK: tl.constexpr, CONTIGUOUS: tl.constexpr, KEEP: tl.constexpr):
    """Stream x[row, start:stop] with elementwise work only: per lane (column mod BLOCK) the online
    (m, d), the lane's KEEP (1 or 2) best elements (value and column, best first; with KEEP = 1 the
    second pair stays empty) and the best of the rest (value)."""
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    d = tl.zeros([BLOCK], tl.float32)
    first = tl.full([BLOCK], NEG_INF, tl.float32)
    first_col = tl.full([BLOCK], -1, tl.int32)  # -1: nothing above -inf kept
    second = tl.full([BLOCK], NEG_INF, tl.float32)
    second_col = tl.full([BLOCK], -1, tl.int32)
    runner_up = tl.full([BLOCK], NEG_INF, tl.float32)
    # The next block is loaded before this one is used (its loads stay in flight during this
    # block's work): left to itself, ptxas may issue each load just before its first use.
    b_next = load_scaled(x_row, start + tl.arange(0, BLOCK), x_stride_col, stop, inv_temperature, CONTIGUOUS)
    for block_start in range(start, stop, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        b_x = b_next
        b_next = load_scaled(x_row, cols + BLOCK, x_stride_col, stop, inv_temperature, CONTIGUOUS)
        m, d = online_update(m, d, b_x)
        # Strict >: a lane's columns rise, so an equal later value (which loses the tie) moves
        # down, to runner_up at the end, where the exactness check sees it.
        above_first = b_x > first
        if KEEP == 2:
            above_second = b_x > second
            runner_up = tl.where(above_second, second, tl.maximum(runner_up, b_x))
            second_col = tl.where(above_first, first_col, tl.where(above_second, cols, second_col))
            second = tl.where(above_first, first, tl.where(above_second, b_x, second))
        else:
            runner_up = tl.where(above_first, first, tl.maximum(runner_up, b_x))
        first_col = tl.where(above_first, cols, first_col)
        first = tl.where(above_first, b_x, first)
    return m, d, first, first_col, second, second_col, runner_up


@triton.jit
def lane_keys(values, cols):
    # A lane's kept element as a key; lanes that hold nothing above -inf give none.
    return tl.where(cols >= 0, pack_keys(values, cols), EMPTY_KEY)


@triton.jit
def read_suspect_lanes(x_row, start, stop, k, x_stride_col, inv_temperature, candidates, floor, suspect,
                       first_col, second_col, BLOCK: tl.constexpr, K_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr):
    """The second read of a lane selection, lanes only: ``candidates`` holds the top K_POW2 of the
    kept elements, and only a suspect lane (runner-up at or above ``floor``, the kept k-th value)
    can hold more of the chunk's top k; every other lane's rest is below ``floor``. So only the
    suspect lanes' elements that were not kept are loaded (masked loads touch nothing else), and
    those at or above ``floor`` enter the list one by one."""
    for block_start in range(start, stop, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        unseen = suspect & (cols < stop) & (cols != first_col) & (cols != second_col)
        b_x = tl.load(x_row + col_offset(cols, x_stride_col, CONTIGUOUS), mask=unseen,
                      other=NEG_INF).to(tl.float32) * inv_temperature
        enter = unseen & (b_x >= floor)
        n_enter = tl.sum(enter.to(tl.int32), 0)
        if n_enter > 0:
            candidates = insert_one_by_one(candidates, tl.where(enter, pack_keys(b_x, cols), EMPTY_KEY),
                                           tl.minimum(n_enter, k), K_POW2)
    return candidates


@triton.jit
def topk_stream_kernel(
    x_ptr, values_ptr, indices_ptr, lse_ptr, part_m_ptr, part_d_ptr, part_keys_ptr,
    n_cols, k, x_stride_row, x_stride_col, out_stride_row, chunk_size, num_chunks, inv_temperature,
    BLOCK: tl.constexpr, K_POW2: tl.constexpr, FEW_SURVIVORS: tl.constexpr, COMPACT: tl.constexpr,
    LANE_KEEP: tl.constexpr, READ_SUSPECT_LANES: tl.constexpr, CONTIGUOUS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    FINAL: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    # One read of x[row, chunk]. FINAL (one chunk per row): write the outputs; else the partials.
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    # ROW_ALIGN: rows start and end on 16-byte boundaries (chunk_size is n_cols or a block multiple).
    start = tl.multiple_of(chunk * chunk_size, ROW_ALIGN)
    stop = tl.multiple_of(tl.minimum(start + chunk_size, n_cols), ROW_ALIGN)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * x_stride_row, ROW_ALIGN)
    # This program's K_POW2 slots of part_keys: compaction scratch until the partial list is stored.
    scratch = part_keys_ptr + (row.to(tl.int64) * num_chunks + chunk) * K_POW2
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    d = tl.zeros([BLOCK], tl.float32)
    if LANE_KEEP == 0:
        m, d, candidates = scan_survivors(x_row, start, stop, k, x_stride_col, inv_temperature, scratch, m, d,
                                          NEG_INF, BLOCK, K_POW2, FEW_SURVIVORS, COMPACT, CONTIGUOUS, True, False)
        m_row, d_row = merge_normalizers(m, d, 0)
    else:
        # The top k of the elements the lanes kept is the chunk's top k unless some lane held more
        # of them than it kept: exactly when a runner-up reaches the list's k-th value (>=: on a
        # tie the runner-up may hold the lower column). Then, or when the lanes kept fewer than k
        # elements above -inf, stream the chunk again with the exact list (a second read, from L2
        # when recent). Registers per thread (scripts/kernel_resources.py, ptxas for sm_90, fp32, the
        # plans' 512 lanes / 4 warps): 48 keeping one at 4096x4096 k8, 56 keeping two at
        # 1024x25000 k5, 64 at k = 50; the running list holds 168 at k = 50.
        m, d, first, first_col, second, second_col, runner_up = scan_lanes(
            x_row, start, stop, x_stride_col, inv_temperature, BLOCK, CONTIGUOUS, LANE_KEEP)
        m_row, d_row = merge_normalizers(m, d, 0)
        if LANE_KEEP == 1 and K_POW2 <= FEW_SURVIVORS:
            candidates = insert_one_by_one(tl.full([K_POW2], EMPTY_KEY, tl.int64), lane_keys(first, first_col), k,
                                           K_POW2)
        elif LANE_KEEP == 1:
            # Long lists: one sorting network over the lanes' best instead of k insertions.
            candidates = tl.topk(lane_keys(first, first_col), K_POW2)
        else:
            # The top k of the union is within the top K_POW2 of each kept rank.
            candidates = merge_sorted_lists(tl.topk(lane_keys(first, first_col), K_POW2),
                                            tl.flip(tl.topk(lane_keys(second, second_col), K_POW2), 0))
        threshold, filling = list_threshold(candidates, k, K_POW2)
        suspect = tl.max(runner_up, 0) >= threshold
        # Fewer than k kept elements above -inf ("filling"): the whole chunk again, in any mode.
        whole_chunk = filling
        if not READ_SUSPECT_LANES:
            whole_chunk = filling | suspect
        if whole_chunk:
            # The kept k-th value bounds the chunk's k-th from below (k kept elements reach it).
            # (m, d) are neither read nor updated without UPDATE_NORMALIZER: placeholders.
            floor = tl.where(filling, NEG_INF, threshold)
            _, _, candidates = scan_survivors(x_row, start, stop, k, x_stride_col, inv_temperature, scratch, 0.0,
                                              0.0, floor, BLOCK, K_POW2, FEW_SURVIVORS, COMPACT, CONTIGUOUS, False,
                                              True)
        elif READ_SUSPECT_LANES:
            if suspect:
                candidates = read_suspect_lanes(x_row, start, stop, k, x_stride_col, inv_temperature, candidates,
                                                threshold, runner_up >= threshold, first_col, second_col, BLOCK,
                                                K_POW2, CONTIGUOUS)
    if FINAL:
        write_topk(candidates, m_row, d_row, row, k, values_ptr, indices_ptr, lse_ptr, out_stride_row,
                   K_POW2, WRITE_LSE)
    else:
        part = row.to(tl.int64) * num_chunks + chunk
        tl.store(part_m_ptr + part, m_row)
        tl.store(part_d_ptr + part, d_row)
        tl.store(part_keys_ptr + part * K_POW2 + tl.arange(0, K_POW2), candidates)


@triton.jit
def topk_merge_kernel(
    part_m_ptr, part_d_ptr, part_keys_ptr, values_ptr, indices_ptr, lse_ptr,
    k, out_stride_row, num_chunks,
    K_POW2: tl.constexpr, CHUNKS_POW2: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    # One program per row takes the top K_POW2 of all its chunks' lists in one tl.topk over one
    # load (a loop folding one list at a time would wait on a load per chunk). Keys are unique
    # (they hold the column), so the result does not depend on the order of the chunks.
    row = tl.program_id(0)
    chunk_idx = tl.arange(0, CHUNKS_POW2)
    parts = row.to(tl.int64) * num_chunks + chunk_idx
    chunk_mask = chunk_idx < num_chunks
    m, d = merge_normalizers(tl.load(part_m_ptr + parts, mask=chunk_mask, other=NEG_INF),
                             tl.load(part_d_ptr + parts, mask=chunk_mask, other=0.0), 0)
    key_idx = tl.arange(0, CHUNKS_POW2 * K_POW2)
    keys = tl.load(part_keys_ptr + row.to(tl.int64) * num_chunks * K_POW2 + key_idx,
                   mask=key_idx < num_chunks * K_POW2, other=EMPTY_KEY)
    candidates = tl.topk(keys, K_POW2)
    write_topk(candidates, m, d, row, k, values_ptr, indices_ptr, lse_ptr, out_stride_row, K_POW2, WRITE_LSE)


# --------------------------------------------------------------------------------------------
# Backward kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def topk_backward_kernel(
    x_ptr, lse_ptr, indices_ptr, dv_ptr, dlse_ptr, dx_ptr,
    n_cols, k, x_stride_row, x_stride_col, chunk_size, inv_temperature,
    BLOCK: tl.constexpr, K_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr, ROW_ALIGN: tl.constexpr,
):
    # v_i = y_{c_i}, y = softmax(x / T), lse = logsumexp(x / T):
    #   dx_j = (1/T) (scatter(dv * y_c)_j - y_j * s),  s = <dv, y_c> - dlse.
    # Every program recomputes s from the K chosen logits, writes -y s / T over its chunk, then
    # overwrites the chosen columns inside its chunk (after a barrier: same addresses, other threads).
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    # ROW_ALIGN: rows start and end on 16-byte boundaries (chunk_size is n_cols or a block multiple).
    start = tl.multiple_of(chunk * chunk_size, ROW_ALIGN)
    stop = tl.multiple_of(tl.minimum(start + chunk_size, n_cols), ROW_ALIGN)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * x_stride_row, ROW_ALIGN)
    dx_row = dx_ptr + row.to(tl.int64) * n_cols
    lse = tl.load(lse_ptr + row)
    slot = tl.arange(0, K_POW2)
    chosen_mask = slot < k
    chosen = tl.load(indices_ptr + row.to(tl.int64) * k + slot, mask=chosen_mask, other=0)
    y_chosen = tl.exp(tl.load(x_row + chosen * x_stride_col, mask=chosen_mask, other=NEG_INF).to(tl.float32)
                      * inv_temperature - lse)
    dv = tl.load(dv_ptr + row.to(tl.int64) * k + slot, mask=chosen_mask, other=0.0).to(tl.float32)
    s = tl.sum(tl.where(chosen_mask, dv * y_chosen, 0.0), 0) - tl.load(dlse_ptr + row)
    for block_start in range(start, stop, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        y = tl.exp(load_scaled(x_row, cols, x_stride_col, stop, inv_temperature, CONTIGUOUS) - lse)
        tl.store(dx_row + cols, (-y * s * inv_temperature).to(dx_ptr.dtype.element_ty), mask=cols < stop)
    tl.debug_barrier()
    in_chunk = chosen_mask & (chosen >= start) & (chosen < stop)
    tl.store(dx_row + chosen, (y_chosen * (dv - s) * inv_temperature).to(dx_ptr.dtype.element_ty), mask=in_chunk)


# --------------------------------------------------------------------------------------------
# Launchers (on a 2-d (rows, cols) view; the public function moves ``dim`` last)
# --------------------------------------------------------------------------------------------


def _row_align(x2: torch.Tensor, is_aligned: bool) -> int:
    # Elements per 16-byte load when every row starts and ends on a 16-byte boundary (else 1).
    # ``is_aligned``: ``aligned(x2)``, which the launcher has already computed for its key.
    # Triton proves alignment only from integers divisible by 16, so rows of 25000 fp32 (100000
    # bytes) would be read 4 bytes per load instruction: the kernels take this as a hint instead.
    vector = 16 // x2.element_size()
    whole = x2.stride(1) == 1 and x2.stride(0) % vector == 0 and x2.shape[1] % vector == 0 and is_aligned
    return vector if whole else 1


def _rows_view(x: torch.Tensor, dim: int) -> torch.Tensor:
    # A view whenever the other dims merge into one row stride (contiguous input, slices of the
    # last dim, transposes of 2-d tensors); a copy otherwise.
    return x.movedim(dim, -1).reshape(-1, x.shape[dim])


_topk_stream = Launcher(topk_stream_kernel)
_topk_merge = Launcher(topk_merge_kernel)


def launch_forward(x2: torch.Tensor, k: int, temperature: float, strategy: Optional[str] = None,
                   block: Optional[int] = None, num_chunks: Optional[int] = None,
                   lane_keep: Optional[int] = None, second_read: Optional[str] = None):
    """(values, indices, lse) of a (rows, cols) tensor; ``strategy``/``block``/``num_chunks``/``lane_keep``/
    ``second_read`` force the plan."""
    n_rows, n_cols = x2.shape
    values = _buffers.empty((n_rows, k), x2.dtype, x2.device)
    indices = _buffers.empty((n_rows, k), torch.int64, x2.device)
    lse = _buffers.empty((n_rows,), torch.float32, x2.device)
    use_triton = x2.is_cuda or planner.interpreter_active()
    if not use_triton or k == 0 or k > planner.TOPK_MAX_K or n_rows == 0:
        if n_rows:
            cpu.softmax_topk(x2, k, 1.0 / temperature, values, indices, lse)
        return values, indices, lse
    chosen = planner.topk_plan(n_rows, n_cols, k, x2.dtype, x2.device, strategy, block, num_chunks,
                               lane_keep=lane_keep, second_read=second_read)
    planner.record_topk(chosen)
    inv_t = 1.0 / temperature
    # The plan fixes every integer argument but x's strides; with x's alignment they complete the
    # compiled-kernel key (see onlinesoftmax._launch).
    is_aligned = aligned(x2)
    launch_key = (chosen, x2.stride(0), x2.stride(1), is_aligned, planner.TOPK_FEW_SURVIVORS)
    common = dict(BLOCK=chosen.block, K_POW2=chosen.k_pow2, FEW_SURVIVORS=planner.TOPK_FEW_SURVIVORS,
                  COMPACT=chosen.compact, LANE_KEEP=chosen.lane_keep,
                  READ_SUSPECT_LANES=chosen.second_read == "lanes",
                  CONTIGUOUS=x2.stride(1) == 1, ROW_ALIGN=_row_align(x2, is_aligned), WRITE_LSE=True,
                  num_warps=chosen.num_warps)
    # Each program's candidate list (split) and compaction scratch (compact plans); a single
    # one-by-one launch touches neither.
    part_keys = indices
    if chosen.strategy == "split" or chosen.compact:
        part_keys = _buffers.empty((n_rows, chosen.num_chunks, chosen.k_pow2), torch.int64, x2.device)
    if chosen.strategy == "single":
        _topk_stream(
            (n_rows, 1), launch_key, x2, values, indices, lse, lse, lse, part_keys, n_cols, k, x2.stride(0),
            x2.stride(1), k, n_cols, 1, inv_t, FINAL=True, **common)
        return values, indices, lse
    part_m = _buffers.empty((n_rows, chosen.num_chunks), torch.float32, x2.device)
    part_d = _buffers.empty((n_rows, chosen.num_chunks), torch.float32, x2.device)
    _topk_stream(
        (n_rows, chosen.num_chunks), launch_key, x2, values, indices, lse, part_m, part_d, part_keys, n_cols, k,
        x2.stride(0), x2.stride(1), k, chosen.chunk_size, chosen.num_chunks, inv_t, FINAL=False, **common)
    _topk_merge(
        (n_rows,), chosen, part_m, part_d, part_keys, values, indices, lse, k, k, chosen.num_chunks,
        K_POW2=chosen.k_pow2, CHUNKS_POW2=planner.next_power_of_2(chosen.num_chunks), WRITE_LSE=True,
        num_warps=planner.TOPK_MERGE_WARPS)
    return values, indices, lse


def launch_backward(x2: torch.Tensor, lse: torch.Tensor, indices: torch.Tensor, dv: torch.Tensor,
                    dlse: torch.Tensor, temperature: float, strategy: Optional[str] = None,
                    block: Optional[int] = None, num_chunks: Optional[int] = None) -> torch.Tensor:
    """dx (rows, cols), contiguous, in x's dtype, for upstream gradients of the values and the lse."""
    n_rows, n_cols = x2.shape
    k = indices.shape[1]
    dx = _buffers.empty((n_rows, n_cols), x2.dtype, x2.device)
    if x2.numel() == 0:
        return dx
    if not (x2.is_cuda or planner.interpreter_active()) or k > planner.TOPK_MAX_K:
        dx.copy_(cpu.softmax_topk_backward(x2, lse, indices, dv, dlse, 1.0 / temperature))
        return dx
    # The backward streams x once whatever the forward's selection was: its blocks follow the
    # running-list plans (lane_keep=0), which is what its timings were taken with.
    chosen = planner.topk_plan(n_rows, n_cols, max(k, 1), x2.dtype, x2.device, strategy, block, num_chunks,
                               lane_keep=0)
    topk_backward_kernel[(n_rows, chosen.num_chunks)](
        x2, lse, indices.contiguous(), dv.contiguous(), dlse.float().contiguous(), dx,
        n_cols, k, x2.stride(0), x2.stride(1), chosen.chunk_size, 1.0 / temperature,
        BLOCK=chosen.block, K_POW2=chosen.k_pow2, CONTIGUOUS=x2.stride(1) == 1, ROW_ALIGN=_row_align(x2, aligned(x2)),
        num_warps=chosen.num_warps)
    return dx


# --------------------------------------------------------------------------------------------
# Custom ops: torch.compile sees opaque ops with fake (shape-only) implementations
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("onlinesoftmax::softmax_topk", mutates_args=())
def _forward_op(x2: torch.Tensor, k: int, temperature: float, strategy: Optional[str], block: Optional[int],
                num_chunks: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(x2, k, temperature, strategy, block, num_chunks)


@_forward_op.register_fake
def _(x2, k, temperature, strategy, block, num_chunks):
    rows = x2.shape[0]
    return (x2.new_empty((rows, k)), x2.new_empty((rows, k), dtype=torch.int64),
            x2.new_empty((rows,), dtype=torch.float32))


@torch.library.custom_op("onlinesoftmax::softmax_topk_backward", mutates_args=())
def _backward_op(x2: torch.Tensor, lse: torch.Tensor, indices: torch.Tensor, dv: torch.Tensor, dlse: torch.Tensor,
                 temperature: float, strategy: Optional[str], block: Optional[int],
                 num_chunks: Optional[int]) -> torch.Tensor:
    return launch_backward(x2, lse, indices, dv, dlse, temperature, strategy, block, num_chunks)


@_backward_op.register_fake
def _(x2, lse, indices, dv, dlse, temperature, strategy, block, num_chunks):
    return x2.new_empty(x2.shape)


_forward = op_when_compiling(_forward_op, launch_forward)
_backward = op_when_compiling(_backward_op, launch_backward)


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _SoftmaxTopkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, k, temperature, strategy, block, num_chunks):
        values, indices, lse = _forward(x2, k, temperature, strategy, block, num_chunks)
        ctx.save_for_backward(x2, lse, indices)
        ctx.config = (temperature, strategy, block, num_chunks)
        ctx.mark_non_differentiable(indices)
        return values, indices, lse

    @staticmethod
    def backward(ctx, dv, _dindices, dlse):
        x2, lse, indices = ctx.saved_tensors
        if dv is None:
            dv = torch.zeros(indices.shape, dtype=torch.float32, device=x2.device)
        if dlse is None:
            dlse = torch.zeros(lse.shape, dtype=torch.float32, device=x2.device)
        dx = _backward(x2, lse, indices, dv, dlse, *ctx.config)
        return dx, None, None, None, None, None


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check(x, k, dim, temperature, sorted):
    from .softmax import DimensionError

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax_topk expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"softmax_topk supports float32, float16 and bfloat16 tensors, got {x.dtype}; cast it first")
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"softmax_topk runs on CUDA and CPU tensors, got a tensor on {x.device}")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"softmax_topk: dim must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise DimensionError(f"softmax_topk: dim {dim} is out of range for a tensor of {x.dim()} dims "
                             f"(expected in [{-ndim}, {ndim - 1}])")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"softmax_topk: k must be an int, got {type(k).__name__}")
    size = x.shape[dim] if x.dim() else 1
    if not 0 <= k <= size:
        raise ValueError(f"softmax_topk: k must be in [0, {size}] (the size of dim {dim}), got {k}")
    if size > MAX_COLS:
        raise ValueError(f"softmax_topk: rows longer than {MAX_COLS} elements are not supported, got {size}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"softmax_topk: temperature must be a real number, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"softmax_topk: temperature must be finite and > 0, got {temperature}")
    if not isinstance(sorted, bool):
        raise TypeError(f"softmax_topk: sorted must be a bool, got {type(sorted).__name__}")
    return dim % ndim


def softmax_topk(x: torch.Tensor, k: int, dim: int = -1, *, temperature: float = 1.0, sorted: bool = True,
                 return_lse: bool = False, strategy: Optional[str] = None):
    """The ``k`` largest probabilities of ``softmax(x / temperature, dim)`` and their indices, in one read of ``x``.

    Equal to ``torch.topk(torch.softmax(x / temperature, dim), k, dim)`` (up to fp32 rounding of
    the probabilities), computed without materializing the softmax: the online normalizer and a
    running top-k share one pass (Milakov & Gimelshein, 2018, arXiv:1805.02867).

    Parameters
    ----------
    x : Tensor
        float32, float16 or bfloat16, any shape and strides, on CUDA or CPU.
    k : int
        ``0 <= k <= x.shape[dim]``. K up to 256 runs the fused Triton kernels; larger K the
        vectorized torch path.
    dim : int
        The dimension to normalize and select over.
    temperature : float
        Divides the logits; finite and > 0.
    sorted : bool
        Accepted for torch.topk compatibility; the result is always sorted (descending).
    return_lse : bool
        Also return the row's ``logsumexp(x / temperature)`` in float32 (log-probabilities are
        ``x / temperature - lse``; samplers need it).
    strategy : {"single", "split"}, optional
        Expert/testing override of the launch plan (see :func:`onlinesoftmax.plan.topk_plan`).

    Returns
    -------
    values : Tensor
        ``x``'s shape with ``dim`` of size ``k``, in ``x.dtype``, descending along ``dim``.
    indices : Tensor
        int64, same shape: positions along ``dim``.
    lse : Tensor, only with ``return_lse``
        float32, ``x``'s shape without ``dim``.

    Notes
    -----
    Ranking is by ``x / temperature`` in float32 (softmax is monotone). Ties: the lower index
    wins, always (``-0.0`` equals ``0.0``). ``-inf`` logits have probability 0 and rank last
    (still chosen by lower index when ``k`` exceeds the finite entries). A row that
    ``torch.softmax`` turns into NaN (it holds NaN or ``+inf``, or is all ``-inf``) gives NaN
    values, and since all its probabilities tie, indices ``0 .. k-1``. Differentiable with
    respect to ``x`` through the values and the lse (a Triton kernel:
    ``dx = (scatter(dv * v) - y * (<dv, v> - dlse)) / T``); indices are not differentiable.
    Deterministic: the result is bitwise identical across runs. Traceable by
    ``torch.compile(fullgraph=True)``.

    Raises
    ------
    TypeError
        Non-tensor or non-float input, non-int ``k`` or ``dim``, non-real ``temperature``.
    ValueError
        ``k`` outside ``[0, size]``, ``temperature`` <= 0 or not finite, unknown ``strategy``,
        a device other than CUDA or CPU, ``dim`` out of range (:class:`DimensionError`).

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> onlinesoftmax.softmax_topk(torch.tensor([1.0, 3.0, 2.0, 3.0]), 2)
    (tensor([0.3995, 0.3995]), tensor([1, 3]))
    """
    dim = _check(x, k, dim, temperature, sorted)
    if strategy is not None and strategy not in planner.TOPK_STRATEGIES:
        raise ValueError(f"softmax_topk: strategy must be None or one of {planner.TOPK_STRATEGIES}, got {strategy!r}")
    squeeze = x.dim() == 0
    if squeeze:
        x = x.reshape(1)
    # Rows already in the last dim of a 2-d tensor skip the view and reshape calls (each costs
    # microseconds of host time, which decode-sized calls feel).
    as_rows = x.dim() == 2 and dim == 1
    x2 = x if as_rows else _rows_view(x, dim)
    args = (x2, k, float(temperature), strategy, None, None)
    if x.requires_grad and torch.is_grad_enabled():
        values, indices, lse = _SoftmaxTopkFunction.apply(*args)
    else:
        values, indices, lse = _forward(*args)
    if as_rows:
        return (values, indices, lse) if return_lse else (values, indices)
    moved = x.movedim(dim, -1).shape
    values = values.reshape(*moved[:-1], k).movedim(-1, dim)
    indices = indices.reshape(*moved[:-1], k).movedim(-1, dim)
    lse = lse.reshape(moved[:-1])
    if squeeze:
        values, indices, lse = values.reshape(k), indices.reshape(k), lse.reshape(())
    return (values, indices, lse) if return_lse else (values, indices)
