"""softmax_topk: custom ops for torch.compile, autograd and the public function."""

from __future__ import annotations

from typing import Optional

import torch

from ... import _autocast, _validate
from ..._autocast import any_enabled as _any_autocast
from ..._device import plan_cache, remember
from ..._launch import op_when_compiling
from . import plan as planner
from .kernels import MAX_COLS
from .launch import launch_backward, launch_forward, rows_view

# --------------------------------------------------------------------------------------------
# Custom ops: torch.compile sees opaque ops with fake (shape-only) implementations
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("onlinesoftmax::softmax_topk", mutates_args=())
def _forward_op(x2: torch.Tensor, k: int, temperature: float, strategy: Optional[str], block: Optional[int],
                num_chunks: Optional[int],
                float32_values: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(x2, k, temperature, strategy, block, num_chunks, float32_values)


@_forward_op.register_fake
def _(x2, k, temperature, strategy, block, num_chunks, float32_values=False):
    rows = x2.shape[0]
    return (x2.new_empty((rows, k), dtype=torch.float32 if float32_values else x2.dtype),
            x2.new_empty((rows, k), dtype=torch.int64),
            x2.new_empty((rows,), dtype=torch.float32), x2.new_empty((rows,), dtype=torch.float32))


@torch.library.custom_op("onlinesoftmax::softmax_topk_backward", mutates_args=())
def _backward_op(x2: torch.Tensor, lse: torch.Tensor, lse_low: torch.Tensor, indices: torch.Tensor, dv: torch.Tensor,
                 dlse: torch.Tensor, temperature: float, strategy: Optional[str], block: Optional[int],
                 num_chunks: Optional[int]) -> torch.Tensor:
    return launch_backward(x2, lse, lse_low, indices, dv, dlse, temperature, strategy, block, num_chunks)


@_backward_op.register_fake
def _(x2, lse, lse_low, indices, dv, dlse, temperature, strategy, block, num_chunks):
    return x2.new_empty(x2.shape)


_forward = op_when_compiling(_forward_op, launch_forward)
_backward = op_when_compiling(_backward_op, launch_backward)


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _SoftmaxTopkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, k, temperature, strategy, block, num_chunks, float32_values):
        values, indices, lse, lse_low = _forward(x2, k, temperature, strategy, block, num_chunks, float32_values)
        ctx.save_for_backward(x2, lse, lse_low, indices)
        ctx.config = (temperature, strategy, block, num_chunks)
        ctx.mark_non_differentiable(indices)
        ctx.set_materialize_grads(False)  # else autograd allocates and fills zeros for every unused gradient
        return values, indices, lse

    @staticmethod
    def backward(ctx, dv, _dindices, dlse):
        x2, lse, lse_low, indices = ctx.saved_tensors
        if dv is None:
            dv = torch.zeros(indices.shape, dtype=torch.float32, device=x2.device)
        if dlse is None:
            dlse = torch.zeros(lse.shape, dtype=torch.float32, device=x2.device)
        dx = _backward(x2, lse, lse_low, indices, dv, dlse, *ctx.config)
        return dx, None, None, None, None, None, None


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# Signatures already checked (shape, dtype, device, k, dim, sorted): the checks run once for each.
_CHECKED: dict = {}
plan_cache(_CHECKED.clear)


def _check(x, k, dim, temperature, sorted):
    name = "softmax_topk"
    _validate.tensor(x, name)
    _validate.float_dtype(x, name, SUPPORTED_DTYPES)
    _validate.device(x, name)
    dim = _validate.dim(dim, x.dim(), name)
    _validate.integer(k, name, "k")
    size = x.shape[dim] if x.dim() else 1
    if not 0 <= k <= size:
        raise ValueError(f"softmax_topk: k must be in [0, {size}] (the size of dim {dim}), got {k}")
    if size > MAX_COLS:
        raise ValueError(f"softmax_topk: rows longer than {MAX_COLS} elements are not supported, got {size}")
    _validate.positive(temperature, name, "temperature")
    if not isinstance(sorted, bool):
        raise TypeError(f"softmax_topk: sorted must be a bool, got {type(sorted).__name__}")
    return dim


