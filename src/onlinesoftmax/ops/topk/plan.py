"""softmax_topk launch decisions: one program per row, or rows split into chunks merged by a second
launch; how a block's candidates reach the list. The measurements behind each value are in
``docs/perf-topk.md``."""

from __future__ import annotations

import dataclasses
import functools

import torch

from ..._device import LastPlan, cdiv as _cdiv, next_power_of_2, plan_cache, sm_count


TOPK_STRATEGIES = ("single", "split")
# Largest K the Triton kernels keep on chip (a power-of-two candidate list in registers); larger K runs in torch.
TOPK_MAX_K = 256
# Running-list blocks: small, so that more of them are filtered out whole (about K ln(blocks / K) merge); never below K.
TOPK_BLOCK = {4: 1024, 2: 1024, 1: 1024}
# Block 1024 on 4 warps beat 2048 on 8 at every k measured.
TOPK_WARPS = 4
# k <= 16 inserts a block's survivors one by one (at most this many, else the block's tl.topk) ...
TOPK_FEW_SURVIVORS = 16
# ... larger k compacts them by a prefix sum and merges once (64x128256 k50: 136 against 230 us).
TOPK_COMPACT_ABOVE_K = 16
# Lane selections (each lane keeps its best one or two; exactness checked, a second read when not):
# keeping one where k <= 16 and a chunk spans few blocks, two up to k = 64, one again above.
TOPK_LANE_BEST_MAX_K = 16
TOPK_LANE_KEEP2_MAX_K = 64
# A second read takes the whole chunk ("chunk") or only the suspect lanes ("lanes": registers, paid
# where second reads are common: keeping one, and keeping two at k > 16).
TOPK_SECOND_READS = ("chunk", "lanes")
TOPK_CHUNK_READ_MAX_K = 16
# Lanes a selection keeps (block) by k: 512 up to k = 50, 1024 above (three of the top k in one lane: 15% -> 4% of chunks).
TOPK_LANE_BLOCK = 512
TOPK_LANE_KEEP1_MAX_BLOCKS = 8
TOPK_LANE_WIDE_ABOVE_K = 50
TOPK_LANE_WIDE_BLOCK = 1024
# Above k = 64, by element size: 128x262144 k256 fp32 244 us at 1024 lanes, bf16 223 at 2048 (the running list: ~700).
TOPK_LANE_LONG_BLOCK = {4: 1024, 2: 2048, 1: 2048}
# Split a row across programs when the rows alone give fewer than this many programs per SM.
TOPK_SPLIT_BELOW_ROWS_PER_SM = 2
# Programs aimed at per SM when splitting, the fewest blocks a chunk streams (below that the
# per-chunk fixed cost, one merge and the partial's store, dominates), and a cap on chunks per
# row (the merge launch folds a row's chunks one sorted list at a time).
TOPK_SPLIT_PROGRAMS_PER_SM = 4
TOPK_MIN_BLOCKS_PER_CHUNK = 2
TOPK_MAX_CHUNKS = 128
# The merge launch takes one tl.topk over all of a row's chunk lists at once: at most this many
# 64-bit keys (64 KB) per program, which caps the chunks at TOPK_MERGE_MAX_KEYS / K_POW2.
TOPK_MERGE_MAX_KEYS = 8192
TOPK_MERGE_WARPS = 8
# Interpreter runs: blocks small enough that test rows span several blocks and chunks.
TOPK_INTERPRETER_BLOCK = 64


@dataclasses.dataclass(frozen=True)
class TopkPlan:
    """One softmax_topk launch decision."""

    strategy: str  # "single": one program per row, one launch; "split": chunks + a merge launch
    rows: int
    cols: int
    k: int
    k_pow2: int
    dtype: torch.dtype
    block: int
    num_warps: int
    chunk_size: int
    num_chunks: int
    compact: bool  # survivors packed by a prefix sum (long lists), else inserted one by one
    lane_keep: int  # 0: a running list; 1 or 2: elements each lane keeps in one elementwise pass
    second_read: str  # lane selections: "chunk" or "lanes" (see TOPK_SECOND_READS)

    @property
    def launches(self) -> int:
        return 1 if self.strategy == "single" else 2

    def bytes_moved(self) -> int:
        """x read once; values, int64 indices and the fp32 lse written once."""
        return self.rows * (self.cols * self.dtype.itemsize + self.k * (self.dtype.itemsize + 8) + 4)

    def describe(self, bandwidth_gbs: float | None = None) -> str:
        lines = [
            f"op:          softmax_topk  ({self.rows} rows x {self.cols} cols, k={self.k} "
            f"(list of {self.k_pow2}), {str(self.dtype).replace('torch.', '')})",
            f"strategy:    {self.strategy}  ({self.launches} launch(es), {self.num_warps} warps/program)",
            f"blocks:      {self.block} cols per block; {self.num_chunks} chunk(s) of {self.chunk_size} per row",
            "selection:   " + (f"the top k of the {self.lane_keep} best element(s) of each lane (exactness checked; "
                               f"when not, a second read of the {self.second_read})" if self.lane_keep else
                               f"a running list; survivors {'compacted' if self.compact else 'inserted one by one'}"),
            f"bytes moved: {self.bytes_moved() / 1e6:.2f} MB (x read once, outputs written once)",
        ]
        if bandwidth_gbs:
            lines.append(f"floor:       {self.bytes_moved() / bandwidth_gbs / 1e6 * 1e3:.2f} us at {bandwidth_gbs:.0f} GB/s")
        return "\n".join(lines)


