"""cross_entropy: custom ops for torch.compile, autograd and the public function."""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ... import _autocast, _validate
from ..._autocast import any_enabled as _any_autocast
from ..._device import interpreter_active, plan_cache, remember
from ..._launch import op_when_compiling
from . import plan as planner
from .launch import forward_call, launch_backward, launch_forward, launch_scale, needs_denom, same_layout_buffer
from .probability import ProbabilityCrossEntropy, forward as probability_forward
from .torch_path import compute_dtype, transformed
from ..softmax import op as _softmax_op

REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int64, torch.int32)
# float64 logits run torch's kernels (the Triton kernels take the other three), as the softmax family's do.
LOGIT_DTYPES = _validate.KERNEL_DTYPES + (torch.float64,)

# --------------------------------------------------------------------------------------------
# Custom ops: torch.compile sees opaque ops with fake (shape-only) implementations
# --------------------------------------------------------------------------------------------


def _fake_forward(x, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
                  return_lse, strategy, float32_loss=False):
    rows, stats = x.shape[0], compute_dtype(x.dtype)
    loss = x.new_empty((rows,) if reduction == "none" else (), dtype=torch.float32 if float32_loss else x.dtype)
    denom = x.new_empty((3 if needs_denom(reduction, weight is not None, label_smoothing) else 0,), dtype=stats)
    return loss, x.new_empty((rows,), dtype=stats), x.new_empty((rows,), dtype=stats), denom


@torch.library.custom_op("onlinesoftmax::cross_entropy_forward", mutates_args=())
def _forward_op(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
                reduction: str, label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                return_lse: bool, strategy: Optional[str],
                float32_loss: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(x, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
                          return_lse, strategy, float32_loss)


_forward_op.register_fake(_fake_forward)


@torch.library.custom_op("onlinesoftmax::cross_entropy_forward_inplace", mutates_args=("x",))
def _forward_inplace_op(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
                        reduction: str, label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                        return_lse: bool, strategy: Optional[str],
                        float32_loss: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(x, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
                          return_lse, strategy, float32_loss, inplace=True)


_forward_inplace_op.register_fake(_fake_forward)


@torch.library.custom_op("onlinesoftmax::cross_entropy_backward", mutates_args=())
def _backward_op(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], lse: torch.Tensor,
                 lse_low: torch.Tensor, denom: torch.Tensor, grad: torch.Tensor, ignore_index: int, reduction: str,
                 label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                 strategy: Optional[str]) -> torch.Tensor:
    return launch_backward(x, target, weight, lse, lse_low, denom, grad, ignore_index, reduction, label_smoothing,
                           z_loss, softcap, temperature, strategy)


@_backward_op.register_fake
def _(x, target, weight, lse, lse_low, denom, grad, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
      strategy):
    return x.new_empty(x.shape)


@torch.library.custom_op("onlinesoftmax::cross_entropy_scale_", mutates_args=("x",))
def _scale_op(x: torch.Tensor, grad: torch.Tensor) -> None:
    launch_scale(x, grad)


@_scale_op.register_fake
def _(x, grad):
    return None


_forward = op_when_compiling(_forward_op, launch_forward)
_forward_inplace = op_when_compiling(_forward_inplace_op, functools.partial(launch_forward, inplace=True))
_backward = op_when_compiling(_backward_op, launch_backward)


def _scale_(x, grad):
    if torch.compiler.is_compiling():
        _scale_op(x, grad)
    else:
        launch_scale(x, grad)


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, target, weight, options, launch):
        # options: (ignore_index, reduction, label_smoothing, z_loss, softcap, temperature, return_lse),
        # launch: (inplace, strategy, float32_loss, gradient_in_forward); tuples, since apply's own
        # work grows with the number of arguments.
        inplace, strategy, float32_loss, gradient_in_forward = launch
        args = (x2, target, weight, *options, strategy, float32_loss)
        call = ctx.gradient = None
        if torch.compiler.is_compiling():
            loss, lse, lse_low, denom = (_forward_inplace if inplace else _forward)(*args)
        else:
            # The eager forward's prepared call also finds its backward (by the upstream gradient alone).
            call = forward_call(*args, inplace=inplace)
            fused_call = call.gradient_call(x2, target, weight) if gradient_in_forward and not inplace else None
            if fused_call is None:
                loss, lse, lse_low, denom = call(x2, target, weight)
            else:  # the gradient now, into a new tensor (plan.gradient_in_forward), for the backward
                dx = same_layout_buffer(x2)
                loss, lse, lse_low, denom = fused_call(x2, target, weight, dx)
                ctx.gradient = (fused_call, dx)
        if inplace:
            if not torch.compiler.is_compiling():
                # x2 now holds the gradient: an earlier op that saved the logits for its own
                # backward then fails autograd's version check instead of using the gradient.
                torch.autograd.graph.increment_version(x2)
            ctx.save_for_backward(x2)
        else:
            ctx.save_for_backward(x2, target, weight, lse, lse_low, denom)
        ctx.config = (options[:6], inplace, strategy, None if inplace else call)  # in place: _scale_ alone
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # else autograd allocates and fills zeros for lse's gradient every backward
        return loss, lse

    @staticmethod
    def backward(ctx, dloss, _dlse):
        options, inplace, strategy, call = ctx.config
        if inplace:
            (dx,) = ctx.saved_tensors
            _scale_(dx, dloss)
        elif ctx.gradient is not None:
            # The forward's gradient, handed on once (written again where the upstream one is not 1);
            # a second backward of a kept graph takes the kernel below.
            (fused_call, dx), ctx.gradient = ctx.gradient, None
            dx = fused_call.backward_over(dx, *ctx.saved_tensors, dloss)
        elif call is not None and not torch.compiler.is_compiling():
            dx = call.backward(*ctx.saved_tensors, dloss)
        else:
            x2, target, weight, lse, lse_low, denom = ctx.saved_tensors
            dx = _backward(x2, target, weight, lse, lse_low, denom, dloss, *options, strategy)
        return dx, None, None, None, None


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------


