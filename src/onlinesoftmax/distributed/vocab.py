"""Vocabulary-parallel cross-entropy: the classes (the last dim of the logits) sharded across ranks.

Megatron's layout: rank r holds the columns [offset_r, offset_r + V_r) of the (..., V) logits, in
rank order (rank 0 the first classes); shard sizes may differ (and be 0); the target, the class
weights and every leading dim are the same on every rank. The offsets come from the shard sizes,
gathered by the shape check (``validate=True``) or, with ``validate=False``, once per group and
local shard size and then reused.

Forward, one small collective: each rank reduces its shard to four numbers per row with the
cross-entropy kernels (``stats``: the online normalizer (m, d), the smoothing sum sum_c w_c y_c,
and the target's logit where the target is one of its classes, -inf elsewhere), the ranks
all_gather that (4, rows) float32 tensor (16 bytes a row), and every rank merges the world's
values in rank order, m and d with the (m, d) operator, the sums added, the target logit the
maximum (one rank's, the others -inf), into the lse and the loss: the same bits on every rank and
across runs. Backward, no collective: the gradient of the shard is softmax with the global lse,
minus the one-hot of the target where it lies in the shard (the same elementwise kernel as the
single-process backward, with the shard's class offset).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .. import _autocast, _validate
from .._device import triton_runs_on
from ..ops.cross_entropy.launch import launch_backward, needs_denom
from ..ops.cross_entropy.shards import merge_shard_loss, merge_shard_stats, shard_loss, shard_stats
from ..ops.cross_entropy.torch_path import torch_denom
from ..ops.cross_entropy.op import REDUCTIONS, check_call, check_class_weight, class_weights, \
    check_targets_in_range
from ._group import NoContext, all_gather, check_group, gather_shapes

NAME = "distributed.cross_entropy"
STRATEGIES = ("stream", "torch")
_OFFSETS: dict = {}  # (group, world size, rank, local shard size) -> (offset, total classes)


def _offsets(shard_size: int, group, validate: bool, logits: torch.Tensor, reduction: str) -> tuple[int, int]:
    """(this rank's first class, all classes). The shape check also makes ranks that disagree on the
    reduction raise together."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    key = (group, world, rank, shard_size)
    if validate:
        sizes = gather_shapes(logits, logits.dim() - 1, group, NAME, REDUCTIONS.index(reduction))[:, 3]
    elif key in _OFFSETS:
        return _OFFSETS[key]
    else:
        sizes = all_gather(torch.tensor([shard_size], dtype=torch.int64, device=logits.device), group)[:, 0].cpu()
    sizes = [int(s) for s in sizes]
    _OFFSETS[key] = (sum(sizes[:rank]), sum(sizes))
    return _OFFSETS[key]


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, target, weight, group, offset, total, options, triton, read_ignored, loss_dtype):
        stats = shard_stats(x2, target, weight, offset, total, options, triton, read_ignored)
        gathered = all_gather(stats, group)  # the one collective: (world, 4, rows)
        if triton and target.numel():
            loss, lse, lse_low, denom = merge_shard_loss(gathered, target, weight, total, options, loss_dtype)
        else:
            lse, lse_low, s, y_t = merge_shard_stats(gathered)
            denom = torch.empty(3 if needs_denom(options[1], weight is not None, options[2]) else 0,
                                dtype=torch.float32, device=x2.device)
            torch_denom(target, weight, denom, total, options[0])
            loss = shard_loss(lse, lse_low, s, y_t, target, weight, denom, total, options, loss_dtype)
        ctx.save_for_backward(x2, target, weight, lse, lse_low, denom)
        ctx.config = (offset, total, options, triton)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # else autograd allocates and fills zeros for lse's gradient every backward
        return loss, lse

    @staticmethod
    def backward(ctx, dloss, _dlse):
        x2, target, weight, lse, lse_low, denom = ctx.saved_tensors
        offset, total, (ignore_index, reduction, label_smoothing, z_loss, softcap, temperature), triton = ctx.config
        dx = launch_backward(x2, target, weight, lse, lse_low, denom, dloss, ignore_index, reduction, label_smoothing, z_loss,
                             softcap, temperature, None if triton else "torch", offset, total)
        return dx, None, None, None, None, None, None, None, None, None


