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

The local compute runs the Triton kernels of :mod:`onlinesoftmax.softmax` (its split-row partials,
normalize and backward kernels, fed with one partial per rank) on CUDA tensors and under
``TRITON_INTERPRET=1``; CPU tensors otherwise take the vectorized torch path of
:mod:`onlinesoftmax.cpu`.
"""

from __future__ import annotations

import importlib
import math
from typing import Optional

import torch
import torch.distributed as dist

from . import _buffers, cpu, plan as planner
from .softmax import DimensionError

# The package re-exports functions named like these modules: import the modules by full name.
softmax_ops = importlib.import_module("onlinesoftmax.softmax")

# Length of the per-rank description exchanged by the shape check: ndim, dim, dtype code, the
# shard size along dim, an op-specific value (k for top-k), then up to 11 sizes.
_META_LENGTH = 16
_META_MAX_DIMS = _META_LENGTH - 5
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
STRATEGIES = ("split_row", "torch")

_last_strategy: Optional[str] = None


def last_strategy() -> Optional[str]:
    """The local strategy of the most recent softmax-family call in this process: "split_row" or "torch"."""
    return _last_strategy


# --------------------------------------------------------------------------------------------
# Process groups: validation and the one collective
# --------------------------------------------------------------------------------------------


def _backend_for(device: torch.device, backend: str) -> Optional[str]:
    """The backend of ``backend`` (as ``dist.get_backend`` spells it) that serves ``device``, or None."""
    backend = str(backend).lower()
    if ":" in backend:  # a multi-device group, "cpu:gloo,cuda:nccl"
        mapping = dict(part.split(":", 1) for part in backend.split(","))
        return mapping.get(device.type)
    usable = {"nccl": ("cuda",), "gloo": ("cpu",), "mpi": ("cpu", "cuda"), "ucc": ("cpu", "cuda")}
    return backend if device.type in usable.get(backend, (device.type,)) else None


def check_group(device: torch.device, group=None, name: str = "distributed op"):
    """Raise unless torch.distributed is initialized and ``group`` can communicate ``device`` tensors.

    Runs before any collective, so a rank with a wrong device raises instead of entering a
    collective the others cannot complete.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{name}: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first (or run under torchrun)")
    backend = dist.get_backend(group)
    if _backend_for(device, backend) is None:
        hint = ("NCCL communicates CUDA tensors only: move the tensor to this rank's GPU"
                if "nccl" in str(backend) else "gloo communicates CPU tensors here: use an NCCL group for CUDA tensors")
        raise ValueError(f"{name}: the process group's backend {backend!r} cannot communicate tensors on "
                         f"{device}; {hint}")


def _all_gather(tensor: torch.Tensor, group) -> torch.Tensor:
    """(world_size, *tensor.shape): every rank's ``tensor`` in rank order, in one collective."""
    world = dist.get_world_size(group)
    out = _buffers.empty((world * tensor.numel(),), tensor.dtype, tensor.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, tensor.contiguous().reshape(-1), group=group)
    return out.reshape((world,) + tuple(tensor.shape))


def _gather_shapes(x: torch.Tensor, dim: int, group, name: str, extra: int = 0) -> torch.Tensor:
    """All-gather each rank's (ndim, dim, dtype, shard size, extra, sizes) and raise the same
    ValueError on every rank when the shards do not fit together. Returns the (world, 16) table."""
    if x.dim() > _META_MAX_DIMS:
        raise ValueError(f"{name}: at most {_META_MAX_DIMS} dims are supported, got {x.dim()}")
    sizes = list(x.shape) + [-1] * (_META_MAX_DIMS - x.dim())
    sizes[dim] = -1  # the sharded dim may differ
    meta = torch.tensor([x.dim(), dim, _DTYPE_CODES[x.dtype], x.shape[dim], extra] + sizes,
                        dtype=torch.int64, device=x.device)
    table = _all_gather(meta, group).cpu()
    if not torch.equal(table[:, [0, 1, 2, 4]], table[:1, [0, 1, 2, 4]].expand(len(table), -1)):
        raise ValueError(f"{name}: ranks disagree on ndim, dim, dtype or k: (ndim, dim, dtype, k) per rank = "
                         f"{table[:, [0, 1, 2, 4]].tolist()}")
    if not torch.equal(table[:, 5:], table[:1, 5:].expand(len(table), -1)):
        shapes = [[int(s) for s in row[5:5 + int(row[0])]] for row in table]
        raise ValueError(f"{name}: every dim but the sharded dim {dim} must have the same size on every rank, "
                         f"got shapes {shapes} (-1 marks dim {dim}); is dim {dim} the dimension the tensor "
                         "is sharded along?")
    return table


