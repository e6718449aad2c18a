"""cross_entropy over classes in shards (vocabulary-parallel ranks, linear_cross_entropy's vocabulary
slices): statistics a shard, merged in class order, and the loss from them."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ... import _buffers, cpu
from ..._launch import Launcher, aligned
from . import plan as planner
from .launch import needs_denom, rows_forward
from .small_kernels import cross_entropy_shard_merge_kernel
from .torch_path import RowTerms, row_losses, row_normalizer

_shard_merge = Launcher(cross_entropy_shard_merge_kernel)


def shard_stats(x2, target, weight, offset, total, options, triton, read_ignored):
    """(4, rows) float32 (float64 for float64 logits on torch's path): the m, d, smoothing sum and
    target logit (-inf where the target is not here) of the classes [offset, offset + cols) of
    ``total``, held by x2's columns. Ignored rows are (-inf, 0, 0, -inf) unless ``read_ignored``
    (their lse is wanted). ``options``: (ignore_index, reduction, label_smoothing, z_loss, softcap,
    temperature)."""
    ignore_index, _, label_smoothing, _, softcap, temperature = options
    rows, cols = x2.shape
    if triton and cols:
        chosen = planner.choose("stats", rows, cols, x2.dtype, x2.device, None, x2.stride(0), x2.stride(1))
        planner.record(chosen)
        stats = _buffers.empty((4, rows), torch.float32, x2.device)
        rows_forward(chosen, x2, target, weight, stats, stats, stats, stats, ignore_index, "sum", label_smoothing, 0.0,
                     softcap, temperature, read_ignored, class_offset=offset, n_classes=total, stats=True)
        return stats
    terms = RowTerms(x2, target, weight, ignore_index, softcap, temperature, offset, total)
    m, d = row_normalizer(terms.y)
    s = terms.smoothing_sum() if label_smoothing > 0 and cols else torch.zeros_like(m)
    return torch.stack([m, d, s, terms.target_logit()])


def merge_shard_stats(gathered: torch.Tensor):
    """(lse, lse_low, smoothing sum, target logit) per row from every shard's (4, rows) stacked in
    class order (shards, 4, rows), merged in that order; lse_low is the lse's rounding error (see
    cpu.split_lse), for the backward."""
    m, d, s, y_t = gathered.unbind(1)  # each (world, rows)
    m_all = m.amax(0)
    ref = torch.where(m_all == -math.inf, 0.0, m_all)  # all -inf: d stays 0, no -inf - -inf
    d_all = (d * torch.exp(m - ref)).sum(0)
    log_d = torch.log(d_all)
    return m_all + log_d, cpu.split_lse(m_all, log_d)[1], s.sum(0), y_t.amax(0)


def merge_shard_loss(gathered: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], total: int,
                     options: tuple, dtype: torch.dtype, denom: Optional[torch.Tensor] = None):
    """(loss, lse, lse_low, denom) from every shard's statistics stacked in class order (shards, 4,
    rows), in one launch: merge_shard_stats, the denominators and shard_loss in a Triton kernel
    (cross_entropy_shard_merge_kernel). The loss in ``dtype``, reduced as ``options[1]`` says.
    ``denom``: the denominators already counted (linear_cross_entropy's), else counted here."""
    ignore_index, reduction, label_smoothing, z_loss = options[:4]
    n_shards, _, rows = gathered.shape
    device, has_weight = gathered.device, weight is not None
    count = denom is None and needs_denom(reduction, has_weight, label_smoothing)
    if denom is None:
        denom = _buffers.empty((3 if count else 0,), torch.float32, device)
    lse, lse_low = _buffers.empty((rows,), torch.float32, device), _buffers.empty((rows,), torch.float32, device)
    reduced = reduction != "none"
    loss = _buffers.empty(() if reduced else (rows,), dtype, device)
    w = weight if has_weight else lse
    key = ("shard_merge", rows, n_shards, total, target.dtype, target.stride(0), aligned(target), aligned(gathered),
           has_weight, w.dtype, aligned(w), dtype, ignore_index, reduction, count, label_smoothing > 0, z_loss > 0)
    _shard_merge((1,), key, gathered, target, w, denom if denom.numel() else lse, loss, lse, lse_low, loss,
                 rows, n_shards, total, target.stride(0), ignore_index, float(label_smoothing), float(z_loss),
                 BLOCK=planner.REDUCE_BLOCK, COUNT=count, REDUCE=reduced, MEAN=reduction == "mean",
                 HAS_WEIGHT=has_weight, SMOOTH=label_smoothing > 0, Z=z_loss > 0, num_warps=planner.REDUCE_WARPS)
    return loss, lse, lse_low, denom


def shard_loss(lse, lse_low, s, y_t, target, weight, denom, total, options, dtype):
    """The loss, reduced as ``options[1]`` says, from the merged statistics of all ``total`` classes."""
    ignore_index, reduction, label_smoothing, z_loss = options[:4]
    valid = target != ignore_index
    bad = valid & ((target < 0) | (target >= total))
    if weight is None:
        w_t, w_sum = torch.ones_like(lse), float(total)
    else:
        w = weight.to(lse.dtype)
        w_t, w_sum = w[torch.where(valid & ~bad, target, 0)], w.sum()
    loss = row_losses(lse, lse_low, y_t, s, w_t, w_sum, total, label_smoothing, valid, bad)
    z_term = torch.where(valid, z_loss * lse * lse, 0.0)
    if reduction == "none":
        return (loss + z_term).to(dtype)
    if reduction == "sum":
        return (loss.sum() + z_term.sum()).to(dtype)
    return (loss.sum() / denom[1] + z_term.sum() / denom[0]).to(dtype)