def cross_entropy(logits_shard: torch.Tensor, target: torch.Tensor, group=None, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                  softcap: Optional[float] = None, temperature: float = 1.0, weight: Optional[torch.Tensor] = None,
                  return_lse: bool = False, validate: bool = True, strategy: Optional[str] = None):
    """Cross-entropy over classes sharded across the ranks of ``group`` (vocabulary parallelism).

    Every rank gets the loss of the whole vocabulary (the same value, bit for bit) and the
    gradient of its own shard, as :func:`onlinesoftmax.cross_entropy` would give on the
    concatenated logits; one all_gather of 16 bytes per row per call (plus the shape check's).

    Parameters
    ----------
    logits_shard : Tensor
        (..., V_r): this rank's classes [offset_r, offset_r + V_r), ranks in order; float32,
        float16 or bfloat16. V_r may differ across ranks and be 0. CUDA tensors need an NCCL group
        (or gloo, staged through the host), CPU tensors a gloo group.
    target : Tensor
        ``logits_shard.shape[:-1]``, int64 or int32 global class indices, the same on every rank.
    group : ProcessGroup, optional
        Default: the world.
    ignore_index, reduction, label_smoothing, z_loss, softcap, temperature, return_lse
        As :func:`onlinesoftmax.cross_entropy`.
    weight : Tensor, optional
        (V,) weights of all classes (not a shard), the same on every rank.
    validate : bool
        Check that the ranks' shapes and dtypes fit together (one more small all_gather, which also
        yields the shard offsets). With False the offsets of the first call with this group and
        local shard size are reused, leaving one collective a call.
    strategy : {None, "stream", "torch"}, optional
        The local kernels: Triton's ("stream"; CUDA, or CPU under TRITON_INTERPRET=1) or torch's.

    Returns
    -------
    Tensor, or (Tensor, Tensor) with ``return_lse``
        The loss (0-d, or ``target.shape`` for "none") in the logits' dtype (float32 inside an
        autocast region, as :func:`onlinesoftmax.cross_entropy`'s), and the float32 lse of the full
        rows, identical on every rank.

    Raises
    ------
    RuntimeError
        torch.distributed not initialized.
    ValueError, TypeError
        As :func:`onlinesoftmax.cross_entropy`; shards that do not fit together (on every rank,
        with ``validate``); a group whose backend cannot communicate the tensors' device.

    Examples
    --------
    >>> # on each of 2 ranks (torchrun --nproc-per-node 2), the logits' columns split in two:
    >>> # shard = full_logits[:, rank * V // 2:(rank + 1) * V // 2]
    >>> # loss = onlinesoftmax.distributed.cross_entropy(shard, target)   # doctest: +SKIP
    """
    softcap = check_call(logits_shard, target, NAME, "logits_shard", ignore_index, reduction, label_smoothing, z_loss,
                         softcap, temperature)
    # float64 shards: refused, as the distributed softmax family refuses them (its (m, d) exchange
    # is float32); onlinesoftmax.cross_entropy takes float64.
    _validate.float_dtype(logits_shard, NAME)
    if strategy is not None:
        _validate.choice(strategy, STRATEGIES, NAME, "strategy")
    triton = strategy != "torch" and triton_runs_on(logits_shard.device)
    if strategy == "stream" and not triton:
        raise ValueError(f"{NAME}: strategy 'stream' runs Triton kernels, which need a CUDA tensor "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")
    check_group(logits_shard.device, group, NAME)
    offset, total = _offsets(logits_shard.shape[-1], group, validate, logits_shard, reduction)
    if total == 0:
        raise ValueError(f"{NAME}: the shards hold no class at all")
    check_class_weight(weight, total, logits_shard, NAME)
    weight = class_weights(weight)
    check_targets_in_range(target, total, ignore_index, NAME)
    x2 = logits_shard.reshape(target.numel(), logits_shard.shape[-1])  # (an empty shard: no -1 to infer)
    t1 = target.reshape(-1)
    options = (ignore_index, reduction, float(label_smoothing), float(z_loss), softcap, float(temperature))
    # Inside an autocast region torch computes the loss in float32 (see onlinesoftmax._autocast).
    loss_dtype = torch.float32 if _autocast.float32_result("cross_entropy", logits_shard) else logits_shard.dtype
    args = (x2, t1, weight, group, offset, total, options, triton, return_lse, loss_dtype)
    if logits_shard.requires_grad and torch.is_grad_enabled():
        loss, lse = _VocabParallelCrossEntropy.apply(*args)
    else:
        with torch.no_grad():
            loss, lse = _VocabParallelCrossEntropy.forward(NoContext(), *args)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return (loss, lse.reshape(target.shape)) if return_lse else loss

