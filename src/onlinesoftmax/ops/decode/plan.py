"""Launch decisions of decode attention (flash-decoding) and of merge_attention, as tables.

Paths
-----
``direct``
    One program per (sequence, KV head, row block) covers the whole sequence and writes the output:
    no partials, no merge launch. Taken when splitting cannot help (the longest possible sequence
    is under two chunks), when the batch alone fills the GPU with uniform lengths, or when
    ``num_splits=1`` forces it.
``split``
    Keys cut into splits (flash-decoding): a split launch writes partials, a merge launch combines
    them. How many splits each sequence gets is decided on the device from ``cache_seqlens``
    (kernels.sequence_splits), within the bounds the host sets here from what it knows without
    reading the lengths: batch, KV heads, query rows, the longest possible sequence (the cache's
    S_max, or max_blocks x page_size) and the SM count.
``torch``
    CPU tensors without the interpreter: gather the cache, masked softmax in fp32 (op.py).

Nothing here touches CUDA at import; :func:`decode_plan` is cached and registered with
``_device.plan_cache`` so that ``override_plan("decode", ...)`` re-plans.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ... import _device

# ---- The split kernel's tiles -------------------------------------------------------------------
# Elements of a K (and of a V) tile per key block: BLOCK_N = KEY_TILE_ELEMENTS / padded head dim,
# within [16, 128]. 16 KB of K and 16 KB of V per stage at 2 bytes (D128: 64 keys; D64: 128;
# D256: 32): two buffers of each (NUM_STAGES) are 64 KB of shared memory, three programs an H100
# SM (228 KB; 115-182 registers a thread also allow three), each with a block of loads in flight
# while it computes on the one before.
KEY_TILE_ELEMENTS = 8192
MIN_BLOCK_N, MAX_BLOCK_N = 16, 128
# Software-pipelining stages of the key loop, by page lookup. Triton 3.6's pipeliner gives a load
# whose address comes from another load of the loop (the block table's page) an earlier stage, so
# a paged loop needs two stages more than a contiguous one for the same two K/V buffers and a wait
# that leaves the next block's loads in flight (sm_90 compile, D128 bf16: contiguous at 3 stages:
# 2 buffers, 70 KB shared, 115 registers; paged at 3 or 4 stages: 1 buffer and a wait for every
# load before each block's math; at 5 stages: 2 buffers, 72 KB, 144-182 registers).
NUM_STAGES = {"none": 3, "per block": 5, "per key": 5}
NUM_WARPS = 4  # a 16-row tile's two products and softmax need no more; more warps would only split the loads
# Most query rows (query heads of a group x queries) one program holds, by padded head dim: the
# fp32 accumulator BLOCK_M x BLOCK_D stays at 64 registers a thread at NUM_WARPS warps. More rows
# go to further row blocks, which read the same K/V (from L2: they are adjacent in the grid).
MAX_ROWS = {16: 64, 32: 64, 64: 64, 128: 64, 256: 32}
MIN_ROWS = 16  # tl.dot's smallest M: fewer rows are padded (the tensor cores have time to spare)
MIN_BLOCK_D = 16  # tl.dot's smallest K: head dims under 16 are padded (masked loads, zeros)
# Programs an SM holds at once at these tiles (shared memory and registers, above): what "a wave" means.
PROGRAMS_PER_SM = 3

# ---- How many splits ------------------------------------------------------------------------------
# The split launch aims at this many waves of programs: with several programs per slot the last
# ones to finish are short, so the tail where few SMs still read is short too; more waves add
# partials and per-program start-up (a q load, the pipeline's first loads). H100, bf16, CUDA-graph
# us (scripts/tune/sweep_decode.py, docs/notes/2026-11/sweep_decode-h100.log), 4 waves -> 2:
# B1 32/8 128K 191.9 -> 187.8, B64 4K 373.5 -> 372.4, B128 1K page 16 207.0 -> 195.4, D64 109.2 ->
# 107.3, MQA and Sq 4 rows level; 1 wave lost 13% at D64 and 2% at B64, 8 waves 1-2% everywhere.
TARGET_WAVES = 2
# No split shorter than this many keys: each program pays a fixed start (lengths, q, the first
# loads' latency) that must stay small against its share of the stream (256 keys x D128 x 2
# tensors x 2 bytes = 128 KB, ~11 us of one program's share of an SM's bandwidth).
MIN_SPLIT_KEYS = 256
# ... and no split so short that its partial (rows x (D + 1) fp32, written, then read by the
# merge) is more than this fraction of the K/V bytes it reads: many rows (GQA group x queries)
# need longer splits, unless that leaves fewer programs than the GPU holds (_min_split_keys),
# and a batch that fills the GPU at full length then takes the direct path. The same sweep, 1/16
# -> 1/64: the skewed Sq 4 batch 94.0 -> 79.4 us (longer splits of its short sequences), B128 1K
# 207.0 -> 189.6 (direct: 1024 programs, no merge), B64 4K 373.5 -> 368.0, MQA 36.9 -> 35.5,
# others level (+0.5% at most); 1/4 lost up to 13%.
PARTIAL_BYTES_FRACTION = 1 / 64
# Uniform lengths (no cache_seqlens) with at least this many waves of (sequence, KV head, row
# block) programs take the direct path: every program has the same work, so the batch alone
# balances and the merge launch would be pure cost.
DIRECT_MIN_WAVES = 2
# The split path reads the batch's lengths as one vector in every program (prefix sums): batches
# above this take the direct path (they have B x Hkv >= 1024 programs anyway).
SPLIT_MAX_BATCH = 1024

# ---- The merge --------------------------------------------------------------------------------
# Elements of a merge program's [rows, partials, head dim] fp32 tile: 16 KB of loads in flight,
# 32 registers a thread at MERGE_WARPS.
MERGE_TILE_ELEMENTS = 4096
MERGE_WARPS = 4
# The merge narrows its head-dim block (down to MERGE_MIN_BLOCK_D) until it has this many programs
# an SM: a batch-1 merge has only Hq x Sq rows, each with up to hundreds of partials.
MERGE_PROGRAMS_PER_SM = 2
MERGE_MIN_BLOCK_D = 32

# ---- Limits -----------------------------------------------------------------------------------
MAX_GRID_Y = 65535  # CUDA's limit on the grid's second axis (sequences, or split slots)

# ---- The interpreter ------------------------------------------------------------------------
# Small tiles keep interpreted tests fast and make small test sizes cross several key blocks,
# row blocks, splits and page-table lookups of both kinds (pages of 16 are smaller than its key
# block of 32, pages of 32 and 64 are not).
INTERPRETER_BLOCK_N = 32
INTERPRETER_MAX_ROWS = 16
INTERPRETER_MIN_SPLIT_KEYS = 32

PATHS = ("direct", "split", "torch")


@dataclasses.dataclass(frozen=True)
class Plan:
    """One decode launch decision (printed by ``onlinesoftmax explain``, asserted by the tests)."""

    path: str
    dtype: torch.dtype
    batch: int
    heads_q: int
    heads_kv: int
    n_queries: int
    head_dim: int
    capacity: int  # the longest possible sequence: S_max, or max_blocks x page_size
    page_size: int  # 0: contiguous cache
    has_seqlens: bool
    sms: int = 0
    block_m: int = 0
    block_n: int = 0
    block_d: int = 0
    row_blocks: int = 1
    num_warps: int = NUM_WARPS
    num_stages: int = 0
    page_lookup: str = "none"  # "per block" (pages >= key block) | "per key" | "none" (contiguous)
    num_splits: int = 0  # forced splits per sequence; 0: automatic
    slots: int = 0  # split path: the grid's slots a KV head (an upper bound on the batch's splits)
    target_splits: int = 0  # automatic: splits a KV head aimed at over the whole batch
    min_chunk_blocks: int = 0  # automatic: the shortest split, in key blocks
    merge_block_r: int = 0
    merge_block_p: int = 0
    merge_block_d: int = 0
    merge_warps: int = MERGE_WARPS
    reason: str = ""

    @property
    def grid(self) -> tuple:
        return (self.heads_kv * self.row_blocks, self.slots if self.path == "split" else self.batch)

    @property
    def merge_grid(self) -> tuple:
        return (_device.cdiv(self.n_queries * self.heads_q, self.merge_block_r),
                _device.cdiv(self.head_dim, self.merge_block_d), self.batch)

    def describe(self) -> str:
        group = self.heads_q // self.heads_kv
        cache = (f"paged cache, pages of {self.page_size}" if self.page_size else "contiguous cache")
        lines = [f"decode attention (flash-decoding), {str(self.dtype)[6:]}: batch {self.batch}, heads "
                 f"{self.heads_q}/{self.heads_kv} (group {group}), {self.n_queries} "
                 f"quer{'y' if self.n_queries == 1 else 'ies'}, head dim {self.head_dim}, {cache}, longest "
                 f"possible sequence {self.capacity} keys ({'per-sequence lengths' if self.has_seqlens else 'every sequence full'})",
                 f"  path: {self.path} ({self.reason})"]
        if self.path == "torch":
            return "\n".join(lines)
        rows = group * self.n_queries
        queries = f"{self.n_queries} quer{'y' if self.n_queries == 1 else 'ies'}"
        lines.append(f"  program: {rows} rows ({group} query heads x {queries}) in "
                     f"{self.row_blocks} block(s) of {self.block_m}, key blocks of {self.block_n}, head dim "
                     f"padded to {self.block_d}, {self.num_warps} warps, {self.num_stages} stages, page lookup: "
                     f"{self.page_lookup}")
        kv_bytes = self.batch * self.capacity * self.heads_kv * self.head_dim * 2 * self.dtype.itemsize
        lines.append(f"  K/V bytes at full length: {kv_bytes / 1e6:.1f} MB")
        if self.path == "direct":
            lines.append(f"  grid {self.grid}: {self.grid[0] * self.grid[1]} programs for {self.sms} SMs "
                         f"x {PROGRAMS_PER_SM} resident; output written directly, no merge launch")
            return "\n".join(lines)
        if self.num_splits:
            how = f"each sequence cut into {self.num_splits} splits of whole key blocks (forced; fewer if shorter)"
        else:
            how = (f"the batch's key blocks over {self.target_splits} splits a KV head ({self.sms} SMs x "
                   f"{PROGRAMS_PER_SM} programs x {TARGET_WAVES} waves / {self.heads_kv * self.row_blocks} "
                   f"programs a split), splits of at least {self.min_chunk_blocks * self.block_n} keys, "
                   "each sequence's count decided on the device from its length")
        lines.append(f"  splits: {how}; grid {self.grid}, {self.grid[0] * self.grid[1]} programs at most "
                     "(those past the batch's splits exit at once); one-split sequences write the output")
        lines.append(f"  merge: grid {self.merge_grid}, tiles of {self.merge_block_r} rows x {self.merge_block_p} "
                     f"partials x {self.merge_block_d} dims, {self.merge_warps} warps; partials fp32, "
                     f"at most {self.slots * self.heads_q * self.n_queries * (self.head_dim + 1) * 4 / 1e6:.2f} MB")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class MergePlan:
    path: str  # "triton" | "torch"
    n_parts: int
    rows: int
    head_dim: int
    block_r: int = 0
    block_p: int = 0
    block_d: int = 0
    num_warps: int = MERGE_WARPS

    @property
    def grid(self) -> tuple:
        return (_device.cdiv(self.rows, self.block_r), _device.cdiv(self.head_dim, self.block_d))

    def describe(self) -> str:
        if self.path == "torch":
            return f"merge_attention: torch (CPU), {self.n_parts} partials of {self.rows} rows x {self.head_dim}"
        return (f"merge_attention: {self.n_parts} partials of {self.rows} rows x {self.head_dim}; grid {self.grid}, "
                f"tiles of {self.block_r} rows x {self.block_p} partials x {self.block_d} dims, {self.num_warps} warps")


def merge_tiles(rows: int, parts: int, head_dim: int, groups: int, sms: int) -> tuple[int, int, int]:
    """(rows, partials, head dims) of a merge program's tile for ``groups`` x ``rows`` rows of up to
    ``parts`` partials each."""
    block_d = _device.next_power_of_2(head_dim)
    while block_d > MERGE_MIN_BLOCK_D and groups * rows * _device.cdiv(head_dim, block_d) < MERGE_PROGRAMS_PER_SM * sms:
        block_d //= 2
    block_p = min(_device.next_power_of_2(max(parts, 1)), max(1, MERGE_TILE_ELEMENTS // block_d))
    block_r = min(_device.next_power_of_2(max(rows, 1)), max(1, MERGE_TILE_ELEMENTS // (block_p * block_d)))
    return block_r, block_p, block_d


def _key_block(block_d: int, interpreting: bool) -> int:
    if interpreting:
        return INTERPRETER_BLOCK_N
    return min(MAX_BLOCK_N, max(MIN_BLOCK_N, KEY_TILE_ELEMENTS // block_d))


def _min_split_keys(rows: int, head_dim: int, elem: int, full_wave_keys: int, interpreting: bool) -> int:
    """The shortest split: MIN_SPLIT_KEYS, or longer so that the partials stay within
    PARTIAL_BYTES_FRACTION of the K/V bytes, unless that would leave fewer programs than one wave
    at full length (``full_wave_keys``): idle SMs cost more than partial bytes."""
    floor = INTERPRETER_MIN_SPLIT_KEYS if interpreting else MIN_SPLIT_KEYS
    partial_bytes = 2 * rows * (head_dim + 1) * 4  # written by the split, read by the merge
    partial_keys = _device.cdiv(int(partial_bytes / PARTIAL_BYTES_FRACTION), 2 * head_dim * elem)
    return max(floor, min(partial_keys, full_wave_keys))


@functools.lru_cache(maxsize=4096)
def decode_plan(batch: int, heads_q: int, heads_kv: int, n_queries: int, head_dim: int, capacity: int,
                page_size: int, dtype: torch.dtype, has_seqlens: bool, num_splits: int, on_cuda: bool,
                sms: int, interpreting: bool) -> Plan:
    """The plan for one call shape. ``num_splits`` 0 is "auto"; ``sms`` the device's SM count
    (the interpreter's stand-in off CUDA)."""
    shape = dict(dtype=dtype, batch=batch, heads_q=heads_q, heads_kv=heads_kv, n_queries=n_queries,
                 head_dim=head_dim, capacity=capacity, page_size=page_size, has_seqlens=has_seqlens)
    if not on_cuda and not interpreting:
        return Plan("torch", reason="CPU tensors without TRITON_INTERPRET=1: gathered cache, fp32 masked softmax",
                    **shape)
    group = heads_q // heads_kv
    rows = group * n_queries
    block_d = max(MIN_BLOCK_D, _device.next_power_of_2(head_dim))
    block_n = _key_block(block_d, interpreting)
    max_rows = INTERPRETER_MAX_ROWS if interpreting else MAX_ROWS[block_d]
    block_m = min(max(MIN_ROWS, _device.next_power_of_2(rows)), max(max_rows, MIN_ROWS))
    row_blocks = _device.cdiv(rows, block_m)
    page_lookup = "none" if not page_size else ("per block" if page_size % block_n == 0 else "per key")
    tiles = dict(sms=sms, block_m=block_m, block_n=block_n, block_d=block_d, row_blocks=row_blocks,
                 num_warps=NUM_WARPS, num_stages=NUM_STAGES[page_lookup], page_lookup=page_lookup)

    if num_splits > 1:
        # The slots of a launch sit on the grid's second axis.
        num_splits = min(num_splits, MAX_GRID_Y // max(batch, 1))
    cap_blocks = _device.cdiv(capacity, block_n)
    programs = batch * heads_kv * row_blocks
    resident = sms * PROGRAMS_PER_SM
    min_keys = _min_split_keys(rows, head_dim, dtype.itemsize, programs * capacity // resident, interpreting)
    min_chunk = _device.cdiv(min_keys, block_n)
    tiles["num_splits"] = num_splits
    if num_splits == 1:
        return Plan("direct", reason="num_splits=1", **shape, **tiles)
    if num_splits > 1:
        slots = batch * min(num_splits, max(cap_blocks, 1))
        reason = f"num_splits={num_splits}"
        target = 0
    else:
        if cap_blocks < 2 * min_chunk:
            return Plan("direct", reason=f"the longest possible sequence ({capacity} keys) is under two splits of "
                        f"{min_chunk * block_n} keys", **shape, **tiles)
        if batch > SPLIT_MAX_BATCH:
            return Plan("direct", reason=f"batch {batch} > {SPLIT_MAX_BATCH}: {programs} programs", **shape, **tiles)
        if not has_seqlens and programs >= DIRECT_MIN_WAVES * resident:
            return Plan("direct", reason=f"uniform lengths and {programs} programs fill {programs / resident:.1f} "
                        f"waves of {resident}", **shape, **tiles)
        target = max(1, TARGET_WAVES * resident // (heads_kv * row_blocks))
        # Splits a sequence can get: at most a chunk of min_chunk blocks each, at least one each.
        slots = min(target + batch, batch * max(1, _device.cdiv(cap_blocks, min_chunk)))
        reason = (f"{programs} (sequence, KV head, row block) programs for {resident} resident: "
                  f"splits balance the lengths" if has_seqlens else
                  f"{programs} (sequence, KV head, row block) programs under {DIRECT_MIN_WAVES} waves of {resident}")
    most_parts = min(slots, num_splits if num_splits else _device.cdiv(cap_blocks, min_chunk))
    merge_r, merge_p, merge_d = merge_tiles(n_queries * heads_q, most_parts, head_dim, batch, sms)
    return Plan("split", reason=reason, slots=slots, target_splits=target, min_chunk_blocks=min_chunk,
                merge_block_r=merge_r, merge_block_p=merge_p, merge_block_d=merge_d, merge_warps=MERGE_WARPS,
                **shape, **tiles)


@functools.lru_cache(maxsize=1024)
def merge_plan(n_parts: int, rows: int, head_dim: int, on_triton: bool, sms: int) -> MergePlan:
    if not on_triton:
        return MergePlan("torch", n_parts, rows, head_dim)
    block_r, block_p, block_d = merge_tiles(rows, n_parts, head_dim, 1, sms)
    return MergePlan("triton", n_parts, rows, head_dim, block_r, block_p, block_d, MERGE_WARPS)


_device.plan_cache(decode_plan.cache_clear)
_device.plan_cache(merge_plan.cache_clear)

_last: dict = {}


def record(chosen) -> None:
    _last[type(chosen)] = chosen


def last_plan() -> Plan | None:
    """The plan of the most recent attention_with_kvcache call."""
    return _last.get(Plan)


def last_merge_plan() -> MergePlan | None:
    """The plan of the most recent merge_attention call."""
    return _last.get(MergePlan)


def explain(batch: int, heads_q: int, heads_kv: int, n_queries: int, head_dim: int, capacity: int,
            page_size: int = 0, dtype: torch.dtype = torch.bfloat16, has_seqlens: bool = True,
            num_splits: int = 0, sms: int = 132) -> str:
    """The GPU plan's description for a call shape, on any machine (``onlinesoftmax explain``)."""
    return decode_plan(batch, heads_q, heads_kv, n_queries, head_dim, capacity, page_size, dtype, has_seqlens,
                       num_splits, True, sms, False).describe()
