"""softmax, log_softmax and logsumexp: custom ops for torch.compile, autograd, the public functions.

Every strategy computes the online normalizer (m, d) of each row (Milakov & Gimelshein, 2018) and then writes
y = exp(x - m) / d; ``plan.py`` picks where the row lives meanwhile, ``launch.py`` launches it.

The public functions keep the host's work per call small, since training and serving code calls
them eagerly many times a step: a call's signature (shape, strides, dtypes, options) maps to a
prepared route in one dictionary lookup, so argument checks and planning run once per signature.
Calls that the plan gives to torch's own kernels (CPU tensors, float64, other dtypes, and small
eager CUDA calls: plan.EAGER_HOST_US) call torch directly, autograd included.
"""

from __future__ import annotations

import math

from typing import NamedTuple, Optional, Sequence, Union

import torch

from ... import _autocast, _validate
from ..._autocast import any_enabled as _any_autocast
from ..._device import capturing, interpreter_active, plan_cache, remember
from ..._launch import op_when_compiling
from . import eager_route
from . import plan as planner
from .launch import forward_call, launch_backward, launch_forward, torch_forward

# --------------------------------------------------------------------------------------------
# Custom ops: torch.compile sees two opaque ops with fake (shape-only) implementations
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("onlinesoftmax::forward", mutates_args=())
def _forward_op(x: torch.Tensor, dim: int, op: str, temperature: float, out_dtype: Optional[torch.dtype],
                algorithm: str, strategy: Optional[str]) -> torch.Tensor:
    return launch_forward(x, dim, op, temperature, out_dtype, algorithm, strategy)


@_forward_op.register_fake
def _(x, dim, op, temperature, out_dtype, algorithm, strategy):
    if op == "logsumexp":
        return x.new_empty(x.shape[:dim] + x.shape[dim + 1:], dtype=torch.float32)
    return x.new_empty(x.shape, dtype=out_dtype or x.dtype)


@torch.library.custom_op("onlinesoftmax::backward", mutates_args=())
def _backward_op(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, temperature: float,
                 out_dtype: Optional[torch.dtype], strategy: Optional[str]) -> torch.Tensor:
    return launch_backward(y, dy, dim, log, temperature, out_dtype, strategy)


@_backward_op.register_fake
def _(y, dy, dim, log, temperature, out_dtype, strategy):
    return y.new_empty(y.shape, dtype=out_dtype or y.dtype)


_forward = op_when_compiling(_forward_op, launch_forward)
_backward = op_when_compiling(_backward_op, launch_backward)


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, log, temperature, out_dtype, algorithm, strategy):
        y = _forward(x, dim, "log_softmax" if log else "softmax", temperature, out_dtype, algorithm, strategy)
        ctx.save_for_backward(y)
        ctx.config = (dim, log, temperature, x.dtype, strategy)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dim, log, temperature, x_dtype, strategy = ctx.config
        return _backward(y, dy, dim, log, temperature, x_dtype, strategy), None, None, None, None, None, None


class _EagerSoftmaxFunction(torch.autograd.Function):
    """_SoftmaxFunction for eager calls: the signature's prepared forward (launch.ForwardCall) in
    one argument, which finds its backward by dy's layout alone; apply's own host time grows with
    its arguments, and an eager training step is the host's time where rows are few."""

    @staticmethod
    def forward(ctx, x, call, temperature):
        y = call(x, temperature)
        ctx.save_for_backward(y)
        ctx.call, ctx.temperature = call, temperature
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return ctx.call.backward(y, dy, ctx.temperature), None, None


class _LogSumExpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, strategy, out_dtype):
        lse = _forward(x, dim, "logsumexp", 1.0, None, "auto", strategy)
        ctx.save_for_backward(x, lse)
        ctx.dim = dim
        # A fresh tensor even for float32: returning the saved tensor itself gave a wrong gradient
        # under torch.compile on CUDA (torch 2.11; the copy is one float per row).
        return lse.to(out_dtype, copy=True)

    @staticmethod
    def backward(ctx, dlse):
        # d lse / dx = softmax(x): one elementwise expression in torch, from the fp32 lse.
        x, lse = ctx.saved_tensors
        grad = dlse.float().unsqueeze(ctx.dim) * torch.exp(x.float() - lse.unsqueeze(ctx.dim))
        return grad.to(x.dtype), None, None, None


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------

DimensionError = _validate.DimensionError
KERNEL_DTYPES = planner.KERNEL_DTYPES


