"""Fused softmax + top-k (Milakov & Gimelshein, 2018, "Softmax and TopK fusion"): the Triton kernels.

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

import triton
import triton.language as tl

from ..._triton import NEG_INF, col_offset, load_scaled, merge_normalizers, online_update, split_lse

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
def write_topk(candidates, m, d, row, k, values_ptr, indices_ptr, lse_ptr, lse_low_ptr, out_stride_row,
               K_POW2: tl.constexpr, WRITE_LSE: tl.constexpr):
    x, cols = unpack_keys(candidates)
    write_selected(x, cols, m, d, row, k, values_ptr, indices_ptr, lse_ptr, lse_low_ptr, out_stride_row, K_POW2,
                   WRITE_LSE)


@triton.jit
def write_selected(x, cols, m, d, row, k, values_ptr, indices_ptr, lse_ptr, lse_low_ptr, out_stride_row,
                   K_POW2: tl.constexpr, WRITE_LSE: tl.constexpr):
    # The row's k best (values x / T, their columns), normalized by the row's (m, d).
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
        lse, lse_low = split_lse(m, d)
        tl.store(lse_ptr + row, lse)
        tl.store(lse_low_ptr + row, lse_low)


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
    x_ptr, values_ptr, indices_ptr, lse_ptr, lse_low_ptr, part_m_ptr, part_d_ptr, part_keys_ptr,
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
        # when recent). Registers per thread (scripts/probes/kernel_resources.py, ptxas for sm_90, fp32, the
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
        write_topk(candidates, m_row, d_row, row, k, values_ptr, indices_ptr, lse_ptr, lse_low_ptr, out_stride_row,
                   K_POW2, WRITE_LSE)
    else:
        part = row.to(tl.int64) * num_chunks + chunk
        tl.store(part_m_ptr + part, m_row)
        tl.store(part_d_ptr + part, d_row)
        tl.store(part_keys_ptr + part * K_POW2 + tl.arange(0, K_POW2), candidates)


@triton.jit
def topk_merge_kernel(
    part_m_ptr, part_d_ptr, part_keys_ptr, values_ptr, indices_ptr, lse_ptr, lse_low_ptr,
    k, out_stride_row, num_chunks,
    K_POW2: tl.constexpr, CHUNKS_POW2: tl.constexpr, WRITE_LSE: tl.constexpr, PARTIAL: tl.constexpr = False,
):
    # One program per row takes the top K_POW2 of all its chunks' lists in one tl.topk over one
    # load (a loop folding one list at a time would wait on a load per chunk). Keys are unique
    # (they hold the column), so the result does not depend on the order of the chunks.
    # PARTIAL: the row's merged (m, d) and list are one partial again, stored where a single
    # chunk's would be (lse_ptr, lse_low_ptr: the m and d; indices_ptr: K_POW2 keys a row) for a
    # caller that merges further: the sharded softmax_topk sends them to the other ranks.
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
    if PARTIAL:
        tl.store(lse_ptr + row, m)
        tl.store(lse_low_ptr + row, d)
        tl.store(indices_ptr + row.to(tl.int64) * K_POW2 + tl.arange(0, K_POW2), candidates)
    else:
        write_topk(candidates, m, d, row, k, values_ptr, indices_ptr, lse_ptr, lse_low_ptr, out_stride_row, K_POW2,
                   WRITE_LSE)


@triton.jit
def topk_shard_merge_kernel(
    gathered_ptr, gathered_f32_ptr, values_ptr, indices_ptr, lse_ptr, lse_low_ptr,
    world, k, out_stride_row, payload_len, md_start, md_plane, sizes_at,
    K_POW2: tl.constexpr, WORLD_POW2: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    # A sharded row's top k from every rank's partial (onlinesoftmax.distributed.softmax_topk): the
    # all_gather's (world, payload_len) int64 rows, each a rank's K_POW2 keys a row, then its m and
    # d planes (float32, from int64 slot md_start, md_plane floats apart), then its shard size at
    # sizes_at. One program a row. A rank's keys hold its own columns; they are re-keyed by (value,
    # rank, place in the rank's list), which orders ties as global columns do (the ranks' shards
    # are in rank order, a list's ties in column order) whatever the row's length, and the global
    # column is the winner's own plus the sizes of the shards before it.
    row = tl.program_id(0)
    rank = tl.arange(0, WORLD_POW2)
    live = rank < world
    base = rank.to(tl.int64) * payload_len
    sizes = tl.load(gathered_ptr + base + sizes_at, mask=live, other=0)
    pair = 2 * (base + md_start) + row
    m, d = merge_normalizers(tl.load(gathered_f32_ptr + pair, mask=live, other=NEG_INF),
                             tl.load(gathered_f32_ptr + pair + md_plane, mask=live, other=0.0), 0)
    slot = tl.arange(0, K_POW2)
    keys = tl.load(gathered_ptr + base[:, None] + row.to(tl.int64) * K_POW2 + slot[None, :], mask=live[:, None],
                   other=EMPTY_KEY)
    place = (rank[:, None] * K_POW2 + slot[None, :]).to(tl.int64)
    rekeyed = tl.where(keys == EMPTY_KEY, EMPTY_KEY, ((keys >> 32) << 32) | (0x7FFFFFFF - place))
    best = tl.topk(tl.reshape(rekeyed, [WORLD_POW2 * K_POW2]), K_POW2)
    x, place_of_best = unpack_keys(best)
    src_rank = place_of_best // K_POW2
    taken = best != EMPTY_KEY  # only short of k where k exceeds the row (validate=False)
    own = tl.load(gathered_ptr + src_rank.to(tl.int64) * payload_len + row.to(tl.int64) * K_POW2
                  + place_of_best % K_POW2, mask=taken, other=EMPTY_KEY)
    _, own_cols = unpack_keys(own)
    before = tl.sum(tl.where(rank[None, :] < src_rank[:, None], sizes[None, :], 0), 1)
    cols = tl.where(taken, before + own_cols.to(tl.int64), -1)
    write_selected(x, cols, m, d, row, k, values_ptr, indices_ptr, lse_ptr, lse_low_ptr, out_stride_row, K_POW2,
                   WRITE_LSE)


# --------------------------------------------------------------------------------------------
# Backward kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def topk_backward_kernel(
    x_ptr, lse_ptr, lse_low_ptr, indices_ptr, dv_ptr, dlse_ptr, dx_ptr,
    n_cols, k, x_stride_row, x_stride_col, chunk_size, inv_temperature,
    BLOCK: tl.constexpr, K_POW2: tl.constexpr, CONTIGUOUS: tl.constexpr, ROW_ALIGN: tl.constexpr,
):
    # v_i = y_{c_i}, y = softmax(x / T), lse = logsumexp(x / T):
    #   dx_j = (1/T) (scatter(dv * y_c)_j - y_j * s),  s = <dv, y_c> - dlse.
    # y = exp((x / T - lse) - lse_low): the forward's lse in two floats (see split_lse), because the
    # terms of s cancel and a float32 lse's rounding alone put dx 8e-5 off at logits ~800.
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
    lse_low = tl.load(lse_low_ptr + row)
    slot = tl.arange(0, K_POW2)
    chosen_mask = slot < k
    chosen = tl.load(indices_ptr + row.to(tl.int64) * k + slot, mask=chosen_mask, other=0)
    y_chosen = tl.exp(tl.load(x_row + chosen * x_stride_col, mask=chosen_mask, other=NEG_INF).to(tl.float32)
                      * inv_temperature - lse - lse_low)
    dv = tl.load(dv_ptr + row.to(tl.int64) * k + slot, mask=chosen_mask, other=0.0).to(tl.float32)
    s = tl.sum(tl.where(chosen_mask, dv * y_chosen, 0.0), 0) - tl.load(dlse_ptr + row)
    for block_start in range(start, stop, BLOCK):
        cols = block_start + tl.arange(0, BLOCK)
        y = tl.exp(load_scaled(x_row, cols, x_stride_col, stop, inv_temperature, CONTIGUOUS) - lse - lse_low)
        tl.store(dx_row + cols, (-y * s * inv_temperature).to(dx_ptr.dtype.element_ty), mask=cols < stop)
    tl.debug_barrier()
    in_chunk = chosen_mask & (chosen >= start) & (chosen < stop)
    tl.store(dx_row + chosen, (y_chosen * (dv - s) * inv_temperature).to(dx_ptr.dtype.element_ty), mask=in_chunk)
