"""softmax_topk launchers, on a 2-d (rows, cols) view (the public function moves ``dim`` last)."""

from __future__ import annotations

from typing import Optional

import torch

from ... import _buffers, cpu
from ..._device import interpreter_active, next_power_of_2, plan_cache, remember
from ..._launch import Launcher, aligned
from . import plan as planner
from .kernels import EMPTY_KEY, topk_backward_kernel, topk_merge_kernel, topk_shard_merge_kernel, topk_stream_kernel


def _row_align(x2: torch.Tensor, is_aligned: bool) -> int:
    # Elements per 16-byte load when every row starts and ends on a 16-byte boundary (else 1).
    # ``is_aligned``: ``aligned(x2)``, which the launcher has already computed for its key.
    # Triton proves alignment only from integers divisible by 16, so rows of 25000 fp32 (100000
    # bytes) would be read 4 bytes per load instruction: the kernels take this as a hint instead.
    vector = 16 // x2.element_size()
    whole = x2.stride(1) == 1 and x2.stride(0) % vector == 0 and x2.shape[1] % vector == 0 and is_aligned
    return vector if whole else 1


def rows_view(x: torch.Tensor, dim: int) -> torch.Tensor:
    # A view whenever the other dims merge into one row stride (contiguous input, slices of the
    # last dim, transposes of 2-d tensors); a copy otherwise.
    return x.movedim(dim, -1).reshape(-1, x.shape[dim])


_topk_stream = Launcher(topk_stream_kernel)
_topk_merge = Launcher(topk_merge_kernel)


_PREPARED: dict = {}
plan_cache(_PREPARED.clear)


class _Prepared:
    """A forward signature's plan, bound launches and buffer templates (see _buffers.template:
    on the H100 machine's host an allocation by shape cost twice one like a template)."""

    __slots__ = ("plan", "stream", "merge", "outputs", "scratch")

    def __init__(self, x2, k, strategy, block, num_chunks, lane_keep, second_read, is_aligned, use_triton, write_lse,
                 values_dtype):
        n_rows, device = x2.shape[0], x2.device
        # values, indices, lse (lse_low takes the lse's template)
        self.outputs = (_buffers.template((n_rows, k), values_dtype, device),
                        _buffers.template((n_rows, k), torch.int64, device),
                        _buffers.template((n_rows,), torch.float32, device))
        self.plan, self.stream, self.merge = _prepare(x2, k, strategy, block, num_chunks, lane_keep, second_read,
                                                      is_aligned, use_triton, write_lse, values_dtype)
        chosen = self.plan
        self.scratch = None
        if chosen is not None and (chosen.strategy == "split" or chosen.compact):
            # Each program's candidate list (split) and compaction scratch (compact plans), then
            # the split's partial (m, d); a single one-by-one launch touches none of them.
            self.scratch = _chunk_scratch(chosen, n_rows, device)


def _chunk_scratch(chosen: planner.TopkPlan, n_rows: int, device: torch.device) -> tuple:
    """Templates of the chunks' candidate lists (int64 keys) and of their (m, d) (float32)."""
    return (_buffers.template((n_rows, chosen.num_chunks, chosen.k_pow2), torch.int64, device),
            _buffers.template((n_rows, chosen.num_chunks), torch.float32, device))


def _stream_meta(chosen: planner.TopkPlan, x2: torch.Tensor, is_aligned: bool, write_lse: bool) -> dict:
    """The stream kernel's constexprs and warps for a plan, but FINAL."""
    return dict(BLOCK=chosen.block, K_POW2=chosen.k_pow2, FEW_SURVIVORS=planner.TOPK_FEW_SURVIVORS,
                COMPACT=chosen.compact, LANE_KEEP=chosen.lane_keep, READ_SUSPECT_LANES=chosen.second_read == "lanes",
                CONTIGUOUS=x2.stride(1) == 1, ROW_ALIGN=_row_align(x2, is_aligned), WRITE_LSE=write_lse,
                num_warps=chosen.num_warps)