# --------------------------------------------------------------------------------------------
# Local compute: the rank's (m, d) per row, and its shard of the output from the merged pairs
# --------------------------------------------------------------------------------------------


def _rows_view(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with ``dim`` moved last and the rest flattened: (rows, shard columns), contiguous."""
    n_rows = x.numel() // x.shape[dim] if x.shape[dim] else math.prod(x.shape[:dim] + x.shape[dim + 1:])
    return x.movedim(dim, -1).reshape(n_rows, x.shape[dim]).contiguous()


def _from_rows(y2: torch.Tensor, like_shape, dim: int) -> torch.Tensor:
    moved = list(like_shape)
    moved.append(moved.pop(dim))
    return y2.reshape(moved).movedim(-1, dim)


def _strategy(x: torch.Tensor, strategy: Optional[str], name: str) -> str:
    global _last_strategy
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"{name}: strategy must be None or one of {STRATEGIES}, got {strategy!r}")
    triton_ok = x.device.type == "cuda" or planner.interpreter_active()
    if strategy == "split_row" and not triton_ok:
        raise ValueError(f"{name}: strategy 'split_row' runs Triton kernels, which need a CUDA tensor "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")
    _last_strategy = strategy or ("split_row" if triton_ok else "torch")
    return _last_strategy


def _reference_point(m: torch.Tensor) -> torch.Tensor:
    # exp(-inf - -inf) is NaN: an all -inf (or empty) group measures from 0 and keeps d = 0.
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)


def _merge_normalizers(m: torch.Tensor, d: torch.Tensor, axis: int):
    """The (m, d) operator applied over ``axis`` at once (amax keeps NaN, as the kernels' max)."""
    m_all = m.amax(axis)
    return m_all, (d * torch.exp(m - _reference_point(m_all).unsqueeze(axis))).sum(axis)


def _split_plan(op: str, x2: torch.Tensor, world: int):
    """The library's split-row plan for the shard, with at least one chunk per rank: the kernels
    that merge partials read exactly ``num_chunks`` of them, the ranks' pairs and empty padding."""
    chosen = planner.choose(op, x2.shape[0], x2.shape[1], x2.dtype, x2.device, "online", "split_row")
    planner.record(chosen)
    return chosen, max(chosen.num_chunks, world)


def _local_normalizer(x2: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, d) per row of the shard, float32; (-inf, 0) for an empty shard."""
    rows, n = x2.shape
    if n == 0:
        return (torch.full((rows,), float("-inf"), device=x2.device), torch.zeros(rows, device=x2.device))
    if strategy == "torch":
        return cpu.normalizer(x2.float())
    chosen, _ = _split_plan("logsumexp", x2, 1)
    # The kernel's (m, d) planes; the third (chunk maxima) is for the safe algorithm only.
    parts = _buffers.empty((2, rows, chosen.num_chunks), torch.float32, x2.device)
    softmax_ops.split_row_partials_kernel[(rows, chosen.num_chunks)](
        x2, parts, n, 1, n, 1, 0, chosen.chunk_size, chosen.num_chunks, 1.0,
        BLOCK=chosen.block_cols, CHUNKS_POW2=planner.next_power_of_2(chosen.num_chunks), CONTIGUOUS=True,
        PASS=softmax_ops.PARTIAL_ONLINE, num_warps=chosen.num_warps)
    return _merge_normalizers(parts[0], parts[1], 1)


def _padded_partials(gathered: torch.Tensor, num_chunks: int, fill: float) -> torch.Tensor:
    """(rows, num_chunks) from (world, rows): the ranks' values first, ``fill`` (the empty partial) after."""
    world, rows = gathered.shape
    out = torch.full((rows, num_chunks), fill, dtype=torch.float32, device=gathered.device)
    out[:, :world] = gathered.t()
    return out


def _write_normalized(x2: torch.Tensor, pairs: torch.Tensor, log: bool, strategy: str) -> torch.Tensor:
    """The shard of softmax (or log_softmax) from the gathered (world, 2, rows) pairs."""
    rows, n = x2.shape
    world = pairs.shape[0]
    if strategy == "torch":
        m, d = _merge_normalizers(pairs[:, 0], pairs[:, 1], 0)
        xt = x2.float()
        y = (xt - m[:, None]) - torch.log(d)[:, None] if log else torch.exp(xt - m[:, None]) / d[:, None]
        return y.to(x2.dtype)
    y = _buffers.empty(x2.shape, x2.dtype, x2.device)
    if y.numel() == 0:
        return y
    chosen, num_chunks = _split_plan("softmax", x2, world)
    # Every program merges the world's pairs itself, in the same order on every rank.
    parts = torch.stack([_padded_partials(pairs[:, 0], num_chunks, float("-inf")),
                         _padded_partials(pairs[:, 1], num_chunks, 0.0)])  # the kernel's (m, d) planes
    softmax_ops.split_row_normalize_kernel[(rows, num_chunks)](
        x2, y, x2, parts, n, 1, n, 1, 0, n, 1, 0, chosen.chunk_size, num_chunks, 1.0,
        BLOCK=chosen.block_cols, CHUNKS_POW2=planner.next_power_of_2(num_chunks), CONTIGUOUS=True,
        LOG=log, WRITE_Y=True, WRITE_LSE=False, num_warps=chosen.num_warps)
    return y


def _local_grad_dot(y2: torch.Tensor, dy2: torch.Tensor, log: bool, strategy: str) -> torch.Tensor:
    """Per row: sum(dy * y) for softmax, sum(dy) for log_softmax, float32."""
    rows, n = y2.shape
    if strategy == "torch" or n == 0:
        return dy2.float().sum(1) if log else (dy2.float() * y2.float()).sum(1)
    chosen, _ = _split_plan("softmax_backward", y2, 1)
    parts = _buffers.empty((rows, chosen.num_chunks), torch.float32, y2.device)
    softmax_ops.split_row_backward_dot_kernel[(rows, chosen.num_chunks)](
        y2, dy2, parts, n, 1, n, 1, 0, n, 1, 0, chosen.chunk_size, chosen.num_chunks,
        BLOCK=chosen.block_cols, CONTIGUOUS=True, LOG=log, num_warps=chosen.num_warps)
    return parts.sum(1)


def _write_grad(y2: torch.Tensor, dy2: torch.Tensor, dots: torch.Tensor, log: bool, strategy: str) -> torch.Tensor:
    """dx of the shard from the gathered (world, rows) per-rank dots."""
    rows, n = y2.shape
    if strategy == "torch":
        dot = dots.sum(0)[:, None]
        y32, dy32 = y2.float(), dy2.float()
        dx = dy32 - torch.exp(y32) * dot if log else y32 * (dy32 - dot)
        return dx.to(y2.dtype)
    dx = _buffers.empty(y2.shape, y2.dtype, y2.device)
    if dx.numel() == 0:
        return dx
    chosen, num_chunks = _split_plan("softmax_backward", y2, dots.shape[0])
    softmax_ops.split_row_backward_apply_kernel[(rows, num_chunks)](
        y2, dy2, dx, _padded_partials(dots, num_chunks, 0.0), n, 1, n, 1, 0, n, 1, 0, n, 1, 0,
        chosen.chunk_size, num_chunks, 1.0,
        BLOCK=chosen.block_cols, CHUNKS_POW2=planner.next_power_of_2(num_chunks), CONTIGUOUS=True,
        LOG=log, num_warps=chosen.num_warps)
    return dx


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _ShardedSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, log, group, strategy):
        x2 = _rows_view(x, dim)
        m, d = _local_normalizer(x2, strategy)
        pairs = _all_gather(torch.stack([m, d]), group)  # the one collective: (world, 2, rows)
        y2 = _write_normalized(x2, pairs, log, strategy)
        ctx.save_for_backward(y2)
        ctx.config = (dim, log, group, strategy, x.shape)
        return _from_rows(y2, x.shape, dim)

    @staticmethod
    def backward(ctx, dy):
        (y2,) = ctx.saved_tensors
        dim, log, group, strategy, shape = ctx.config
        dy2 = _rows_view(dy.to(y2.dtype), dim)
        dots = _all_gather(_local_grad_dot(y2, dy2, log, strategy), group)  # (world, rows)
        return _from_rows(_write_grad(y2, dy2, dots, log, strategy), shape, dim), None, None, None, None


class _ShardedLogSumExpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, strategy):
        x2 = _rows_view(x, dim)
        pairs = _all_gather(torch.stack(_local_normalizer(x2, strategy)), group)
        lse = cpu.finish_lse(*_merge_normalizers(pairs[:, 0], pairs[:, 1], 0))
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
    x, dim = softmax_ops._check(x, dim, name=name)
    check_group(x.device, group, name)
    if x.dim() == 0:
        raise ValueError(f"{name}: a 0-d tensor has no dimension to shard")
    chosen = _strategy(x, strategy, name)
    if validate:
        _gather_shapes(x, dim, group, name)
    return x, dim, chosen


