"""softmax_topk over a dimension sharded across ranks (``torch.distributed``).

A row's k most probable entries are among the k best of each shard, and its normalizer is the
merge of the shards' (m, d) pairs, so each rank reduces its shard to one partial a row and the
ranks exchange those in one all_gather.

With the Triton kernels (CUDA tensors, or the interpreter; k up to the kernels' list,
``ops/topk/plan.TOPK_MAX_K``) a rank's partial is what the single-GPU op keeps for a chunk of a
row: (m, d) and the sorted list of its best keys (``ops/topk/kernels``: the value's bits and the
column in one int64). A payload holds every row's partial and the shard's size
(``ops/topk/launch.shard_layout``); one kernel writes it (two where the plan splits the shard's
rows into chunks), and after the gather one kernel merges every rank's lists into the row's top k,
the global columns and the probabilities: three or four launches and the collective a call, where
the torch ops below take some thirty.

Otherwise (CPU tensors without the interpreter, larger k, ``strategy="torch"``) each rank sends
its candidates' logits, int64 indices and log-sum-exp in one byte buffer and every rank selects
the same top k with torch's sorts.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .. import _autocast, _buffers, cpu
from ..ops.topk import launch as topk_launch
from ..ops.topk.plan import TOPK_MAX_K
from ._group import all_gather, check_group, checked_shard, from_rows, gather_shapes, local_strategy, rows_view


def softmax_topk(x_shard: torch.Tensor, k: int, dim: int = -1, group=None, *, temperature: float = 1.0,
                 sorted: bool = True, return_lse: bool = False, validate: bool = True,
                 strategy: Optional[str] = None):
    """The k most probable entries of a softmax over a dimension sharded across ranks.

    Parameters
    ----------
    x_shard : Tensor
        This rank's contiguous shard of ``dim`` (as :func:`softmax`).
    k : int
        How many entries to return; at most the total size of ``dim`` over all ranks (checked with
        ``validate=True``; without the check a larger k leaves index -1 and a NaN value in the slots
        past the row).
    dim, group, validate
        As :func:`softmax`.
    temperature : float
        Divides the logits before the softmax.
    sorted : bool
        Accepted for the signature of :func:`onlinesoftmax.softmax_topk`; the result is always
        sorted by decreasing probability (the global selection sorts the candidates).
    return_lse : bool
        Also return the log-sum-exp of the whole row (of ``x / temperature``), float32.
    strategy : {"split_row", "torch"}, optional
        Testing override of the local compute and the merge: the Triton kernels (where k is at
        most the kernels' list, 256), or torch ops.

    Returns
    -------
    values : Tensor
        Probabilities normalized over the whole row, ``dim`` of size k, dtype of ``x_shard``
        (float32 inside a CUDA autocast region, as :func:`onlinesoftmax.softmax_topk`). Rows that
        torch's softmax makes NaN (a NaN or +inf anywhere, or all -inf) give NaN values and
        indices 0..k-1, as the single-GPU op.
    indices : Tensor
        int64 global indices (shard offset + local index); ties go to the lower global index.
    lse : Tensor, float32, only with ``return_lse``
        Identical on every rank.

    Notes
    -----
    ONE all_gather a call, of every rank's partials (the module docstring): with the kernels
    8 * (list + 1) bytes a row, the list being k rounded up to a power of two; with torch ops
    12 * k + 4. Every rank merges the same bytes in the same order, so every rank returns the same
    bits. Probabilities are ``exp(x / T - m) / d`` from the row's merged pair, as the single-GPU
    op computes them (its float32 rounding: 2 ulp of the value). Not differentiable.
    """
    if _autocast.active_for(x_shard):
        # Inside a CUDA autocast region float32 values, as torch.topk of torch's softmax there.
        values_dtype = torch.float32 if _autocast.float32_result("softmax", x_shard) else None
        with _autocast.off(x_shard.device.type):
            return _softmax_topk(x_shard, k, dim, group, temperature, return_lse, validate, values_dtype, strategy)
    return _softmax_topk(x_shard, k, dim, group, temperature, return_lse, validate, None, strategy)


def _softmax_topk(x_shard, k, dim, group, temperature, return_lse, validate, values_dtype, strategy):
    name = "distributed.softmax_topk"
    x, dim = checked_shard(x_shard, dim, name, temperature)
    check_group(x.device, group, name)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{name}: k must be a positive int, got {k!r}")
    if x.dim() == 0:
        raise ValueError(f"{name}: a 0-d tensor has no dimension to shard")
    chosen = local_strategy(x, strategy, name)
    if validate:
        table = gather_shapes(x, dim, group, name, extra=k)
        total = int(table[:, 3].sum())
        if k > total:
            raise ValueError(f"{name}: k={k} is larger than the sharded dim's total size {total}")
    x2 = rows_view(x, dim)
    values_dtype = values_dtype or x.dtype
    if chosen == "split_row" and k <= TOPK_MAX_K:
        values, indices, lse = _merged_by_kernels(x2, k, temperature, group, values_dtype, return_lse)
    else:
        values, indices, lse = _merged_by_torch(x2, k, temperature, group, values_dtype, chosen)
    out_shape = list(x.shape)
    out_shape[dim] = k
    values, indices = from_rows(values, out_shape, dim), from_rows(indices, out_shape, dim)
    if return_lse:
        return values, indices, lse.reshape(x.shape[:dim] + x.shape[dim + 1:])
    return values, indices


def shard_payload(x2: torch.Tensor, k: int, temperature: float):
    """(payload, its keys, m and d views): a new payload (ops/topk/launch.shard_layout) holding
    the partials of ``x2`` (rows, shard columns) and its shard size."""
    rows, n = x2.shape
    _, md_start, md_plane, sizes_at, length = topk_launch.shard_layout(rows, k)
    payload = _buffers.empty((length,), torch.int64, x2.device)
    planes = payload[md_start:sizes_at].view(torch.float32)
    views = payload[:md_start], planes[:rows], planes[md_plane:md_plane + rows]
    topk_launch.launch_shard_partial(x2, k, temperature, *views)
    payload[sizes_at:sizes_at + 1].fill_(n)
    return (payload, *views)


def _merged_by_kernels(x2, k, temperature, group, values_dtype, return_lse):
    gathered = all_gather(shard_payload(x2, k, temperature)[0], group)  # the one collective: (world, length)
    return topk_launch.launch_shard_merge(gathered, x2.shape[0], k, values_dtype, return_lse)


def _merged_by_torch(x2, k, temperature, group, values_dtype, strategy):
    rows, n = x2.shape
    world = dist.get_world_size(group)
    k_local = min(k, n)
    inv_t = 1.0 / float(temperature)
    if strategy == "torch":
        local_idx = torch.empty((rows, k_local), dtype=torch.int64, device=x2.device)
        lse_pair = torch.empty((2, rows), device=x2.device)
        if k_local:
            cpu.softmax_topk(x2, k_local, inv_t, torch.empty((rows, k_local), dtype=x2.dtype, device=x2.device),
                             local_idx, lse_pair[0], lse_pair[1])
    else:
        # (The kernels where they run; torch's ops above the kernels' list.)
        _, local_idx, *lse_pair = topk_launch.launch_forward(x2, k_local, temperature)
    if not k_local:
        lse_pair = (torch.full((rows,), float("-inf"), device=x2.device), torch.zeros((rows,), device=x2.device))
    cand = torch.gather(x2, 1, local_idx).float() * inv_t
    # Fixed-size payload per rank: [shard size (int64)] + per row [the lse in two floats, k logits,
    # k int64 indices]; a shard with fewer than k columns pads with -inf logits at index -1 (never
    # selected: k <= total).
    cand = torch.nn.functional.pad(cand, (0, k - k_local), value=float("-inf"))
    local_idx = torch.nn.functional.pad(local_idx, (0, k - k_local), value=-1)
    payload = torch.cat([
        torch.full((1,), n, dtype=torch.int64, device=x2.device).view(torch.uint8),  # torch.tensor would synchronize
        torch.cat([lse_pair[0][:, None], lse_pair[1][:, None], cand], 1).contiguous().view(torch.uint8).reshape(-1),
        local_idx.contiguous().view(torch.uint8).reshape(-1),
    ])
    gathered = all_gather(payload, group)  # the one collective: (world, bytes)
    sizes = gathered[:, :8].contiguous().view(torch.int64).reshape(world)
    offsets = torch.cumsum(sizes, 0) - sizes
    float_bytes = rows * (k + 2) * 4
    floats = gathered[:, 8:8 + float_bytes].contiguous().view(torch.float32).reshape(world, rows, k + 2)
    idx = gathered[:, 8 + float_bytes:].contiguous().view(torch.int64).reshape(world, rows, k)
    # In float64, in rank order (the same on every rank): a float32 lse of a row whose logits are
    # large (x / T of 1400: an ulp of 1.2e-4) would put its error into every probability.
    lse = torch.logsumexp(floats[:, :, 0].double() + floats[:, :, 1].double(), 0)
    glob_idx = torch.where(idx >= 0, idx + offsets[:, None, None], torch.iinfo(torch.int64).max)
    logits = floats[:, :, 2:].permute(1, 0, 2).reshape(rows, world * k)
    glob_idx = glob_idx.permute(1, 0, 2).reshape(rows, world * k)
    # Ties: lower global index first. Sort by index, then stably by logit (-0.0 made +0.0 first,
    # as the kernels rank them).
    logits = logits + 0.0
    by_index = torch.argsort(glob_idx, dim=1, stable=True)
    logits, glob_idx = logits.gather(1, by_index), glob_idx.gather(1, by_index)
    order = torch.argsort(logits, dim=1, descending=True, stable=True)[:, :k]
    top_logits, top_idx = logits.gather(1, order), glob_idx.gather(1, order)
    values = torch.exp(top_logits.double() - lse[:, None])
    # Rows that torch's softmax makes NaN (a NaN or +inf, or all -inf: no finite lse) as the kernels
    # give them: NaN values at indices 0..k-1.
    undefined = ~torch.isfinite(lse)[:, None]
    past_the_row = top_idx == torch.iinfo(torch.int64).max  # k above the row's length (validate=False)
    values = torch.where(undefined | past_the_row, float("nan"), values).to(values_dtype)
    top_idx = torch.where(undefined, torch.arange(k, device=x2.device), torch.where(past_the_row, -1, top_idx))
    return values, top_idx, lse.float()