def list_length(k: int) -> int:
    """The candidate list's length for k (K_POW2): a power of two, at least 2."""
    return max(2, next_power_of_2(k))


@plan_cache
def _clear():
    topk_plan.cache_clear()


@functools.lru_cache(maxsize=4096)  # on every call's path; a frozen result, so sharing it is safe
def topk_plan(rows: int, cols: int, k: int, dtype: torch.dtype, device: torch.device,
              strategy: str | None = None, block: int | None = None, num_chunks: int | None = None,
              sms: int | None = None, lane_keep: int | None = None, second_read: str | None = None) -> TopkPlan:
    """Choose single (one program per row) or split (chunks of each row, then a merge) for softmax_topk.

    ``strategy``, ``block``, ``num_chunks``, ``lane_keep`` and ``second_read`` force a choice (tests
    and sweeps)."""
    if strategy is not None and strategy not in TOPK_STRATEGIES:
        raise ValueError(f"softmax_topk: strategy must be None or one of {TOPK_STRATEGIES}, got {strategy!r}")
    k_pow2 = list_length(k)
    if lane_keep is not None and (lane_keep not in (0, 1, 2) or (lane_keep == 2 and k > TOPK_LANE_KEEP2_MAX_K)):
        raise ValueError(f"softmax_topk: lane_keep must be 0, 1 or 2 (2 for k <= {TOPK_LANE_KEEP2_MAX_K}), "
                         f"got {lane_keep} for k={k}")
    if second_read is not None and second_read not in TOPK_SECOND_READS:
        raise ValueError(f"softmax_topk: second_read must be None or one of {TOPK_SECOND_READS}, got {second_read!r}")
    # A lane selection (which one: below) unless the running list is forced.
    lanes = lane_keep != 0
    sms = sms or sm_count(device)
    one_chunk = num_chunks == 1 or (num_chunks is None and (
        strategy == "single" or (strategy is None and rows >= TOPK_SPLIT_BELOW_ROWS_PER_SM * sms)))
    if block is None:
        if device.type != "cuda":
            block = TOPK_INTERPRETER_BLOCK
        elif lanes and k > TOPK_LANE_KEEP2_MAX_K:
            block = TOPK_LANE_LONG_BLOCK[dtype.itemsize]
        elif lanes:
            block = TOPK_LANE_WIDE_BLOCK if k > TOPK_LANE_WIDE_ABOVE_K else TOPK_LANE_BLOCK
        else:
            block = TOPK_BLOCK[dtype.itemsize]
    block = max(next_power_of_2(block), k_pow2)
    if num_chunks is None:
        if one_chunk:
            num_chunks = 1
        else:
            wanted = _cdiv(TOPK_SPLIT_PROGRAMS_PER_SM * sms, max(rows, 1))
            fit = _cdiv(cols, block * TOPK_MIN_BLOCKS_PER_CHUNK)
            num_chunks = max(1, min(wanted, fit, TOPK_MAX_CHUNKS, TOPK_MERGE_MAX_KEYS // k_pow2))
    if num_chunks * k_pow2 > TOPK_MERGE_MAX_KEYS:
        raise ValueError(f"softmax_topk: {num_chunks} chunks of a {k_pow2}-entry list exceed the merge's "
                         f"{TOPK_MERGE_MAX_KEYS} keys")
    chunk_blocks = _cdiv(_cdiv(max(cols, 1), num_chunks), block)
    chunk_size = chunk_blocks * block
    num_chunks = _cdiv(max(cols, 1), chunk_size)  # every chunk holds at least one column
    if strategy is None:
        strategy = "single" if num_chunks == 1 else "split"
    if lane_keep is None:
        lane_keep = 0 if not lanes else 1 if k > TOPK_LANE_KEEP2_MAX_K or (
            k <= TOPK_LANE_BEST_MAX_K and chunk_blocks <= TOPK_LANE_KEEP1_MAX_BLOCKS) else 2
    if second_read is None:
        # (No second read without lanes: "chunk", which leaves the running list's code as it was.)
        second_read = "lanes" if lane_keep == 1 or lane_keep == 2 and k > TOPK_CHUNK_READ_MAX_K else "chunk"
    return TopkPlan(strategy, rows, cols, k, k_pow2, dtype, block, TOPK_WARPS, chunk_size, num_chunks,
                    k > TOPK_COMPACT_ABOVE_K, lane_keep, second_read)


_recorded = LastPlan()
# The plan of the most recent launch in this process (tests assert which path ran).
record_topk = _recorded.record
last_topk_plan = _recorded.last