def _softmax_like(x, dim, group, validate, strategy, log):
    name = "distributed.log_softmax" if log else "distributed.softmax"
    x, dim, chosen = _prepare(x, dim, group, validate, strategy, name)
    if x.requires_grad and torch.is_grad_enabled():
        return _ShardedSoftmaxFunction.apply(x, dim, log, group, chosen)
    with torch.no_grad():
        return _ShardedSoftmaxFunction.forward(_NoContext(), x, dim, log, group, chosen)


class _NoContext:
    """Stands in for autograd's ctx when no graph is recorded (saves nothing worth keeping)."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass


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
        ``x_shard``. Bitwise identical across runs. NaN/inf semantics of ``torch.softmax`` over
        the whole row (a NaN or +inf on any rank makes the row NaN on every rank).

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
    (computed in float32), bitwise identical on all ranks. One all_gather of 8 bytes per row.
    Conventions of ``torch.logsumexp`` over the whole row (all ``-inf`` gives ``-inf``, ``+inf``
    gives ``+inf``, NaN gives NaN). Differentiable with no collective in the backward pass: the
    gradient of this rank's shard is ``dlse * exp(x_shard - lse)`` with this rank's ``dlse``.
    Arguments and errors as :func:`softmax`.
    """
    name = "distributed.logsumexp"
    x, dim, chosen = _prepare(x_shard, dim, group, validate, strategy, name)
    if x.requires_grad and torch.is_grad_enabled():
        return _ShardedLogSumExpFunction.apply(x, dim, group, chosen)
    with torch.no_grad():
        ctx = _NoContext()
        return _ShardedLogSumExpFunction.forward(ctx, x, dim, group, chosen)


