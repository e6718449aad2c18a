"""softmax_topk launch decisions: one program per row, or rows split into chunks merged by a second
launch; how a block's candidates reach the list. The measurements behind each value are in
``docs/perf-topk.md``."""

from __future__ import annotations

import dataclasses
import functools

import torch

from ..._device import cdiv as _cdiv, next_power_of_2, plan_cache, sm_count


TOPK_STRATEGIES = ("single", "split")
# Largest K the Triton kernels keep on chip (a power-of-two candidate list in registers);
# larger K goes through the vectorized torch path.
TOPK_MAX_K = 256
# Elements per streamed block by element size. Smaller than the softmax stream on purpose: a
# block pays for a merge only when it holds an element above the K-th best so far, and with more,
# smaller blocks a larger share of them is filtered out (about K ln(blocks / K) blocks merge).
# A block is never smaller than the candidate list: the block's own top-K is taken with tl.topk.
TOPK_BLOCK = {4: 1024, 2: 1024, 1: 1024}
TOPK_WARPS = 4
# How a block's survivors (its elements above the list's k-th best) reach the list. Plans with
# k <= TOPK_COMPACT_ABOVE_K insert the best min(survivors, k) one by one (a max reduction and a
# log2(K_POW2) merge each); TOPK_FEW_SURVIVORS caps that count, above it the block goes through
# tl.topk (a sorting network over the whole block of 64-bit keys: the costly step). With both at
# 16 the cap only binds when a sweep forces one-by-one for larger k. Plans with larger k
# "compact": a block with at most K_POW2 survivors packs them by a prefix sum into K_POW2 slots of
# scratch, sorts those and merges once; more survivors take the block's tl.topk.
# H100, fp32, kernel time (scripts/sweep_topk.py, block 1024, 4 warps), one-by-one vs compact:
# 1024x25000 k5 101 vs 116 us; 4096x4096 k8 168 vs 175; 64x128256 k50 230 vs 136;
# 256x151936 k64 505 vs 450; 128x262144 k256 1604 vs 711. The sweep also put block 1024 with
# 4 warps ahead of 2048 with 8 at every k: 1024x25000 k5 135 -> 101 us, 4096x4096 k8 234 -> 168.
TOPK_FEW_SURVIVORS = 16
TOPK_COMPACT_ABOVE_K = 16
# Lane selections (the default at every k): the stream does elementwise work only (per lane,
# column mod block, the online (m, d), the lane's best one or two elements and the best of the
# rest; no block-wide reduction or branch per block), then takes the top k of what the lanes kept.
# That is exact unless one lane holds more of the top k than it kept, which the runner-ups reveal;
# such a chunk is streamed again (a second read) with the running list above. For random rows
# that happens to about k^2 / (2 lanes) of chunks keeping one (NumPy, 400 rows: 3.3% at 25000
# columns, k = 5, 512 lanes; 5.8% at 4096 columns, k = 8) and about k^3 / (6 lanes^2) keeping two
# (none of the same rows). The second read is rare but slow (a block-wide reduction per block)
# and lands in the launch's tail: keeping two pays off on long chunks, keeping one on short ones,
# where the final selection (k block-wide reductions against two sorting networks) dominates.
# H100, kernel time from CUDA graphs over rotated inputs (scripts/sweep_topk.py, 17:32 UTC run,
# benchmarks/results/sweep_topk_lanes-h100.log), one kept / two kept, us:
#   block 512, 4 warps: fp32 1024x25000 k5 78.7 / 58.4, 256x151936 k5 133.9 / 76.4, 4096x4096 k8
#   57.5 / 74.9, 64x128256 k50 - / 80.8, 256x151936 k64 - / 206.6; bf16 65.4 / 61.5,
#   108.4 / 73.4, 56.2 / 74.8, - / 76.0, - / 185.6.
#   block 1024, 4 warps: fp32 70.5 / 77.2, 100.5 / 103.2, 67.1 / 125.9, - / 89.9, - / 195.1;
#   bf16 58.8 / 68.0, 80.3 / 75.9, 63.8 / 124.9, - / 84.0, - / 167.9.
#   block 2048, 8 warps: fp32 63.4 / 117.3, 89.6 / 108.8, 108.8 / 246.1, - / 119.8, - / 223.0;
#   bf16 58.1 / 107.7, 69.5 / 99.3, 107.7 / 237.5, - / 98.2, - / 196.4.
# (The running list, kernel time in a CUDA graph in the 13:47 bench: 64x128256 k50 137 us,
# 256x151936 k64 447.)
# So: lanes of TOPK_LANE_BLOCK with TOPK_WARPS warps keep one when k <= TOPK_LANE_BEST_MAX_K and a
# chunk spans at most TOPK_LANE_KEEP1_MAX_BLOCKS blocks, else two; k above TOPK_LANE_WIDE_ABOVE_K
# takes TOPK_LANE_WIDE_BLOCK lanes (three of the top k in one lane: 15% of chunks at k = 64 with
# 512 lanes, 4% with 1024). Where the rule is not the fastest measured: bf16 1024x25000 k5 61.5 us
# against 58.1 (one kept, 2048 lanes, 8 warps), bf16 256x151936 k5 73.4 against 69.5 (same).
TOPK_LANE_BEST_MAX_K = 16
TOPK_LANE_KEEP2_MAX_K = 64
# What a lane selection reads again when some lane held more of the top k than it kept: "chunk",
# the whole chunk into the running list (every element at or above the kept k-th value, about k
# of them, inserted one by one), or "lanes", only the suspect lanes' other elements (the rest of
# every other lane is below the kept k-th value), inserted into the kept list: a few masked loads
# and one reduction per block, and a handful of insertions. "lanes" costs registers (the kept
# columns stay live through the selection; ptxas for sm_90, fp32: 64 -> 80 per thread keeping two
# at 1024x25000 k5, 64 -> 72 at k = 50, 96 -> 122 at k = 64; keeping one at 4096x4096 k8 stays at
# 48), which only pays where second reads are common. H100, scripts/sweep_topk.py (19:15 UTC run,
# benchmarks/results/sweep_topk_second_read-h100.log), kernel time in CUDA graphs, chunk / lanes,
# us, the plan's lanes: keeping one, 4096x4096 k8 fp32 57.8 / 53.6, bf16 56.2 / 52.1; keeping two,
# k = 5: 1024x25000 fp32 54.8 / 68.8, bf16 55.4 / 58.0, 256x151936 fp32 75.9 / 84.7, bf16 73.6 /
# 69.1; k = 50 (512 lanes): 64x128256 fp32 80.1 / 43.9, bf16 77.1 / 40.9; k = 64 (1024 lanes):
# 256x151936 fp32 196.8 / 131.1, bf16 168.8 / 108.0. So: "lanes" keeping one, and keeping two
# with k > TOPK_CHUNK_READ_MAX_K; "chunk" keeping two up to it.
TOPK_SECOND_READS = ("chunk", "lanes")
TOPK_CHUNK_READ_MAX_K = 16
TOPK_LANE_BLOCK = 512
TOPK_LANE_KEEP1_MAX_BLOCKS = 8
TOPK_LANE_WIDE_ABOVE_K = 50
TOPK_LANE_WIDE_BLOCK = 1024
# Above TOPK_LANE_KEEP2_MAX_K the lanes keep one: their list is one sorting network (tl.topk) over
# the lanes' best, and the suspect lanes (about k^2 / (2 lanes) a chunk) are read again. H100,
# 128x262144 k256, kernel time in CUDA graphs (benchmarks/results/sweep_topk_k256_lanes-h100.log),
# lanes x warps: fp32 1024x4 244 us, 2048x4 253, 2048x8 282, 4096x8 362; bf16 244, 223, 273, 258;
# the running list 710 fp32 / 694 bf16 (and torch's softmax then topk 721 / 456).
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
    k_pow2 = max(2, next_power_of_2(k))
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


_last_topk_plan: TopkPlan | None = None


def record_topk(chosen: TopkPlan) -> None:
    global _last_topk_plan
    _last_topk_plan = chosen


def last_topk_plan() -> TopkPlan | None:
    """The plan of the most recent softmax_topk launch in this process (tests assert which path ran)."""
    return _last_topk_plan