def _prepare(x2, k, strategy, block, num_chunks, lane_keep, second_read, is_aligned, use_triton, write_lse,
             values_dtype):
    """(plan, bound stream launch, bound merge launch or None) of a forward signature; (None, None,
    None) for the torch path."""
    n_rows, n_cols = x2.shape
    if not use_triton or k == 0 or k > planner.TOPK_MAX_K or n_rows == 0:
        return None, None, None
    chosen = planner.topk_plan(n_rows, n_cols, k, x2.dtype, x2.device, strategy, block, num_chunks,
                               lane_keep=lane_keep, second_read=second_read)
    # The plan fixes every integer argument but x's strides; with x's alignment they complete the
    # compiled-kernel key (see onlinesoftmax._launch), with the values' dtype (their stores cast to it).
    launch_key = (chosen, x2.stride(0), x2.stride(1), is_aligned, planner.TOPK_FEW_SURVIVORS, write_lse, values_dtype)
    common = _stream_meta(chosen, x2, is_aligned, write_lse)
    if chosen.strategy == "single":
        return chosen, _topk_stream.bind((n_rows, 1), launch_key, FINAL=True, **common), None
    stream = _topk_stream.bind((n_rows, chosen.num_chunks), launch_key, FINAL=False, **common)
    merge = _topk_merge.bind((n_rows,), (chosen, write_lse, values_dtype), K_POW2=chosen.k_pow2,
                             CHUNKS_POW2=next_power_of_2(chosen.num_chunks), WRITE_LSE=write_lse,
                             num_warps=planner.TOPK_MERGE_WARPS)
    return chosen, stream, merge


def launch_forward(x2: torch.Tensor, k: int, temperature: float, strategy: Optional[str] = None,
                   block: Optional[int] = None, num_chunks: Optional[int] = None, float32_values: bool = False,
                   lane_keep: Optional[int] = None, second_read: Optional[str] = None, write_lse: bool = True):
    """(values, indices, lse, lse_low) of a (rows, cols) tensor, lse + lse_low being the lse in two
    floats (the backward's; see _triton.split_lse); the values in x's dtype, or float32
    (``float32_values``: torch's autocast policy for the softmax). ``strategy``/``block``/
    ``num_chunks``/``lane_keep``/``second_read`` force the plan. ``write_lse=False``: the kernels
    leave the lse out and both are returned as None where they run (two allocations fewer for a
    caller that drops it)."""
    n_rows, n_cols = x2.shape
    is_aligned = aligned(x2)
    # Everything but the tensors is decided once per signature: a decode step calls this once per
    # generated token, and the host's Python is most of a small call's time.
    signature = (x2.shape, x2.stride(), x2.dtype, x2.device, k, strategy, block, num_chunks, lane_keep, second_read,
                 is_aligned, write_lse, float32_values, x2.is_cuda or interpreter_active())
    prepared = _PREPARED.get(signature)
    if prepared is None:
        prepared = remember(_PREPARED, signature, _Prepared(x2, k, strategy, block, num_chunks, lane_keep,
                                                            second_read, is_aligned, signature[-1], write_lse,
                                                            torch.float32 if float32_values else x2.dtype))
    chosen, stream, merge = prepared.plan, prepared.stream, prepared.merge
    values, indices = _buffers.empty_like(prepared.outputs[0]), _buffers.empty_like(prepared.outputs[1])
    if chosen is None:
        lse, lse_low = (_buffers.empty_like(prepared.outputs[2]) for _ in range(2))
        if n_rows:
            cpu.softmax_topk(x2, k, 1.0 / temperature, values, indices, lse, lse_low)
        return values, indices, lse, lse_low
    # Without the lse its pointer arguments are placeholders the kernels never read or write.
    lse, lse_low = (_buffers.empty_like(prepared.outputs[2]) for _ in range(2)) if write_lse else (None, None)
    lse_arg, lse_low_arg = (values, values) if lse is None else (lse, lse_low)
    planner.record_topk(chosen)
    inv_t = 1.0 / temperature
    part_keys = indices if prepared.scratch is None else _buffers.empty_like(prepared.scratch[0])
    if merge is None:
        stream(x2, values, indices, lse_arg, lse_low_arg, lse_arg, lse_arg, part_keys, n_cols, k, x2.stride(0),
               x2.stride(1), k, n_cols, 1, inv_t)
        return values, indices, lse, lse_low
    part_m, part_d = (_buffers.empty_like(prepared.scratch[1]) for _ in range(2))
    stream(x2, values, indices, lse_arg, lse_low_arg, part_m, part_d, part_keys, n_cols, k, x2.stride(0),
           x2.stride(1), k, chosen.chunk_size, chosen.num_chunks, inv_t)
    merge(part_m, part_d, part_keys, values, indices, lse_arg, lse_low_arg, k, k, chosen.num_chunks)
    return values, indices, lse, lse_low