class _Route(NamedTuple):
    """What one call signature of a public function does, decided once."""

    dim: int
    cast_to: Optional[torch.dtype]  # the input is rounded to this dtype first (torch's dtype= semantics)
    out_dtype: Optional[torch.dtype]
    torch_path: bool  # torch's own kernels (the plan's "torch" strategy), autograd included
    torch_plan: Optional[planner.Plan]  # what last_plan() reports for it
    # Eager calls run torch's kernel (plan.EAGER_HOST_US), without autograd / differentiated.
    eager_torch: bool = False
    eager_torch_train: bool = False
    # torch.softmax or torch.log_softmax where a call at temperature 1 is that function of (x, dim)
    # alone (no cast, no other output dtype): the torch paths' whole work, one call.
    torch_fn: Optional[object] = None
    device_index: int = -1  # x's CUDA device (the eager route's capture check)


_ROUTES: dict = {}
plan_cache(_ROUTES.clear)


def _temperature(temperature, name: str) -> float:
    if temperature == 1.0 and type(temperature) in (float, int):
        return 1.0
    return _validate.positive(temperature, name, "temperature")


def _softmax_route(x, dim, dtype, algorithm, strategy, name, traced=False) -> _Route:
    _validate.tensor(x, name)
    _validate.device(x, name)
    dim = _validate.dim(dim, x.dim(), name)
    _validate.choice(algorithm, planner.ALGORITHMS, name, "algorithm")
    if strategy is not None:
        _validate.choice(strategy, planner.STRATEGIES, name, "strategy")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: dtype must be a torch.dtype or None, got {type(dtype).__name__}")
    if dtype is None and not x.dtype.is_floating_point:
        raise TypeError(f"{name} needs a floating-point tensor, got {_validate.dtype_name(x.dtype)}; pass "
                        f"dtype=torch.float32 to compute in float32 (as torch.{name}(x, dim, dtype=...) does)")
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"{name}: dtype must be a floating-point dtype, got {_validate.dtype_name(dtype)}")
    compute = dtype or x.dtype
    kernels = compute in KERNEL_DTYPES
    if strategy in planner.TRITON_STRATEGIES and not kernels:
        raise ValueError(f"{name}: strategy {strategy!r} runs Triton kernels, which take float32, float16 and "
                         f"bfloat16; got {_validate.dtype_name(compute)}")
    # torch casts the input to ``dtype`` first. Upcasting a half input is exact, so the kernels
    # read it as it is and write the wider dtype; anything else is cast.
    exact = x.dtype in KERNEL_DTYPES and dtype is not None and dtype.itemsize >= x.dtype.itemsize
    cast_to = dtype if dtype is not None and dtype != x.dtype and not exact else None
    torch_path = not kernels or strategy == "torch" or (strategy is None and (
        x.device.type != "cuda" and not interpreter_active()))
    plain = cast_to is None and dtype in (None, x.dtype)
    torch_fn = (torch.log_softmax if name == "log_softmax" else torch.softmax) if plain else None
    if traced:  # nothing read of the sizes (see _softmax_like)
        return _Route(dim, cast_to, dtype, torch_path, None, torch_fn=torch_fn)
    if torch_path:
        return _Route(dim, cast_to, dtype, True, _torch_plan(name, x, dim, _TORCH_KERNEL_REASON), torch_fn=torch_fn)
    eager, eager_train = _eager_torch(name, x, dim, strategy, algorithm, x.dtype if cast_to is None else cast_to,
                                      dtype)
    return _Route(dim, cast_to, dtype, False, _torch_plan(name, x, dim, _EAGER_TORCH_REASON), eager, eager_train,
                  torch_fn, x.get_device())


_TORCH_KERNEL_REASON = "torch's own kernel for this device / dtype"
_EAGER_TORCH_REASON = "an eager call whose torch kernel finishes within our host time (plan.EAGER_HOST_US)"


def _eager_torch(name, x, dim, strategy, algorithm, dtype, out_dtype) -> tuple[bool, bool]:
    """(without autograd, differentiated): whether an eager call of this signature runs torch's kernel."""
    if strategy is not None or algorithm != "auto" or x.device.type != "cuda":
        return False, False  # an explicit strategy or algorithm asks for our kernels
    cols = x.shape[dim] if x.dim() else 1
    rows = x.numel() // cols if cols else 0
    chosen = planner.choose(name, rows, cols, dtype, x.device, algorithm)
    inner = math.prod(x.shape[dim + 1:]) if x.dim() else 1  # torch's kernels over the dim's inner elements
    return (eager_route.eager_torch(chosen, False, out_dtype, inner=inner),
            eager_route.eager_torch(chosen, True, out_dtype, inner=inner))