def softmax_topk(x: torch.Tensor, k: int, dim: int = -1, *, temperature: float = 1.0, sorted: bool = True,
                 return_lse: bool = False, strategy: Optional[str] = None):
    """The ``k`` largest probabilities of ``softmax(x / temperature, dim)`` and their indices, in one read of ``x``.

    Equal to ``torch.topk(torch.softmax(x / temperature, dim), k, dim)`` (up to fp32 rounding of
    the probabilities), computed without materializing the softmax: the online normalizer and a
    running top-k share one pass (Milakov & Gimelshein, 2018, arXiv:1805.02867).

    Parameters
    ----------
    x : Tensor
        float32, float16 or bfloat16, any shape and strides, on CUDA or CPU.
    k : int
        ``0 <= k <= x.shape[dim]``. K up to 256 runs the fused Triton kernels; larger K the
        vectorized torch path.
    dim : int
        The dimension to normalize and select over.
    temperature : float
        Divides the logits; finite and > 0.
    sorted : bool
        Accepted for torch.topk compatibility; the result is always sorted (descending).
    return_lse : bool
        Also return the row's ``logsumexp(x / temperature)`` in float32 (log-probabilities are
        ``x / temperature - lse``; samplers need it).
    strategy : {"single", "split"}, optional
        Expert/testing override of the launch plan (see ``onlinesoftmax/ops/topk/plan.py``, ``topk_plan``).

    Returns
    -------
    values : Tensor
        ``x``'s shape with ``dim`` of size ``k``, in ``x.dtype`` (float32 inside a CUDA autocast
        region, as ``torch.topk(torch.softmax(x, dim), k)`` there), descending along ``dim``.
    indices : Tensor
        int64, same shape: positions along ``dim``.
    lse : Tensor, only with ``return_lse``
        float32, ``x``'s shape without ``dim``.

    Notes
    -----
    Ranking is by ``x / temperature`` in float32 (softmax is monotone). Ties: the lower index
    wins, always (``-0.0`` equals ``0.0``). ``-inf`` logits have probability 0 and rank last
    (still chosen by lower index when ``k`` exceeds the finite entries). A row that
    ``torch.softmax`` turns into NaN (it holds NaN or ``+inf``, or is all ``-inf``) gives NaN
    values, and since all its probabilities tie, indices ``0 .. k-1``. Differentiable with
    respect to ``x`` through the values and the lse (a Triton kernel:
    ``dx = (scatter(dv * v) - y * (<dv, v> - dlse)) / T``); indices are not differentiable.
    Deterministic: the result is bitwise identical across runs. Traceable by
    ``torch.compile(fullgraph=True)``.

    Raises
    ------
    TypeError
        Non-tensor or non-float input, non-int ``k`` or ``dim``, non-real ``temperature``.
    ValueError
        ``k`` outside ``[0, size]``, ``temperature`` <= 0 or not finite, unknown ``strategy``,
        a device other than CUDA or CPU, ``dim`` out of range (:class:`DimensionError`).

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> onlinesoftmax.softmax_topk(torch.tensor([1.0, 3.0, 2.0, 3.0]), 2)
    (tensor([0.3995, 0.3995]), tensor([1, 3]))
    """
    try:
        # While torch.compile traces, no lookup by shape: it would specialize every dim to its
        # traced value (a dynamic batch compiled again at each new size).
        signature = None if torch.compiler.is_compiling() else (x.shape, x.dtype, x.device, k, dim, sorted)
    except AttributeError:
        signature = None
    checked_dim = _CHECKED.get(signature) if signature is not None else None
    if checked_dim is None or type(temperature) is not float or not 0.0 < temperature < float("inf"):
        checked_dim = _check(x, k, dim, temperature, sorted)
        if signature is not None:
            remember(_CHECKED, signature, checked_dim)
    dim = checked_dim
    if strategy is not None and strategy not in planner.TOPK_STRATEGIES:
        raise ValueError(f"softmax_topk: strategy must be None or one of {planner.TOPK_STRATEGIES}, got {strategy!r}")
    squeeze = x.dim() == 0
    if squeeze:
        x = x.reshape(1)
    # Rows already in the last dim of a 2-d tensor skip the view and reshape calls (each costs
    # microseconds of host time, which decode-sized calls feel).
    as_rows = x.dim() == 2 and dim == 1
    x2 = x if as_rows else rows_view(x, dim)
    # Inside an autocast region on CUDA torch's softmax is float32, and so are the values
    # torch.topk takes from it (see onlinesoftmax._autocast).
    float32_values = _any_autocast() and _autocast.float32_result("softmax", x)
    args = (x2, k, float(temperature), strategy, None, None, float32_values)
    if x.requires_grad and torch.is_grad_enabled():
        values, indices, lse = _SoftmaxTopkFunction.apply(*args)
    elif return_lse or torch.compiler.is_compiling():
        values, indices, lse, _ = _forward(*args)
    else:
        # An eager call that drops the lse: the kernels skip it (two allocations fewer a call).
        values, indices, lse, _ = launch_forward(*args, write_lse=False)
    if as_rows:
        return (values, indices, lse) if return_lse else (values, indices)
    moved = x.movedim(dim, -1).shape
    values = values.reshape(*moved[:-1], k).movedim(-1, dim)
    indices = indices.reshape(*moved[:-1], k).movedim(-1, dim)
    if squeeze:  # a 0-d input gives 0-d results, as torch.topk (k = 0: one-dimensional and empty)
        shape = (0,) if k == 0 else ()
        values, indices = values.reshape(shape), indices.reshape(shape)
    if not return_lse:
        return values, indices
    lse = lse.reshape(() if squeeze else moved[:-1])
    return values, indices, lse