# --------------------------------------------------------------------------------------------
# A row sharded across ranks (onlinesoftmax.distributed.softmax_topk): one partial a row on each
# rank, all of them merged on every rank
# --------------------------------------------------------------------------------------------

_topk_shard_merge = Launcher(topk_shard_merge_kernel)
_SHARD_PREPARED: dict = {}
plan_cache(_SHARD_PREPARED.clear)


def shard_layout(rows: int, k: int) -> tuple:
    """(k_pow2, md_start, md_plane, sizes_at, length): a rank's payload for a sharded top-k of
    ``rows`` rows, in int64 slots: ``rows * k_pow2`` keys from slot 0, the m and the d planes
    (float32, ``md_plane`` floats each) from slot md_start, the shard size at slot sizes_at.
    Every segment starts on 16 bytes, so its views keep the alignment the compiled kernels are
    keyed with, and the length is even, so every rank's row of the gathered payloads does too."""
    k_pow2 = planner.list_length(k)
    md_start = rows * k_pow2
    md_plane = -(-rows // 4) * 4
    sizes_at = md_start + md_plane  # the two planes fill md_plane int64 slots
    return k_pow2, md_start, md_plane, sizes_at, sizes_at + 2


def _shard_partial_launches(x2: torch.Tensor, k: int, is_aligned: bool):
    """(plan, stream, fold or None, scratch templates or None) of a shard's partials: the chunks'
    stream, then, where the plan splits the row, the merge launch folding them into one."""
    n_rows, n_cols = x2.shape
    chosen = planner.topk_plan(n_rows, n_cols, k, x2.dtype, x2.device)
    key = ("shard", chosen, x2.stride(0), x2.stride(1), is_aligned, planner.TOPK_FEW_SURVIVORS)
    stream = _topk_stream.bind((n_rows, chosen.num_chunks), key, FINAL=False,
                               **_stream_meta(chosen, x2, is_aligned, False))
    if chosen.num_chunks == 1:
        return chosen, stream, None, None
    fold = _topk_merge.bind((n_rows,), ("shard", chosen), K_POW2=chosen.k_pow2,
                            CHUNKS_POW2=next_power_of_2(chosen.num_chunks), WRITE_LSE=False, PARTIAL=True,
                            num_warps=planner.TOPK_MERGE_WARPS)
    return chosen, stream, fold, _chunk_scratch(chosen, n_rows, x2.device)


def launch_shard_partial(x2: torch.Tensor, k: int, temperature: float, keys: torch.Tensor, part_m: torch.Tensor,
                         part_d: torch.Tensor) -> None:
    """Write the (m, d) of every row of ``x2 / temperature`` and its best ``min(k, cols)`` columns
    as a sorted list of a k-sized list's keys (this shard's own columns; empty slots after them)
    into ``keys`` (rows, k_pow2), ``part_m`` and ``part_d`` (rows): views of a shard_layout payload.
    CUDA tensors (or the interpreter), k <= planner.TOPK_MAX_K."""
    n_rows, n_cols = x2.shape
    if n_cols == 0 or n_rows == 0:
        keys.fill_(EMPTY_KEY.value)
        part_m.fill_(float("-inf"))
        part_d.zero_()
        return
    is_aligned = aligned(x2)
    signature = (x2.shape, x2.stride(), x2.dtype, x2.device, k, is_aligned)
    prepared = _SHARD_PREPARED.get(signature)
    if prepared is None:
        prepared = remember(_SHARD_PREPARED, signature, _shard_partial_launches(x2, k, is_aligned))
    chosen, stream, fold, scratch = prepared
    planner.record_topk(chosen)
    # The plan's list holds the k that every rank's payload is sized for; a shorter shard selects
    # all of its columns (the kernels take any k up to the list's length).
    k_here = min(k, n_cols)
    if fold is None:
        stream(x2, keys, keys, part_m, part_d, part_m, part_d, keys, n_cols, k_here, x2.stride(0), x2.stride(1),
               k, n_cols, 1, 1.0 / temperature)
        return
    chunk_keys, chunk_m, chunk_d = (_buffers.empty_like(scratch[0]), _buffers.empty_like(scratch[1]),
                                    _buffers.empty_like(scratch[1]))
    stream(x2, keys, keys, part_m, part_d, chunk_m, chunk_d, chunk_keys, n_cols, k_here, x2.stride(0), x2.stride(1),
           k, chosen.chunk_size, chosen.num_chunks, 1.0 / temperature)
    fold(chunk_m, chunk_d, chunk_keys, keys, keys, part_m, part_d, k_here, k, chosen.num_chunks)


def launch_shard_merge(gathered: torch.Tensor, rows: int, k: int, values_dtype: torch.dtype, write_lse: bool = True):
    """(values (rows, k) in values_dtype, int64 global indices (rows, k), lse (rows,) float32, or
    None without ``write_lse``) of the rows whose partials every rank wrote (launch_shard_partial)
    and an all_gather collected in ``gathered`` (world, length) int64, merged in one launch."""
    world = gathered.shape[0]
    k_pow2, md_start, md_plane, sizes_at, length = shard_layout(rows, k)
    device = gathered.device
    values = _buffers.empty((rows, k), values_dtype, device)
    indices = _buffers.empty((rows, k), torch.int64, device)
    # Without the lse its pointers are placeholders the kernel never writes (two allocations fewer).
    lse, lse_low = ((_buffers.empty((rows,), torch.float32, device), _buffers.empty((rows,), torch.float32, device))
                    if write_lse else (values, values))
    if rows:
        _topk_shard_merge((rows,), (world, rows, k, values_dtype, write_lse), gathered, gathered.view(torch.float32),
                          values, indices, lse, lse_low, world, k, k, length, md_start, md_plane, sizes_at,
                          K_POW2=k_pow2, WORLD_POW2=max(2, next_power_of_2(world)), WRITE_LSE=write_lse,
                          num_warps=planner.TOPK_MERGE_WARPS)
    return values, indices, lse if write_lse else None


def launch_backward(x2: torch.Tensor, lse: torch.Tensor, lse_low: torch.Tensor, indices: torch.Tensor,
                    dv: torch.Tensor, dlse: torch.Tensor, temperature: float, strategy: Optional[str] = None,
                    block: Optional[int] = None, num_chunks: Optional[int] = None) -> torch.Tensor:
    """dx (rows, cols), contiguous, in x's dtype, for upstream gradients of the values and the lse."""
    n_rows, n_cols = x2.shape
    k = indices.shape[1]
    dx = _buffers.empty((n_rows, n_cols), x2.dtype, x2.device)
    if x2.numel() == 0:
        return dx
    if not (x2.is_cuda or interpreter_active()) or k > planner.TOPK_MAX_K:
        cpu.softmax_topk_backward(x2, lse, lse_low, indices, dv, dlse, 1.0 / temperature, dx)
        return dx
    # The backward streams x once whatever the forward's selection was: its blocks follow the
    # running-list plans (lane_keep=0), which is what its timings were taken with.
    chosen = planner.topk_plan(n_rows, n_cols, max(k, 1), x2.dtype, x2.device, strategy, block, num_chunks,
                               lane_keep=0)
    topk_backward_kernel[(n_rows, chosen.num_chunks)](
        x2, lse, lse_low, indices.contiguous(), dv.contiguous(), dlse.float().contiguous(), dx,
        n_cols, k, x2.stride(0), x2.stride(1), chosen.chunk_size, 1.0 / temperature,
        BLOCK=chosen.block, K_POW2=chosen.k_pow2, CONTIGUOUS=x2.stride(1) == 1, ROW_ALIGN=_row_align(x2, aligned(x2)),
        num_warps=chosen.num_warps)
    return dx


# --------------------------------------------------------------------------------------------