_compiling = torch.compiler.is_compiling


def _runs_torch(torch_path: bool, eager_torch: bool, eager_torch_train: bool, grad: bool, device_index: int) -> bool:
    """Whether a call outside torch.compile's tracing takes torch's own kernel: the plan's torch
    path, or the eager torch route (differentiated or not) where the host decides (the call is not
    captured into a CUDA graph)."""
    return torch_path or ((eager_torch_train if grad else eager_torch) and not capturing(device_index))


def _route(key, make, *args):
    """The route of call signature ``key``, made by ``make(*args)`` the first time (every time where
    ``key`` is None or unhashable: not a tensor, odd arguments, whose checks then raise)."""
    try:
        route = _ROUTES.get(key)
    except TypeError:
        return make(*args)
    if route is None:
        route = make(*args)
        if key is not None:
            remember(_ROUTES, key, route)
    return route


# The eager forward of a kernel-path signature, kept beside its route: one lookup a call.
_FORWARD_CALLS: dict = {}
plan_cache(_FORWARD_CALLS.clear)


def _torch_plan(op, x, dim, reason) -> planner.Plan:
    cols = x.shape[dim] if x.dim() else 1
    return planner.Plan(op, "torch", "auto", x.numel() // cols if cols else 1, cols, x.dtype, reason=reason)


def _softmax_like(x, dim, dtype, temperature, algorithm, strategy, log):
    # The hit path is a few attribute reads and one lookup: small eager calls are the host's time,
    # and where the route gives a call to torch, these lines are all that ours adds to torch's own
    # call (bench host measures it): they are kept few and inline. While torch.compile traces, no
    # lookup by shape and no plan: a size read as a Python value would specialize its dim to the
    # traced value, and a model compiled with a dynamic batch would be compiled again at each new
    # batch size (the custom ops plan each launch when they run). Inside an autocast region, torch's
    # policy: float32 out of a half input on CUDA (see _autocast).
    if _any_autocast() and dtype is None and _autocast.float32_result("log_softmax" if log else "softmax", x):
        dtype = torch.float32
    traced = _compiling()
    if traced:
        key = None
        route = _softmax_route(x, dim, dtype, algorithm, strategy, "log_softmax" if log else "softmax", traced=True)
    else:
        try:
            key = (x.shape, x.stride(), x.dtype, x.device, dim, dtype, algorithm, strategy, log)
        except AttributeError:
            key = None
        try:
            route = _ROUTES[key]
        except (KeyError, TypeError):  # a new signature, unhashable arguments, not a tensor (whose checks raise)
            route = _route(key, _softmax_route, x, dim, dtype, algorithm, strategy,
                           "log_softmax" if log else "softmax")
    grad = x.requires_grad and torch.is_grad_enabled()
    # (A traced route has no eager route: its torch path alone.)
    torch_kernel = _runs_torch(route.torch_path, route.eager_torch, route.eager_torch_train, grad, route.device_index)
    if torch_kernel and route.torch_fn is not None and type(temperature) is float and temperature == 1.0:
        planner.record(route.torch_plan)
        return route.torch_fn(x, route.dim)
    name = "log_softmax" if log else "softmax"
    if type(temperature) is not float or temperature != 1.0:
        temperature = _temperature(temperature, name)
    if route.cast_to is not None:
        x = x.to(route.cast_to)
    if torch_kernel:
        planner.record(route.torch_plan)
        return torch_forward(x, route.dim, name, 1.0 / temperature, route.out_dtype or x.dtype)
    if x.dim() == 0:
        return _softmax_like(x.reshape(1), 0, dtype, temperature, algorithm, strategy, log).reshape(())
    if traced:
        if grad:
            return _SoftmaxFunction.apply(x, route.dim, log, temperature, route.out_dtype, algorithm, strategy)
        return _forward_op(x, route.dim, name, temperature, route.out_dtype, algorithm, strategy)
    call = _FORWARD_CALLS.get(key)
    if call is None:
        call = remember(_FORWARD_CALLS, key, forward_call(x, route.dim, name, route.out_dtype, algorithm, strategy))
    if grad:
        return _EagerSoftmaxFunction.apply(x, call, temperature)
    return call(x, temperature)


def softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None, *, temperature: float = 1.0,
            algorithm: str = "auto", strategy: Optional[str] = None) -> torch.Tensor:
    """Softmax of ``x / temperature`` along ``dim``, computed with the online normalizer.

    A drop-in for ``torch.softmax(x, dim, dtype)``: same arguments in the same places, same result.

    Parameters
    ----------
    x : Tensor
        Any shape (0-d included) and strides, on CUDA or CPU. float32, float16 and bfloat16 run
        the Triton kernels on CUDA; float64 (and any input with a ``dtype`` the kernels do not
        take) runs torch's own kernels, as do CPU tensors (see Notes).
    dim : int
        The dimension to normalize over (negative counts from the end).
    dtype : torch.dtype, optional
        As in torch: the input is cast to ``dtype`` before the operation and the result has that
        dtype (an upcast of a half input is exact, so the kernels read it as it is). Needed for
        integer inputs. Accumulation is float32 in the kernels in every case.
    temperature : float
        Divides the logits before the softmax; finite and > 0.
    algorithm : {"auto", "online", "safe"}
        ``"safe"``: three passes over memory (max, sum, write), the classic safe softmax. ``"online"``: two
        (the (m, d) recurrence, then the write). ``"auto"``: the fastest strategy for the shape,
        one pass when the row fits on chip.
    strategy : str, optional
        Expert/testing override (see ``onlinesoftmax/ops/softmax/plan.py``): the Triton strategies
        ``"row_on_chip"``, ``"looped"``, ``"split_row"``, ``"split_row_on_chip"``; ``"torch"``
        (torch's kernel); ``"vectorized"`` (the online split-and-merge algorithm in torch ops).

    Returns
    -------
    Tensor
        Same shape as ``x``, contiguous, dtype ``dtype or x.dtype``.

    Notes
    -----
    Semantics follow ``torch.softmax``: ``-inf`` entries give 0, a row that is all ``-inf`` gives
    NaN, any NaN or ``+inf`` in a row makes the whole row NaN. Differentiable (Triton backward
    kernels) and traceable by ``torch.compile(fullgraph=True)``. CPU tensors run torch's own
    kernel (torch's speed); under ``TRITON_INTERPRET=1`` they run the Triton kernels. So do eager
    CUDA calls small enough that torch's kernel would finish within our host time
    (``plan.EAGER_HOST_US``; ``onlinesoftmax explain`` says which): the result is torch's. Under
    CUDA-graph capture and torch.compile the Triton kernels run at every size.

    Raises
    ------
    TypeError
        Non-tensor input, a non-floating input without ``dtype``, a non-float ``dtype``.
    ValueError
        ``temperature`` <= 0 or not finite, unknown ``algorithm`` or ``strategy``, a Triton
        strategy for a dtype the kernels do not take, a device other than CUDA or CPU, ``dim`` out
        of range (:class:`DimensionError`, also an IndexError).

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> onlinesoftmax.softmax(torch.tensor([1.0, 2.0, 3.0]))
    tensor([0.0900, 0.2447, 0.6652])
    """
    return _softmax_like(x, dim, dtype, temperature, algorithm, strategy, log=False)


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None, *, temperature: float = 1.0,
                algorithm: str = "auto", strategy: Optional[str] = None) -> torch.Tensor:
    """Log-softmax of ``x / temperature`` along ``dim``: ``(x - m) - log(d)`` from the online normalizer.

    A drop-in for ``torch.log_softmax(x, dim, dtype)``. Same arguments, dtypes, layouts and errors
    as :func:`softmax`. ``-inf`` entries give ``-inf``; all ``-inf`` rows, NaN and ``+inf`` give
    NaN rows, as ``torch.log_softmax``.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> onlinesoftmax.log_softmax(torch.tensor([1.0, 2.0, 3.0]))
    tensor([-2.4076, -1.4076, -0.4076])
    """
    return _softmax_like(x, dim, dtype, temperature, algorithm, strategy, log=True)