def softmax_topk(x_shard: torch.Tensor, k: int, dim: int = -1, group=None, *, temperature: float = 1.0,
                 sorted: bool = True, return_lse: bool = False, validate: bool = True):
    """The k most probable entries of a softmax over a dimension sharded across ranks.

    Parameters
    ----------
    x_shard : Tensor
        This rank's contiguous shard of ``dim`` (as :func:`softmax`).
    k : int
        How many entries to return; at most the total size of ``dim`` over all ranks.
    dim, group, validate
        As :func:`softmax`.
    temperature : float
        Divides the logits before the softmax.
    sorted : bool
        Accepted for the signature of :func:`onlinesoftmax.softmax_topk`; the result is always
        sorted by decreasing probability (the global selection sorts the candidates).
    return_lse : bool
        Also return the log-sum-exp of the whole row (of ``x / temperature``), float32.

    Returns
    -------
    values : Tensor
        Probabilities normalized over the whole row, ``dim`` of size k, dtype of ``x_shard``.
    indices : Tensor
        int64 global indices (shard offset + local index); ties go to the lower global index.
    lse : Tensor, float32, only with ``return_lse``
        Identical on every rank.

    Notes
    -----
    Each rank runs :func:`onlinesoftmax.softmax_topk` on its shard with ``return_lse`` and sends
    its ``min(k, shard size)`` candidates (logits and local indices), its per-row log-sum-exp and
    its shard size in ONE all_gather (a byte buffer: the int64 indices travel bit-exact); every
    rank then selects the same global top k from the ``world * k`` candidates. The per-rank pair
    travels as its log-sum-exp ``m + log d``, 4 bytes per row, because that is what the top-k op
    returns; probabilities are ``exp(x / T - lse)``, whose relative error is at most
    ``|lse| * 2**-24`` from the float32 lse. Not differentiable.
    """
    topk_ops = importlib.import_module("onlinesoftmax.topk")
    name = "distributed.softmax_topk"
    x, dim = softmax_ops._check(x_shard, dim, temperature, name=name)
    check_group(x.device, group, name)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{name}: k must be a positive int, got {k!r}")
    if x.dim() == 0:
        raise ValueError(f"{name}: a 0-d tensor has no dimension to shard")
    world = dist.get_world_size(group)
    if validate:
        table = _gather_shapes(x, dim, group, name, extra=k)
        total = int(table[:, 3].sum())
        if k > total:
            raise ValueError(f"{name}: k={k} is larger than the sharded dim's total size {total}")
    x2 = _rows_view(x, dim)
    rows, n = x2.shape
    k_local = min(k, n)
    inv_t = 1.0 / float(temperature)
    if k_local > 0:
        _, local_idx, local_lse = topk_ops.softmax_topk(x2, k_local, -1, temperature=temperature, return_lse=True)
        cand = torch.gather(x2, 1, local_idx).float() * inv_t
    else:
        local_idx = torch.zeros((rows, 0), dtype=torch.int64, device=x.device)
        local_lse = torch.full((rows,), float("-inf"), device=x.device)
        cand = torch.zeros((rows, 0), device=x.device)
    # Fixed-size payload per rank: [shard size (int64)] + per row [lse, k logits, k int64 indices];
    # a shard with fewer than k columns pads with -inf logits at index -1 (never selected: k <= total).
    cand = torch.nn.functional.pad(cand, (0, k - k_local), value=float("-inf"))
    local_idx = torch.nn.functional.pad(local_idx.to(torch.int64), (0, k - k_local), value=-1)
    payload = torch.cat([
        torch.tensor([n], dtype=torch.int64, device=x.device).view(torch.uint8),
        torch.cat([local_lse.float()[:, None], cand], 1).contiguous().view(torch.uint8).reshape(-1),
        local_idx.contiguous().view(torch.uint8).reshape(-1),
    ])
    gathered = _all_gather(payload, group)  # the one collective: (world, bytes)
    sizes = gathered[:, :8].contiguous().view(torch.int64).reshape(world)
    offsets = torch.cumsum(sizes, 0) - sizes
    float_bytes = rows * (k + 1) * 4
    floats = gathered[:, 8:8 + float_bytes].contiguous().view(torch.float32).reshape(world, rows, k + 1)
    idx = gathered[:, 8 + float_bytes:].contiguous().view(torch.int64).reshape(world, rows, k)
    lse = torch.logsumexp(floats[:, :, 0], 0)  # in rank order, the same on every rank
    glob_idx = torch.where(idx >= 0, idx + offsets[:, None, None], torch.iinfo(torch.int64).max)
    logits = floats[:, :, 1:].permute(1, 0, 2).reshape(rows, world * k)
    glob_idx = glob_idx.permute(1, 0, 2).reshape(rows, world * k)
    # Ties: lower global index first. Sort by index, then stably by logit.
    by_index = torch.argsort(glob_idx, dim=1, stable=True)
    logits, glob_idx = logits.gather(1, by_index), glob_idx.gather(1, by_index)
    order = torch.argsort(logits, dim=1, descending=True, stable=True)[:, :k]
    top_logits, top_idx = logits.gather(1, order), glob_idx.gather(1, order)
    values = torch.exp(top_logits - lse[:, None]).to(x.dtype)
    out_shape = list(x.shape)
    out_shape[dim] = k
    values, top_idx = _from_rows(values, out_shape, dim), _from_rows(top_idx, out_shape, dim)
    if return_lse:
        return values, top_idx, lse.reshape(x.shape[:dim] + x.shape[dim + 1:])
    return values, top_idx