def check_options(name, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature) -> float:
    """Validate the loss options shared by every cross-entropy function; returns softcap as a float (0: none)."""
    _validate.integer(ignore_index, name, "ignore_index")
    _validate.choice(reduction, REDUCTIONS, name, "reduction")
    label_smoothing = _validate.non_negative(label_smoothing, name, "label_smoothing")
    if label_smoothing > 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
    _validate.non_negative(z_loss, name, "z_loss")
    _validate.positive(temperature, name, "temperature")
    return 0.0 if softcap is None else _validate.positive(softcap, name, "softcap")


def check_call(logits, target, name, arg, ignore_index, reduction, label_smoothing, z_loss, softcap,
               temperature, probabilities=False) -> float:
    """The checks every cross-entropy entry point makes of its logits, target and options; returns
    the softcap as a float (0 for none). ``probabilities``: the entry point takes probability targets."""
    _validate.tensor(logits, name, arg)
    _validate.float_dtype(logits, name, LOGIT_DTYPES)
    _validate.device(logits, name)
    if logits.dim() == 0:
        raise ValueError(f"{name}: {arg} must have a class dim (the last), got a 0-d tensor")
    check_target(logits, target, name, probabilities=probabilities)
    return check_options(name, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature)


def check_target(logits, target, name, arg="target", probabilities=False) -> bool:
    """Class-index targets (``logits.shape[:-1]``, int64 or int32) or, where the entry point takes
    them (``probabilities``), floating targets of the logits' own shape; returns whether they are
    probabilities."""
    _validate.tensor(target, name, arg)
    floating = target.is_floating_point()
    if floating and probabilities:
        if tuple(target.shape) != tuple(logits.shape):
            raise ValueError(f"{name}: probability targets must have the logits' shape {tuple(logits.shape)}, "
                             f"got {tuple(target.shape)}")
        _validate.same_device(name, logits=logits, **{arg: target})
        return True
    if target.dtype not in TARGET_DTYPES:
        kind = "class probabilities" if floating else f"{target.dtype} targets"
        where = "here (cross_entropy takes them)" if floating else "as such"
        raise TypeError(f"{name}: {arg} must hold class indices as int64 or int32, got {kind} "
                        f"({_validate.dtype_name(target.dtype)}); they are not supported {where}")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"{name}: {arg} must have the logits' shape without the class dim (the last), "
                         f"{tuple(logits.shape[:-1])}, got {tuple(target.shape)}")
    _validate.same_device(name, logits=logits, **{arg: target})
    return False