def _logsumexp_route(x, dim, keepdim, strategy, traced=False) -> tuple:
    name = "logsumexp"
    _validate.tensor(x, name)
    _validate.device(x, name)
    dims = (dim,) if isinstance(dim, int) and not isinstance(dim, bool) else tuple(dim)
    if not dims:
        raise ValueError("logsumexp: dim must name at least one dimension")
    dims = tuple(sorted({_validate.dim(d, x.dim(), name) for d in dims}))
    if strategy is not None:
        _validate.choice(strategy, planner.STRATEGIES, name, "strategy")
    if not isinstance(keepdim, bool):
        raise TypeError(f"logsumexp: keepdim must be a bool, got {type(keepdim).__name__}")
    # torch computes integer and bool inputs in the default float dtype.
    compute = x.dtype if (x.dtype.is_floating_point or x.dtype.is_complex) else torch.get_default_dtype()
    kernels = compute in KERNEL_DTYPES
    if strategy in planner.TRITON_STRATEGIES and not kernels:
        raise ValueError(f"logsumexp: strategy {strategy!r} runs Triton kernels, which take float32, float16 and "
                         f"bfloat16; got {_validate.dtype_name(x.dtype)}")
    torch_path = not kernels or strategy == "torch" or (strategy is None and (
        x.device.type != "cuda" and not interpreter_active()))
    if traced:  # nothing read of the sizes (see _softmax_like)
        return dims, compute, None, torch_path, (False, False, -1)
    if torch_path:
        return dims, compute, _torch_plan("logsumexp", x, dims[-1], _TORCH_KERNEL_REASON), True, (True, True, -1)
    eager = _eager_torch("logsumexp", x, dims[-1], strategy, "auto", compute, None)
    return (dims, compute, _torch_plan("logsumexp", x, dims[-1], _EAGER_TORCH_REASON), False,
            (*eager, x.get_device()))