# --------------------------------------------------------------------------------------------
# Attention partials merged through their log-sum-exp
# --------------------------------------------------------------------------------------------


def _merge_stacked(outs: torch.Tensor, lses: torch.Tensor, out_dtype: torch.dtype):
    """Merge partial attentions stacked on dim 0 (in that order): fp32, -inf partials weigh 0."""
    lses = lses.float()
    m = lses.amax(0)
    weights = torch.exp(lses - _reference_point(m).unsqueeze(0))  # -inf partials: weight 0
    total = weights.sum(0)
    has_keys = total > 0
    lse = torch.where(has_keys, _reference_point(m) + torch.log(torch.where(has_keys, total, 1.0)),
                      torch.full_like(m, float("-inf")))
    scale = weights / torch.where(has_keys, total, 1.0).unsqueeze(0)
    out = (outs.float() * scale.unsqueeze(-1)).sum(0)
    return out.to(out_dtype), lse


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Merge two attentions over disjoint key sets through their log-sum-exp.

    Parameters
    ----------
    out_a, out_b : Tensor, shape (..., D)
        Partial attention outputs (each normalized over its own keys), same shape and dtype.
    lse_a, lse_b : Tensor, shape (...)
        Their natural-log log-sum-exp (as :func:`onlinesoftmax.attention` returns with
        ``return_lse=True``); ``-inf`` marks a partial that saw no key.

    Returns
    -------
    out : Tensor, shape (..., D), dtype of ``out_a``
        ``w_a out_a + w_b out_b`` with ``w_x = exp(lse_x - lse)``, computed in float32.
    lse : Tensor, shape (...), float32
        ``logaddexp(lse_a, lse_b)``; ``-inf`` (with an output of zeros, never NaN) when both
        partials are empty. A NaN in either input propagates.

    Raises
    ------
    ValueError
        Mismatched shapes. TypeError: non-tensor input.
    """
    for name, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"merge_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise ValueError(f"merge_attention: expected out_a, out_b of one shape (..., D) and lse_a, lse_b of shape "
                         f"(...); got {tuple(out_a.shape)}, {tuple(lse_a.shape)}, {tuple(out_b.shape)}, "
                         f"{tuple(lse_b.shape)}")
    return _merge_stacked(torch.stack([out_a, out_b]), torch.stack([lse_a.float(), lse_b.float()]), out_a.dtype)


def _local_pieces(n_queries: int, n_keys: int, offset: int, total_keys: int, mode: str):
    """The attention calls that mask this rank's keys (global positions offset + j) correctly.

    Query i sees global key g when g <= i + c (c = 0 for "top_left", total - Sq for
    "bottom_right"), i.e. local key j when j <= i + c - offset. The attention op only offers
    c' = 0 ("top_left") and c' = Sk - Sq ("bottom_right") on its own inputs, so each case becomes
    slices: returns [(query_start, key_start, key_stop, mode)] covering every visible pair once.
    """
    if mode == "none" or n_keys == 0:
        return [(0, 0, n_keys, "none")] if n_keys else []
    shift = (0 if mode == "top_left" else total_keys - n_queries) - offset  # j <= i + shift
    if shift >= n_keys - 1:
        return [(0, 0, n_keys, "none")]  # every query sees every local key
    if shift <= 0:
        # Queries before -shift see nothing; from there query i' = i + shift sees j <= i'.
        return [(-shift, 0, n_keys, "top_left")] if -shift < n_queries else []
    # 0 < shift < Sk - 1: keys j <= shift are visible to every query, key shift + j' to i >= j'.
    return [(0, 0, shift, "none"), (0, shift, n_keys, "top_left")]


def _attention_partial(q, k, v, offset, total_keys, mode, scale):
    """This rank's (out, lse) over its keys, float32 lse; rows with no visible key: zeros and -inf."""
    attention_ops = importlib.import_module("onlinesoftmax.attention")
    batch, heads, n_queries, head_dim = q.shape
    outs, lses = [], []
    for q_start, k_start, k_stop, piece_mode in _local_pieces(n_queries, k.shape[2], offset, total_keys, mode):
        out_p, lse_p = attention_ops.attention(q[:, :, q_start:], k[:, :, k_start:k_stop], v[:, :, k_start:k_stop],
                                               causal=False if piece_mode == "none" else piece_mode,
                                               scale=scale, return_lse=True)
        out_full = torch.zeros((batch, heads, n_queries, head_dim), dtype=q.dtype, device=q.device)
        lse_full = torch.full((batch, heads, n_queries), float("-inf"), device=q.device)
        out_full[:, :, q_start:] = out_p
        lse_full[:, :, q_start:] = lse_p
        outs.append(out_full)
        lses.append(lse_full)
    if not outs:
        return (torch.zeros((batch, heads, n_queries, head_dim), dtype=q.dtype, device=q.device),
                torch.full((batch, heads, n_queries), float("-inf"), device=q.device))
    if len(outs) == 1:
        return outs[0], lses[0]
    return _merge_stacked(torch.stack(outs), torch.stack(lses), q.dtype)


