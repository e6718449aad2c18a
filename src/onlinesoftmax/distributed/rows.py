"""Softmax-family ops over a dimension sharded across ranks (``torch.distributed``).

Each rank holds a contiguous shard of the softmax dimension, in rank order (rank 0 the first
columns); shard sizes may differ, every other dimension must match. The online normalizer of
seed 001 makes this cheap: the (m, d) operator

    (m_a, d_a) (+) (m_b, d_b) = (M, d_a e^(m_a - M) + d_b e^(m_b - M)),   M = max(m_a, m_b)

is associative, so each rank reduces its shard to one (m, d) pair per row with the library's own
kernels, the ranks exchange those pairs (8 bytes per row, not the data), and each rank writes its
shard of the output from the merged pair.

Which collective, and why
-------------------------
One ``all_gather`` of the per-row (m, d) pairs (a ``(2, rows)`` float32 tensor per rank), then a
local merge over the ``world_size`` pairs in rank order. The alternative, an ``all_reduce(MAX)``
of m followed by an ``all_reduce(SUM)`` of ``d * exp(m - M)``, needs two collectives in sequence
(the sum needs the max first); at these sizes a collective costs its latency, not its bytes, so
one gather of 8 bytes per row beats two reductions of 4. The gather also makes the result bitwise
identical on every rank and across runs: every rank merges the same values in the same fixed
order inside one kernel, whereas a reduction's order belongs to the communication library.
The backward pass needs one more small collective of the same kind: an all_gather of the per-row
``dot(dy, y)`` (``sum(dy)`` for log_softmax), 4 bytes per row, summed in rank order.

Checking shapes costs one more gather. With ``validate=True`` (the default) every call first
all-gathers a 16-integer description of the rank's input (dims, sizes, dim, dtype), so that ranks
with mismatched shards raise the same ValueError together instead of exchanging misaligned
buffers; pass ``validate=False`` in a loop whose shapes are known to agree to keep one collective.
A ``dim`` that is not the sharded one is caught when the shards are uneven (the other dims then
differ across ranks); with equal shards it cannot be told apart from a sharded dim.

The local compute runs the softmax op's row launchers (``ops/softmax/launch.py``: split-row
partials, normalize and backward kernels, fed with one partial per rank) on CUDA tensors and under
``TRITON_INTERPRET=1``; CPU tensors otherwise take the same arithmetic in torch.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from .. import _autocast, _validate, cpu
from ..ops.softmax import launch as rows
from ._group import (NoContext, all_gather, check_group, checked_shard, from_rows, gather_shapes, local_strategy,
                     rows_view)

DimensionError = _validate.DimensionError
# --------------------------------------------------------------------------------------------
# Autograd: the forward's one collective gathers (m, d) per row, the backward's the row's dot
# --------------------------------------------------------------------------------------------


class _ShardedSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, log, group, strategy):
        triton = strategy == "split_row"
        x2 = rows_view(x, dim)
        pairs = all_gather(rows.row_normalizers(x2, triton), group)  # the one collective: (world, 2, rows)
        # Each rank's pair is one partial of the row; the kernel merges them in rank order.
        y2 = rows.normalize_rows(x2, pairs, log, triton)
        ctx.save_for_backward(y2)
        ctx.config = (dim, log, group, triton, x.shape)
        return from_rows(y2, x.shape, dim)

    @staticmethod
    def backward(ctx, dy):
        (y2,) = ctx.saved_tensors
        dim, log, group, triton, shape = ctx.config
        dy2 = rows_view(dy.to(y2.dtype), dim)
        dots = all_gather(rows.grad_dots(y2, dy2, log, triton), group)  # (world, rows)
        return from_rows(rows.grad_rows(y2, dy2, dots.t().contiguous(), log, triton), shape, dim), \
            None, None, None, None


class _ShardedLogSumExpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, strategy):
        x2 = rows_view(x, dim)
        pairs = all_gather(rows.row_normalizers(x2, strategy == "split_row"), group)
        lse = cpu.finish_lse(*cpu.merge_normalizers(pairs[:, 0], pairs[:, 1], 0))
        lse = lse.reshape(x.shape[:dim] + x.shape[dim + 1:])
        ctx.save_for_backward(x, lse)
        ctx.dim = dim
        return lse.to(x.dtype)

    @staticmethod
    def backward(ctx, dlse):
        # d lse / dx = softmax(x) with the global lse: local, no collective. Each rank's shard
        # receives its own dlse (the same on every rank when the loss is computed redundantly).
        x, lse = ctx.saved_tensors
        grad = dlse.float().unsqueeze(ctx.dim) * torch.exp(x.float() - lse.unsqueeze(ctx.dim))
        return grad.to(x.dtype), None, None, None


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------


def _prepare(x, dim, group, validate, strategy, name):
    x, dim = checked_shard(x, dim, name)
    check_group(x.device, group, name)
    if x.dim() == 0:
        raise ValueError(f"{name}: a 0-d tensor has no dimension to shard")
    chosen = local_strategy(x, strategy, name)
    if validate:
        gather_shapes(x, dim, group, name)
    return x, dim, chosen


def _autocast_policy(op: str, x: torch.Tensor):
    """(x, the context to run in): inside an autocast region, x in float32 where torch computes
    ``op`` of it in float32 (onlinesoftmax._autocast; the result is then torch's, at the cost of a
    float32 copy of the shard, where the local ops read the half tensor as it is: a collective
    follows here anyway), and the region turned off for our own torch ops."""
    if _autocast.active_for(x):
        return (x.float() if _autocast.float32_result(op, x) else x), _autocast.off(x.device.type)
    return x, contextlib.nullcontext()


def _softmax_like(x, dim, group, validate, strategy, log):
    name = "distributed.log_softmax" if log else "distributed.softmax"
    x, dim, chosen = _prepare(x, dim, group, validate, strategy, name)
    x, region = _autocast_policy("log_softmax" if log else "softmax", x)
    with region:
        if x.requires_grad and torch.is_grad_enabled():
            return _ShardedSoftmaxFunction.apply(x, dim, log, group, chosen)
        with torch.no_grad():
            return _ShardedSoftmaxFunction.forward(NoContext(), x, dim, log, group, chosen)


def softmax(x_shard: torch.Tensor, dim: int = -1, group=None, *, validate: bool = True,
            strategy: Optional[str] = None) -> torch.Tensor:
    """Softmax over a dimension sharded across the ranks of ``group``; returns this rank's shard.

    Parameters
    ----------
    x_shard : Tensor
        This rank's contiguous shard of ``dim`` (rank 0 holds the first columns, rank 1 the next,
        ...); float32, float16 or bfloat16. Shard sizes may differ (0 included); every other dim
        must match across ranks. CUDA tensors need an NCCL group, CPU tensors a gloo group.
    dim : int
        The sharded dimension, the one normalized over.
    group : ProcessGroup, optional
        The ranks that share the dimension; the default group when None.
    validate : bool
        Check with one extra small all_gather that all ranks pass matching shapes, dim and dtype
        (every rank then raises the same ValueError). ``False`` leaves one collective per call.
    strategy : {"split_row", "torch"}, optional
        Testing override of the local compute: the Triton kernels, or vectorized torch.

    Returns
    -------
    Tensor
        This rank's shard of ``softmax(concat(all shards, dim), dim)``: same shape and dtype as
        ``x_shard`` (float32 for a half shard inside a CUDA autocast region, as torch.softmax).
        Bitwise identical across runs. NaN/inf semantics of ``torch.softmax`` over the whole row
        (a NaN or +inf on any rank makes the row NaN on every rank).

    Notes
    -----
    One ``all_gather`` of the per-row (m, d) pair, 8 bytes per row, merged locally in rank order
    (see the module docstring for why not two all-reduces). Differentiable: the backward pass
    all-gathers ``dot(dy, y)`` per row (4 bytes per row) and writes this rank's shard of dx.

    Raises
    ------
    RuntimeError
        torch.distributed is not initialized.
    TypeError
        As :func:`onlinesoftmax.softmax`.
    ValueError
        The group's backend cannot communicate tensors on this device; the ranks' shapes (other
        than ``dim``), ``dim`` or dtypes differ (with ``validate=True``); ``dim`` out of range.

    Examples
    --------
    Under ``torchrun --nproc-per-node 2``, with NCCL and one GPU per rank::

        x = torch.randn(64, 262144, device="cuda", dtype=torch.bfloat16)   # same seed on all ranks
        shard = x.chunk(world_size, dim=-1)[rank]
        y_shard = onlinesoftmax.distributed.softmax(shard, dim=-1)
    """
    return _softmax_like(x_shard, dim, group, validate, strategy, log=False)


def log_softmax(x_shard: torch.Tensor, dim: int = -1, group=None, *, validate: bool = True,
                strategy: Optional[str] = None) -> torch.Tensor:
    """Log-softmax over a dimension sharded across ranks; returns this rank's shard.

    ``(x - M) - log(D)`` with the merged pair (M, D). Same arguments, collective, gradient and
    errors as :func:`softmax`; semantics of ``torch.log_softmax`` over the whole row.
    """
    return _softmax_like(x_shard, dim, group, validate, strategy, log=True)


def logsumexp(x_shard: torch.Tensor, dim: int = -1, group=None, *, validate: bool = True,
              strategy: Optional[str] = None) -> torch.Tensor:
    """``log(sum(exp(x)))`` over a dimension sharded across ranks; the same result on every rank.

    Returns ``M + log(D)`` from the merged pair, with ``dim`` removed, in ``x_shard.dtype``
    (computed in float32; returned in float32 for a half shard inside a CUDA autocast region, as
    torch.logsumexp), bitwise identical on all ranks. One all_gather of 8 bytes per row.
    Conventions of ``torch.logsumexp`` over the whole row (all ``-inf`` gives ``-inf``, ``+inf``
    gives ``+inf``, NaN gives NaN). Differentiable with no collective in the backward pass: the
    gradient of this rank's shard is ``dlse * exp(x_shard - lse)`` with this rank's ``dlse``.
    Arguments and errors as :func:`softmax`.
    """
    name = "distributed.logsumexp"
    x, dim, chosen = _prepare(x_shard, dim, group, validate, strategy, name)
    x, region = _autocast_policy("logsumexp", x)
    with region:
        if x.requires_grad and torch.is_grad_enabled():
            return _ShardedLogSumExpFunction.apply(x, dim, group, chosen)
        with torch.no_grad():
            return _ShardedLogSumExpFunction.forward(NoContext(), x, dim, group, chosen)