def check_class_weight(weight, n_classes, logits, name, arg="weight") -> None:
    if weight is None:
        return
    _validate.tensor(weight, name, arg)
    _validate.float_dtype(weight, name, (torch.float32, torch.float16, torch.bfloat16, torch.float64))
    if weight.dim() != 1 or weight.shape[0] != n_classes:
        raise ValueError(f"{name}: {arg} must be a 1-d tensor of one weight per class ({n_classes}), "
                         f"got shape {tuple(weight.shape)}")
    _validate.same_device(name, logits=logits, **{arg: weight})


def class_weights(weight: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Checked class weights as the kernels take them: contiguous (they index them by class; a
    strided view was once read as if it were not). Every call: a signature does not hold the layout."""
    return None if weight is None else weight.contiguous()


def check_targets_in_range(target, n_classes, ignore_index, name) -> None:
    """CPU targets are checked on the host (no device to synchronize with); see cross_entropy's Notes.
    Not while torch.compile traces (a data-dependent branch): compiled code gives such rows NaN."""
    if target.device.type == "cpu" and target.numel() and not torch.compiler.is_compiling():
        bad = (target != ignore_index) & ((target < 0) | (target >= n_classes))
        if bool(bad.any()):
            first = int(target[bad][0])
            raise ValueError(f"{name}: target {first} is out of range for {n_classes} classes "
                             f"(and is not ignore_index={ignore_index})")


# Signatures already checked, each with its options as the launches take them and, where a CPU call
# of that signature runs F.cross_entropy itself (planner.CPU_TORCH_MAX_LOGITS), the plan it reports.
_CHECKED: dict = {}
plan_cache(_CHECKED.clear)


# What _cpu_torch_plan answers while torch.compile traces: F.cross_entropy runs, no plan is made
# (a plan reads the sizes, and would specialize them: see cross_entropy).
_TRACED_TORCH_CALL = "traced"


def _cpu_torch_plan(logits, options, inplace_backward, strategy, traced=False):
    """The plan of a call that runs F.cross_entropy on the CPU (small logits, torch's options only),
    _TRACED_TORCH_CALL for such a call while torch.compile traces, or None."""
    _, _, _, z_loss, softcap, temperature, return_lse = options
    if (logits.device.type != "cpu" or strategy is not None or inplace_backward or return_lse or z_loss != 0.0
            or softcap != 0.0 or temperature != 1.0
            or logits.numel() > planner.CPU_TORCH_MAX_LOGITS[logits.element_size()]):
        return None
    if traced:
        return _TRACED_TORCH_CALL
    n_classes = logits.shape[-1]
    return planner.choose("forward", logits.numel() // n_classes, n_classes, logits.dtype, logits.device,
                          strategy="torch")


def _torch_cross_entropy(x2, t1, weight, options, loss_dtype) -> torch.Tensor:
    """F.cross_entropy of (rows, classes) logits, in float32 for half precision (float64 kept), the
    loss in ``loss_dtype``."""
    ignore_index, reduction, label_smoothing = options[:3]
    compute = compute_dtype(x2.dtype)
    loss = torch.nn.functional.cross_entropy(
        x2 if x2.dtype == compute else x2.to(compute), t1 if t1.dtype == torch.int64 else t1.long(),
        weight=weight if weight is None or weight.dtype == compute else weight.to(compute), ignore_index=ignore_index,
        reduction=reduction, label_smoothing=label_smoothing)
    return loss if loss.dtype == loss_dtype else loss.to(loss_dtype)


def _check(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
           return_lse, inplace_backward, gradient_in_forward, strategy) -> tuple:
    """cross_entropy's checks of one signature; returns its options (ignore_index, reduction,
    label_smoothing, z_loss, softcap (0: none), temperature, return_lse) as the launches take them,
    and whether the targets are probabilities."""
    name = "cross_entropy"
    softcap = check_call(logits, target, name, "logits", ignore_index, reduction, label_smoothing, z_loss, softcap,
                         temperature, probabilities=True)
    n_classes = logits.shape[-1]
    if n_classes == 0:
        raise ValueError(f"{name}: logits must have at least one class (the last dim is 0)")
    check_class_weight(weight, n_classes, logits, name)
    for flag, value in (("return_lse", return_lse), ("inplace_backward", inplace_backward),
                        ("gradient_in_forward", gradient_in_forward)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: {flag} must be a bool, got {type(value).__name__}")
    probabilities = target.is_floating_point()
    if probabilities:
        # What torch refuses with them (ignore_index), and what only the kernels' path has.
        for option, value, default in (("ignore_index", ignore_index, -100),
                                       ("inplace_backward", inplace_backward, False),
                                       ("gradient_in_forward", gradient_in_forward, False),
                                       ("strategy", strategy, None)):
            if value != default:
                raise ValueError(f"{name}: {option}={value!r} needs class-index targets, got probability targets")
    options = (ignore_index, reduction, float(label_smoothing), float(z_loss), softcap, float(temperature), return_lse)
    return options, probabilities


def _promoted(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """torch's promotion of two floating dtypes, in Python (torch.promote_types breaks a
    torch.compile graph): the wider, float32 for float16 with bfloat16."""
    if a == b or a.itemsize != b.itemsize:
        return a if a.itemsize >= b.itemsize else b
    return torch.float32


def _probability_cross_entropy(logits, target, weight, options, float32_loss):
    """cross_entropy of probability targets: torch's ``-sum_c w_c q_c log_softmax(y)_c`` a row, with
    ``q`` the targets mixed with the uniform distribution by label_smoothing, "mean" over the rows
    (unweighted, as torch), plus the z term. CUDA tensors (and the interpreter's) of the kernels'
    dtypes: probability.py's kernels (the logits and targets read once a pass, the loss reduced
    over the rows by one more, nothing of the logits' shape kept but the gradients); otherwise our
    log_softmax and torch ops (float32 tensors of the logits' shape), as torch computes it.
    Differentiable in the targets too."""
    _, reduction, label_smoothing, z_loss, softcap, temperature, return_lse = options
    out_dtype = torch.float32 if float32_loss else _promoted(logits.dtype, target.dtype)
    if ((logits.device.type == "cuda" or interpreter_active()) and logits.dtype in _validate.KERNEL_DTYPES
            and target.dtype in _validate.KERNEL_DTYPES):
        n_classes = logits.shape[-1]
        x2, t2 = logits.reshape(-1, n_classes), target.reshape(-1, n_classes)
        x2 = x2 if x2.stride(1) == 1 else x2.contiguous()  # the kernels step along rows of unit stride
        t2 = t2 if t2.stride(1) == 1 else t2.contiguous()
        kernel_options = (label_smoothing, z_loss, softcap, temperature)
        if torch.is_grad_enabled() and (logits.requires_grad or target.requires_grad):
            loss, lse = ProbabilityCrossEntropy.apply(x2, t2, class_weights(weight), kernel_options, reduction,
                                                      out_dtype)
        else:  # without autograd's node (its host time)
            stats, loss = probability_forward(x2, t2, class_weights(weight), *kernel_options, reduction, out_dtype)
            loss, lse = stats[0] if reduction == "none" else loss, stats[4] if return_lse else None
        if return_lse:  # (a view costs host time a call)
            lse = lse.reshape(logits.shape[:-1])
    else:
        loss, lse = _composed_probability_loss(logits, target, weight, options)
        if reduction != "none":
            loss = loss.sum() if reduction == "sum" else loss.mean()  # an empty "mean" is NaN, as torch's
    if reduction == "none":
        loss = loss.reshape(logits.shape[:-1])
    loss = loss.to(out_dtype)
    return (loss, lse.detach()) if return_lse else loss


def _composed_probability_loss(logits, target, weight, options):
    """(rows' losses, rows' lse or None) of probability targets from our log_softmax and torch ops
    (float32, float64 for float64 logits)."""
    _, _, label_smoothing, z_loss, softcap, temperature, return_lse = options
    compute = compute_dtype(logits.dtype)
    y = logits if softcap == 0.0 and temperature == 1.0 else transformed(logits, softcap, temperature)
    t = target.to(_promoted(target.dtype, compute))  # half-precision targets mixed in float32
    if label_smoothing > 0:
        t = t * (1.0 - label_smoothing) + label_smoothing / logits.shape[-1]
    if weight is not None:
        t = t * weight
    loss = -(_softmax_op.log_softmax(y, -1, dtype=compute) * t).sum(-1)
    lse = _softmax_op.logsumexp(y if y.dtype == compute else y.to(compute), -1) if z_loss or return_lse else None
    if z_loss:
        loss = loss + z_loss * lse * lse
    return loss, lse


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: Optional[float] = None,
                  temperature: float = 1.0, weight: Optional[torch.Tensor] = None, return_lse: bool = False,
                  inplace_backward: bool = False, gradient_in_forward: bool = False, strategy: Optional[str] = None):
    """Cross-entropy of class-index (or probability) targets under ``log_softmax`` of the last dim of ``logits``.

    For each row i (every index of ``logits`` but the last) with target t, with
    ``y = softcap * tanh(logits / softcap) / temperature`` and ``lse = logsumexp(y)`` (the online
    normalizer, Milakov & Gimelshein 2018, arXiv:1805.02867)::

        loss_i = (1 - eps) w_t (lse - y_t) + eps / C * sum_c w_c (lse - y_c) + z_loss * lse^2

    with ``eps = label_smoothing``, C classes and ``w`` the class weights (1 without). That is
    ``torch.nn.functional.cross_entropy`` (class indices, ``ignore_index``, ``label_smoothing`` and
    ``weight`` with torch's semantics) plus PaLM's z-loss and Gemma 2's logit softcap. The logits
    are read once for the forward, accumulated in float32 (float64 logits: in float64, by torch's
    own kernels). Probability targets ``p`` (floating, the logits' shape) give, as torch's,
    ``loss_i = -sum_c w_c q_c (y_c - lse) + z_loss * lse^2`` with ``q = (1 - eps) p + eps / C``,
    "mean" over the rows unweighted, differentiable in the targets too; on CUDA by kernels of
    their own (probability.py: the logits and targets read once a pass), on the CPU by our
    log_softmax and torch ops.

    Parameters
    ----------
    logits : Tensor
        (C,), (N, C) or any (..., C): float32, float16 or bfloat16 (the Triton kernels), or float64
        (torch's kernels, in float64), any strides, on CUDA or CPU.
        **The class dim is the last one**, as in most language-model code and Liger; torch's
        F.cross_entropy takes it as dim 1 for inputs of more than 2 dims.
    target : Tensor
        ``logits.shape[:-1]`` (0-d for (C,) logits), int64 or int32 class indices in [0, C), or
        ``ignore_index``; or class probabilities, a floating tensor of ``logits.shape`` (class dim
        last too), without ``ignore_index`` (as torch), ``inplace_backward``, ``gradient_in_forward`` or
        ``strategy``.
    ignore_index : int
        Rows with this target have loss 0, gradient 0, and do not count in "mean".
    reduction : {"mean", "sum", "none"}
        "mean": the sum of the rows' losses over the sum of their targets' weights (the number of
        non-ignored rows without ``weight``), as torch; the z term is averaged over the
        non-ignored rows (unweighted, as Liger). All rows ignored: NaN, as torch. "none": one loss
        per row, shape ``target.shape``; its backward takes any per-row upstream gradient.
    label_smoothing : float
        In [0, 1]; torch's mixture of the target and the (weighted) uniform distribution.
    z_loss : float
        >= 0: adds ``z_loss * lse^2`` per non-ignored row (PaLM's auxiliary loss).
    softcap : float, optional
        > 0: ``logits -> softcap * tanh(logits / softcap)`` before everything else (Gemma 2).
    temperature : float
        > 0: divides the (softcapped) logits.
    weight : Tensor, optional
        (C,) per-class weights (any float dtype), torch's semantics.
    return_lse : bool
        Also return the ``lse`` of every row in float32 (float64 for float64 logits), shape
        ``target.shape``, ignored rows included; not differentiable.
    inplace_backward : bool
        **Overwrites ``logits`` with the gradient during the forward** (when a gradient is
        computed: ``logits.requires_grad`` under grad mode). The logits are read once and the
        gradient written once in one kernel, with no memory beyond the loss; the backward only
        multiplies the stored gradient by the upstream gradient where that is not 1 (a device-side
        check: no synchronization). Use it only where nothing else needs the logits afterwards: an
        op that saved them for its own backward raises autograd's in-place error, and the logits'
        values are gone. Call backward once. Leading dims that do not merge into rows without a
        copy are copied first (the gradient then goes to the copy). Under torch.compile the
        mutation is declared to the compiler, which may add a copy.
    gradient_in_forward : bool
        The forward also writes the gradient, for an upstream gradient of 1, into a new tensor
        that the backward hands on: the logits are read as ``inplace_backward`` reads them (once,
        or twice with L2's help) and kept, and the gradient's memory is held from the forward on.
        For the loss's own ``backward()`` (or ``torch.autograd.grad``) that is the in-place step's
        time: on the H200 1.12x faster than the default step at 8192 x 128256 bf16, 1.17-1.36x at
        vocabularies of 32000-50257. **Any other upstream gradient** (a loss divided by
        accumulation steps, a GradScaler's scale) makes the backward write it again from the
        logits: exact, and slower than the default step (docs/perf-cross_entropy.md). Where the plan
        expects the default to be faster (reduction "none", few rows an SM, calls under about
        128 MiB of logits: ``plan.gradient_in_forward``), under torch.compile, and with a
        ``strategy``, the step is the default one: the same results either way. A second backward
        of a kept graph recomputes it too. ``inplace_backward`` implies it, over the logits.
    strategy : str, optional
        Expert/testing override of the kernel (see :mod:`onlinesoftmax.ops.cross_entropy.plan`).

    Returns
    -------
    Tensor, or (Tensor, Tensor) with ``return_lse``
        The loss in ``logits.dtype`` (float32 inside an autocast region, as torch's): 0-d, or
        ``target.shape`` for "none"; and the lse.

    Notes
    -----
    Targets out of range: CPU tensors raise ValueError before any work. On CUDA (and in code
    compiled by torch.compile), checking would synchronize the device on every call, so the kernels
    never read outside the row and give such a row a NaN loss (so "mean" and "sum" are NaN) and a
    NaN gradient. -inf logits are fine (an
    all -inf row, or a -inf target logit, gives NaN or +inf as torch); NaN or +inf make the row
    NaN. CPU tensors take torch's own ops in float32 (or the Triton kernels under
    ``TRITON_INTERPRET=1``): up to ``plan.CPU_TORCH_MAX_LOGITS`` logits with none of the options
    torch lacks, ``F.cross_entropy`` itself (half precision upcast to float32). Deterministic: no
    atomics across programs, merges in a fixed order.
    Traceable by ``torch.compile(fullgraph=True)``.

    Raises
    ------
    TypeError
        Non-tensor arguments, logits not float32/float16/bfloat16/float64, targets neither int64/int32
        nor floating.
    ValueError
        Shapes that do not match, an unknown reduction, options out of range, tensors on different
        devices, C = 0, CPU targets out of range; probability targets with ``ignore_index``,
        ``inplace_backward``, ``gradient_in_forward`` or ``strategy``.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.0, 3.0]])
    >>> onlinesoftmax.cross_entropy(logits, torch.tensor([0, 2]))
    tensor(0.1681)
    """
    # The checks run once a signature (small eager calls are the host's time); a signature holds
    # everything they look at but the targets' values, which CPU targets have checked every call.
    # While torch.compile traces, no lookup by shape: it would specialize every dim to its traced
    # value (a dynamic batch compiled again at each new size).
    traced = torch.compiler.is_compiling()
    try:
        signature = None if traced else (
            logits.shape, logits.dtype, logits.device, target.shape, target.dtype, target.device,
            None if weight is None else (weight.shape, weight.dtype, weight.device), ignore_index, reduction,
            label_smoothing, z_loss, softcap, temperature, return_lse, inplace_backward, gradient_in_forward, strategy,
            type(return_lse), type(inplace_backward), type(gradient_in_forward))
        checked = None if traced else _CHECKED.get(signature)
    except (AttributeError, TypeError):  # not tensors, or unhashable options: the checks say what is wrong
        signature = checked = None
    if checked is None:
        options, probabilities = _check(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                                        softcap, temperature, return_lse, inplace_backward, gradient_in_forward,
                                        strategy)
        checked = (options, None if probabilities else _cpu_torch_plan(logits, options, inplace_backward, strategy,
                                                                       traced), probabilities)
        if signature is not None:
            remember(_CHECKED, signature, checked)
    options, cpu_torch_plan, probabilities = checked
    # Inside an autocast region torch computes the loss in float32 (see _autocast).
    float32_loss = _any_autocast() and _autocast.float32_result("cross_entropy", logits)
    if probabilities:
        return _probability_cross_entropy(logits, target, weight, options, float32_loss)
    n_classes = logits.shape[-1]
    weight = class_weights(weight)
    # 2-d logits skip the views (each costs microseconds of host time).
    x2 = logits if logits.dim() == 2 else logits.reshape(target.numel(), n_classes)  # a view where dims merge
    t1 = target if target.dim() == 1 else target.reshape(-1)
    if cpu_torch_plan is not None and not interpreter_active():
        if not traced:
            planner.record(cpu_torch_plan)
        try:
            loss = _torch_cross_entropy(x2, t1, weight, options,
                                        torch.float32 if float32_loss else logits.dtype)
        except IndexError:  # torch's check of the targets failed: ours names the target (ValueError)
            check_targets_in_range(target, n_classes, ignore_index, "cross_entropy")
            raise
        return loss.reshape(target.shape) if reduction == "none" else loss
    if target.device.type == "cpu":
        check_targets_in_range(target, n_classes, ignore_index, "cross_entropy")
    if logits.requires_grad and torch.is_grad_enabled():
        loss, lse = _CrossEntropyFunction.apply(x2, t1, weight, options,
                                                (inplace_backward, strategy, float32_loss, gradient_in_forward))
    else:
        loss, lse, _, _ = _forward(x2, t1, weight, *options, strategy, float32_loss)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return (loss, lse.reshape(target.shape)) if return_lse else loss