class _ContextParallelAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mode, scale, group, offset, total_keys):
        out_r, lse_r = _attention_partial(q, k, v, offset, total_keys, mode, scale)
        # The one collective of the forward: each rank's partial (out, lse) as one byte buffer.
        payload = torch.cat([out_r.contiguous().view(torch.uint8).reshape(-1),
                             lse_r.contiguous().view(torch.uint8).reshape(-1)])
        gathered = _all_gather(payload, group)
        world = gathered.shape[0]
        out_bytes = out_r.numel() * out_r.element_size()
        outs = gathered[:, :out_bytes].contiguous().view(q.dtype).reshape((world,) + tuple(out_r.shape))
        lses = gathered[:, out_bytes:].contiguous().view(torch.float32).reshape((world,) + tuple(lse_r.shape))
        out, lse = _merge_stacked(outs, lses, q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (mode, scale, group, offset, total_keys)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        # The flash backward of each local piece with the GLOBAL (out, lse): P = exp(s - lse) and
        # delta = rowsum(d_out * out) are then the full attention's, so dk and dv of this rank's
        # keys are exact and dq is this rank's share; the shares are summed in rank order.
        q, k, v, out, lse = ctx.saved_tensors
        mode, scale, group, offset, total_keys = ctx.config
        attention_ops = importlib.import_module("onlinesoftmax.attention")
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        d_out = torch.zeros_like(out) if d_out is None else d_out.to(out.dtype)
        for q0, k0, k1, piece_mode in _local_pieces(q.shape[2], k.shape[2], offset, total_keys, mode):
            dq_p, dk_p, dv_p = attention_ops._backward(
                d_out[:, :, q0:].contiguous(), q[:, :, q0:].contiguous(), k[:, :, k0:k1].contiguous(),
                v[:, :, k0:k1].contiguous(), out[:, :, q0:].contiguous(), lse[:, :, q0:].contiguous(),
                piece_mode, scale)
            dq[:, :, q0:] += dq_p.float()
            dk[:, :, k0:k1] += dk_p.float()
            dv[:, :, k0:k1] += dv_p.float()
        dq = _all_gather(dq, group).sum(0)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def attention(q: torch.Tensor, k_shard: torch.Tensor, v_shard: torch.Tensor, *, causal=False,
              scale: Optional[float] = None, group=None, return_lse: bool = False):
    """Context-parallel attention: the keys and values are sharded along the sequence across ranks.

    Parameters
    ----------
    q : Tensor, shape (B, Hq, Sq, D)
        Every query, the same on every rank (float16 or bfloat16, as :func:`onlinesoftmax.attention`).
    k_shard, v_shard : Tensor, shape (B, Hkv, Sk_r, D)
        This rank's contiguous shard of the keys and values (rank 0 the first positions); shard
        lengths may differ, 0 included.
    causal : bool or {"top_left", "bottom_right"}
        As :func:`onlinesoftmax.attention`, over the global key positions (shard offset + local
        index): ``True``/``"top_left"`` lets query i see global keys ``<= i``; ``"bottom_right"``
        keys ``<= i + Sk - Sq`` with Sk the total over ranks.
    scale : float, optional
        ``1 / sqrt(D)`` by default.
    group : ProcessGroup, optional
        The default group when None.
    return_lse : bool
        Also return the float32 log-sum-exp over all keys (B, Hq, Sq); not differentiable.

    Returns
    -------
    out : Tensor, shape (B, Hq, Sq, D), dtype of ``q``; bitwise the same on every rank
    lse : Tensor (only with ``return_lse``)

    Notes
    -----
    Two collectives: an all_gather of the 16-integer shape description (which gives each rank
    its shard offset for the causal mask and checks that the shards fit), then one all_gather of
    each rank's partial (out, lse) as bytes; every rank merges the partials in rank order with the
    log-sum-exp weights of :func:`merge_attention` (fp32; a rank whose keys a query cannot see
    sends lse ``-inf`` and weighs 0). The causal mask of a shard is one or two calls of the
    attention op on slices (its ``top_left`` mask on a query or key slice, or no mask).

    Differentiable: the backward pass runs the attention op's backward on each local piece with
    the merged (out, lse), which makes dk and dv of this rank's keys exact and dq this rank's
    share, then all-gathers the fp32 dq shares and sums them in rank order (q is replicated, so
    every rank receives the full dq). ``d_out`` must be the same on every rank (a loss computed
    redundantly), as for any replicated output.

    Raises
    ------
    As :func:`onlinesoftmax.attention`, plus RuntimeError (not initialized) and ValueError (the
    group cannot communicate this device's tensors; shapes other than the key length differ).
    """
    attention_ops = importlib.import_module("onlinesoftmax.attention")
    name = "distributed.attention"
    mode, scale = attention_ops._check(q, k_shard, v_shard, causal, scale)
    check_group(q.device, group, name)
    table = _gather_shapes(k_shard, 2, group, name, extra=q.shape[2] * 100003 + q.shape[1])
    rank = dist.get_rank(group)
    sizes = table[:, 3]
    offset, total_keys = int(sizes[:rank].sum()), int(sizes.sum())
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_shard, v_shard)):
        out, lse = _ContextParallelAttentionFunction.apply(q, k_shard, v_shard, mode, scale, group, offset, total_keys)
    else:
        out, lse = _ContextParallelAttentionFunction.forward(_NoContext(), q, k_shard, v_shard, mode, scale, group,
                                                             offset, total_keys)
    return (out, lse) if return_lse else out


__all__ = ["softmax", "log_softmax", "logsumexp", "softmax_topk", "merge_attention", "attention",
           "check_group", "last_strategy", "DimensionError"]