def logsumexp(x: torch.Tensor, dim: Union[int, Sequence[int]] = -1, keepdim: bool = False, *,
              strategy: Optional[str] = None) -> torch.Tensor:
    """``log(sum(exp(x), dim))`` as ``m + log(d)`` from the online normalizer: the primitive behind softmax.

    A drop-in for ``torch.logsumexp(x, dim, keepdim)``.

    Parameters
    ----------
    x : Tensor
        Any shape and strides, on CUDA or CPU. Integer and bool inputs are computed in the
        default float dtype, as torch does; float64 and complex run torch's own kernel.
    dim : int or sequence of ints
        The dimension(s) to reduce; several are reduced as one (moved last and flattened).
    keepdim : bool
        Keep the reduced dims with size 1.
    strategy : str, optional
        As in :func:`softmax` (the Triton strategies that write a log-sum-exp: ``"row_on_chip"``,
        ``"looped"``, ``"split_row"``).

    Returns
    -------
    Tensor
        ``x``'s shape without ``dim`` (or with size-1 dims), in ``x.dtype`` (the default float
        dtype for integer inputs), computed in float32. Conventions of ``torch.logsumexp``: an all
        ``-inf`` (or empty) row gives ``-inf``, a ``+inf`` gives ``+inf``, NaN gives NaN.
        Differentiable (the gradient is ``softmax(x)``).

    Raises
    ------
    As :func:`softmax`.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> onlinesoftmax.logsumexp(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    tensor([0.6931, 1.6931])
    """
    traced = _compiling()
    if traced:  # no lookup by shape and no plan (see _softmax_like)
        route = _logsumexp_route(x, dim, keepdim, strategy, traced=True)
    else:
        try:
            key = ("logsumexp", x.shape, x.stride(), x.dtype, x.device,
                   dim if type(dim) is int else tuple(dim), keepdim, strategy)
        except (AttributeError, TypeError):
            key = None
        route = _route(key, _logsumexp_route, x, dim, keepdim, strategy)
    dims, compute, torch_plan, torch_path, (eager_forward, eager_train, device_index) = route
    # Inside an autocast region on CUDA torch computes it in float32 and returns float32 (torch's
    # own call below does so itself).
    out_dtype = torch.float32 if _any_autocast() and _autocast.float32_result("logsumexp", x) else compute
    if _runs_torch(torch_path, eager_forward, eager_train, x.requires_grad and torch.is_grad_enabled(), device_index):
        if not traced:
            planner.record(torch_plan)
        return torch.logsumexp(x, dims, keepdim)
    if x.dtype != compute:
        x = x.to(compute)
    if len(dims) > 1:
        x = x.movedim(dims, tuple(range(x.dim() - len(dims), x.dim()))).flatten(x.dim() - len(dims))
        reduced = x.dim() - 1
    else:
        reduced = dims[0]
    if x.dim() == 0:
        return logsumexp(x.reshape(1), 0, strategy=strategy).reshape(())
    if x.requires_grad and torch.is_grad_enabled():
        lse = _LogSumExpFunction.apply(x, reduced, strategy, out_dtype)
    else:
        lse = _forward(x, reduced, "logsumexp", 1.0, None, "auto", strategy)
        if lse.dtype != out_dtype:
            lse = lse.to(out_dtype)
    if keepdim:
        for d in dims:
            lse = lse.unsqueeze(d)
    return lse


__all__ = ["softmax", "log_softmax", "logsumexp", "DimensionError"]
