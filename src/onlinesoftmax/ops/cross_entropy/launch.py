"""cross_entropy launchers on (rows, classes) logits (the same arithmetic in torch, for CPU tensors, is
``torch_path.py``).

Every launch takes its options as plain values (validated by the public functions):
``ignore_index, reduction, label_smoothing, z_loss, softcap (0: none), temperature``. The forward
returns ``(loss, lse, denom)``: ``denom`` holds (valid rows, sum of their targets' weights, sum of
all class weights: label smoothing's alone, else 0 from the kernels) where the gradient or the loss
needs them ("mean", or class weights with label smoothing), and is empty otherwise.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ... import _buffers
from ..._device import cdiv, interpreter_active, next_power_of_2, plan_cache, remember, sm_count, triton_runs_on
from ..._launch import Launcher, aligned
from ..._triton import COUNTER_STRIDE
from ..._validate import KERNEL_DTYPES
from . import plan as planner
from .kernels import (
    cross_entropy_backward_kernel,
    cross_entropy_on_chip_kernel,
    cross_entropy_stream_kernel,
)
from .plain_kernel import cross_entropy_two_pass_plain_kernel
from .rows_kernel import cross_entropy_rows_backward_kernel, cross_entropy_rows_forward_kernel
from .small_kernels import cross_entropy_reduce_kernel, scale_rows_kernel
from .torch_path import compute_dtype, torch_backward, torch_forward

_stream = Launcher(cross_entropy_stream_kernel)
_two_pass_plain = Launcher(cross_entropy_two_pass_plain_kernel)
_on_chip = Launcher(cross_entropy_on_chip_kernel)
_backward = Launcher(cross_entropy_backward_kernel)
_rows_forward = Launcher(cross_entropy_rows_forward_kernel)
_rows_backward = Launcher(cross_entropy_rows_backward_kernel)
_reduce = Launcher(cross_entropy_reduce_kernel)
_scale = Launcher(scale_rows_kernel)


def kernels_take(x: torch.Tensor, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the Triton kernels run for logits of ``dtype`` (default x's) on x's device: CUDA, or
    any under the interpreter, and not float64 (torch's ops run that)."""
    return triton_runs_on(x.device) and (dtype or x.dtype) in KERNEL_DTYPES


def needs_denom(reduction: str, has_weight: bool, label_smoothing: float) -> bool:
    return reduction == "mean" or (has_weight and label_smoothing > 0)


def plain_rows(has_weight: bool, label_smoothing: float, softcap: float, z_loss: float, read_ignored: bool) -> bool:
    """Whether a call's options leave its rows plain (planner.choose's ``plain``)."""
    return not has_weight and label_smoothing == 0 and softcap == 0 and z_loss == 0 and not read_ignored


def row_options(has_weight: bool, label_smoothing: float, softcap: float, z_loss: float, read_ignored: bool) -> dict:
    """planner.choose's arguments for a call's options (``plain``, ``smoothing``, ``softcap``, ``weighted``)."""
    return dict(plain=plain_rows(has_weight, label_smoothing, softcap, z_loss, read_ignored),
                smoothing=label_smoothing > 0, softcap=softcap > 0, weighted=has_weight)


def _flags(has_weight: bool, reduction: str, label_smoothing: float, z_loss: float, softcap: float) -> dict:
    return dict(HAS_WEIGHT=has_weight, SMOOTH=label_smoothing > 0, SOFTCAP=softcap > 0, Z=z_loss > 0,
                MEAN=reduction == "mean")


def _rows_meta(chosen: planner.Plan) -> dict:
    # ROWS_UNIT: rows of unit stride with strided classes (torch's class dim 1 through a view), loads along the rows.
    return dict(ROWS=chosen.rows_per_program, BLOCK=chosen.block, GROUPS=chosen.column_groups,
                CONTIGUOUS=chosen.contiguous, ROWS_UNIT=chosen.rows_unit, num_warps=chosen.num_warps)


def _exchange(chosen: planner.Plan, device: torch.device):
    # Partials of split rows (m, d, smoothing sum per chunk) and the counters programs meet at.
    return _buffers.row_exchange(3 * chosen.rows * chosen.num_chunks, COUNTER_STRIDE.value * (1 + chosen.rows), device)


def same_layout_buffer(x: torch.Tensor) -> torch.Tensor:
    """A new (rows, cols) tensor of x's dtype and strides (the kernels address both with one set of offsets)."""
    if x.is_contiguous():
        return _buffers.empty_like(x)  # no view to make (a view costs about as much host time as an allocation)
    rows, cols = x.shape
    size = 1 + (rows - 1) * x.stride(0) + (cols - 1) * x.stride(1)
    return _buffers.empty((size,), x.dtype, x.device).as_strided(x.shape, x.stride())


def dense(x: torch.Tensor) -> bool:
    """Whether a tensor with x's strides takes about x's elements (and no two elements share memory)."""
    rows, cols = x.shape
    if (rows > 1 and x.stride(0) == 0) or (cols > 1 and x.stride(1) == 0):
        return False
    size = 1 + (rows - 1) * x.stride(0) + (cols - 1) * x.stride(1)
    return size <= rows * cols + max(64 * rows, rows * cols // 16)


# --------------------------------------------------------------------------------------------
# Triton launches
# --------------------------------------------------------------------------------------------


class Recipe(NamedTuple):
    """One launch of a kernel but its tensors: ``recipe(*tensors)`` launches it (the kernels take
    their tensors first, then the scalars), ``recipe.bind()`` is the same launch for a prepared call."""

    launcher: Launcher
    grid: tuple
    key: tuple
    scalars: tuple
    meta: dict

    def __call__(self, *tensors):
        self.launcher(self.grid, self.key, *tensors, *self.scalars, **self.meta)

    def bind(self):
        bound, scalars = self.launcher.bind(self.grid, self.key, **self.meta), self.scalars
        return lambda *tensors: bound(*tensors, *scalars)


def _reduce_launch(n_rows: int) -> tuple[int, int, int]:
    """(block, chunk, programs) of a count or reduce launch over ``n_rows`` rows: chunk 0 is one program."""
    # Under the interpreter the test sizes' rows take several steps and programs (as the probability
    # kernels' reduction).
    block = 16 if interpreter_active() else planner.REDUCE_LAUNCH_BLOCK
    if n_rows <= block * planner.REDUCE_LAUNCH_ONE_PROGRAM_STEPS:
        return block, 0, 1
    chunk = block * cdiv(n_rows, block * planner.REDUCE_LAUNCH_MAX_PROGRAMS)
    return block, chunk, cdiv(n_rows, chunk)


def reduce_scratch(programs: int, device: torch.device, spare: torch.Tensor) -> tuple:
    """(parts, sync) of a count or reduce launch of ``programs``: the stream's exchange where its
    programs meet, else ``spare`` twice (never read)."""
    return _buffers.row_exchange(4 * programs, 1, device) if programs > 1 else (spare, spare)


def count_recipe(target: torch.Tensor, w: torch.Tensor, has_weight: bool, n_classes: int, ignore_index: int,
                 smooth: bool) -> Recipe:
    """denom <- (valid rows, sum of their targets' weights, sum of all class weights: with label
    smoothing (``smooth``) alone, else 0); tensors (denom, denom, target, w, denom, denom, parts, sync),
    ``w`` the weights or denom, (parts, sync) reduce_scratch's."""
    block, chunk, programs = _reduce_launch(target.shape[0])
    # The launchers' compiled kernels are found by key alone: the tables' values are in it (override_plan).
    key = ("count", target.dtype, target.stride(0), aligned(target), w.dtype, aligned(w), n_classes, ignore_index,
           target.shape[0], has_weight, smooth, block, chunk, planner.REDUCE_LAUNCH_WARPS)
    return Recipe(_reduce, (programs,), key, (target.shape[0], n_classes, target.stride(0), ignore_index, 0.0),
                  dict(BLOCK=block, CHUNK=chunk, COUNT=True, SUM=False, MEAN=False, HAS_WEIGHT=has_weight,
                       SMOOTH=smooth, Z=False, num_warps=planner.REDUCE_LAUNCH_WARPS))


def reduce_recipe(loss_rows: torch.Tensor, lse: torch.Tensor, target: torch.Tensor, w: torch.Tensor,
                  has_weight: bool, out: torch.Tensor, n_classes: int, ignore_index: int, reduction: str,
                  z_loss: float, count_too: bool, smooth: bool) -> Recipe:
    """out <- the rows' losses summed (over the denominators for "mean"), plus the z term; tensors
    (loss_rows, lse, target, w, denom, out, parts, sync), ``w`` the weights or loss_rows, (parts, sync)
    reduce_scratch's. ``count_too``, ``smooth``: the denominators first, as count_recipe's."""
    block, chunk, programs = _reduce_launch(target.shape[0])
    key = ("reduce", target.dtype, target.stride(0), aligned(target), w.dtype, aligned(w), aligned(loss_rows),
           aligned(lse), out.dtype, n_classes, ignore_index, target.shape[0], has_weight, reduction,
           z_loss > 0, count_too, smooth, block, chunk, planner.REDUCE_LAUNCH_WARPS)
    return Recipe(_reduce, (programs,), key, (target.shape[0], n_classes, target.stride(0), ignore_index, z_loss),
                  dict(BLOCK=block, CHUNK=chunk, COUNT=count_too, SUM=True, MEAN=reduction == "mean",
                       HAS_WEIGHT=has_weight, SMOOTH=smooth, Z=z_loss > 0, num_warps=planner.REDUCE_LAUNCH_WARPS))


def count(target: torch.Tensor, weight: Optional[torch.Tensor], denom: torch.Tensor, n_classes: int,
          ignore_index: int, label_smoothing: float) -> None:
    """denom <- (valid rows, sum of their targets' weights, sum of all class weights: with label
    smoothing alone, else 0)."""
    w = weight if weight is not None else denom
    recipe = count_recipe(target, w, weight is not None, n_classes, ignore_index, label_smoothing > 0)
    recipe(denom, denom, target, w, denom, denom, *reduce_scratch(recipe.grid[0], denom.device, denom))


def reduce(loss_rows: torch.Tensor, lse: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
           denom: torch.Tensor, out: torch.Tensor, n_classes: int, ignore_index: int, reduction: str,
           z_loss: float, count_too: bool, label_smoothing: float) -> None:
    """out <- the rows' losses summed (over the denominators for "mean"), plus the z term."""
    w = weight if weight is not None else loss_rows
    recipe = reduce_recipe(loss_rows, lse, target, w, weight is not None, out, n_classes, ignore_index, reduction,
                           z_loss, count_too, label_smoothing > 0)
    recipe(loss_rows, lse, target, w, denom, out, *reduce_scratch(recipe.grid[0], out.device, lse))


def splits_rows(chosen: planner.Plan) -> bool:
    """Whether the forward of ``chosen`` has several programs a row, which meet in _exchange's scratch."""
    return chosen.num_chunks > 1 or chosen.strategy == "split_on_chip"


def forward_recipe(chosen: planner.Plan, x: torch.Tensor, target: torch.Tensor, w: torch.Tensor, has_weight: bool,
                   loss: torch.Tensor, lse: torch.Tensor, lse_low: torch.Tensor, ignore_index: int, reduction: str,
                   label_smoothing: float, z_loss: float, softcap: float, temperature: float, read_ignored: bool,
                   class_offset: int = 0, n_classes: Optional[int] = None, stats: bool = False,
                   reduce_into: bool = False, count_too: bool = False,
                   out_dtype: Optional[torch.dtype] = None, out_of_place: bool = False) -> Recipe:
    """The main forward kernel of ``chosen`` over x's rows; tensors (x, target, w, denom, loss, lse,
    lse_low, parts, counters, out, dx), ``w`` the class weights or x (a valid pointer never read).
    ``reduce_into`` (the stream kernel's plans): the loss reduced into ``out`` (of ``out_dtype``)
    too, as reduce_recipe's launch would (``count_too``: the denominators first); else ``out`` is
    not used. "forward_grad" plans write the gradient over x, or with ``out_of_place`` into ``dx``
    (x's strides, a new tensor: the key holds no alignment of it); else ``dx`` is not used."""
    n_rows, n_cols = x.shape
    n_classes = n_cols if n_classes is None else n_classes
    inv_t = 1.0 / temperature
    tanh_scale = 1.0 / (softcap * inv_t) if softcap > 0 else 0.0
    flags = _flags(has_weight, reduction, label_smoothing, z_loss, softcap)
    # The plan fixes the shape and layout; the rest of what Triton specializes on is here.
    key = (chosen, x.stride(0), x.stride(1), target.dtype, target.stride(0), w.dtype, loss.dtype, aligned(x),
           aligned(target), aligned(w), aligned(loss), aligned(lse), aligned(lse_low), ignore_index, class_offset,
           n_classes, reduction, tuple(flags.values()), read_ignored, stats, reduce_into, count_too,
           out_dtype if reduce_into else None, out_of_place, planner.REDUCE_BLOCK if reduce_into else None)
    meta = dict(ALIGN=chosen.align, CONTIGUOUS=chosen.contiguous, EDGES=chosen.edges,
                Z_IN_ROW=z_loss > 0 and reduction == "none", READ_IGNORED=read_ignored, BLOCK=chosen.block,
                CHUNKS_POW2=next_power_of_2(chosen.num_chunks), SPLIT=splits_rows(chosen),
                num_warps=chosen.num_warps, **flags)
    eviction = dict(FIRST_EVICTION="evict_last" if chosen.hold_l2 else "",
                    SECOND_EVICTION="evict_first" if chosen.hold_l2 else "")
    if chosen.plain:
        if not plain_rows(has_weight, label_smoothing, softcap, z_loss, read_ignored) or stats or class_offset or \
                n_classes != n_cols:
            raise AssertionError("cross_entropy: a plan for plain rows met a call with options they exclude")
        return Recipe(_two_pass_plain, chosen.grid, key, (n_cols, x.stride(0), target.stride(0), ignore_index, inv_t),
                      dict(BLOCK=chosen.block, TAIL=chosen.tail, ALIGN=chosen.align, EDGES=chosen.edges,
                           MEAN=flags["MEAN"], OUT_OF_PLACE=out_of_place, num_warps=chosen.num_warps, **eviction,
                           **chosen.compile_options))
    if chosen.strategy in ("stream", "two_pass"):
        scalars = (n_cols, x.stride(0), x.stride(1), target.stride(0), ignore_index, class_offset, n_classes,
                   label_smoothing, z_loss, softcap, tanh_scale, inv_t, chosen.tiles_per_chunk)
        return Recipe(_stream, chosen.grid, key, scalars, dict(
            meta, TAIL=chosen.tail or chosen.block, TAIL_ORDER=chosen.tail_order,
            WRITE_GRAD=chosen.strategy == "two_pass", STATS=stats, REDUCE=reduce_into, COUNT=count_too,
            REDUCE_BLOCK=planner.REDUCE_BLOCK, OUT_OF_PLACE=out_of_place, **eviction))
    if reduce_into:
        raise AssertionError("cross_entropy: only the stream kernel reduces the loss in its launch")
    if chosen.strategy == "rows":
        if stats or class_offset or n_classes != n_cols:
            raise AssertionError("cross_entropy: the short rows' forward met a shard's statistics")
        scalars = (n_rows, n_cols, x.stride(0), x.stride(1), target.stride(0), ignore_index, n_classes,
                   label_smoothing, z_loss, softcap, tanh_scale, inv_t)
        return Recipe(_rows_forward, chosen.grid, key, scalars, dict(
            _rows_meta(chosen), Z_IN_ROW=meta["Z_IN_ROW"], READ_IGNORED=read_ignored,
            WRITE_GRAD=chosen.op == "forward_grad", OUT_OF_PLACE=out_of_place, **flags))
    scalars = (n_cols, x.stride(0), x.stride(1), target.stride(0), ignore_index, n_classes,
               label_smoothing, z_loss, softcap, tanh_scale, inv_t, chosen.num_chunks)
    return Recipe(_on_chip, chosen.grid, key, scalars, dict(meta, OUT_OF_PLACE=out_of_place))


def rows_forward(chosen: planner.Plan, x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
                 denom: torch.Tensor, loss: torch.Tensor, lse: torch.Tensor, lse_low: torch.Tensor, ignore_index: int,
                 reduction: str, label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                 read_ignored: bool, class_offset: int = 0, n_classes: Optional[int] = None,
                 stats: bool = False) -> None:
    """The main forward kernel of ``chosen`` over x's rows: loss, lse and lse_low (the lse's rounding
    error) per row (``stats``: the four planes of distributed statistics into ``loss``), and for
    "forward_grad" the gradient over x."""
    if chosen.strategy == "separate":  # the stream's launch, then the backward's over x
        first, second = chosen.parts
        rows_forward(first, x, target, weight, denom, loss, lse, lse_low, ignore_index, reduction, label_smoothing,
                     z_loss, softcap, temperature, read_ignored, class_offset, n_classes, stats)
        rows_backward(second, x, x, target, weight, denom, lse, lse_low, lse, ignore_index, reduction,
                      label_smoothing, z_loss, softcap, temperature, class_offset, n_classes, unit_grad=True)
        return
    w = weight if weight is not None else x
    recipe = forward_recipe(chosen, x, target, w, weight is not None, loss, lse, lse_low, ignore_index, reduction,
                            label_smoothing, z_loss, softcap, temperature, read_ignored, class_offset, n_classes,
                            stats)
    parts, counters = _exchange(chosen, x.device) if splits_rows(chosen) else (lse, lse)
    recipe(x, target, w, denom, loss, lse, lse_low, parts, counters, lse, x)


def backward_recipe(chosen: planner.Plan, x: torch.Tensor, dx: torch.Tensor, target: torch.Tensor, w: torch.Tensor,
                    has_weight: bool, lse: torch.Tensor, lse_low: torch.Tensor, grad: torch.Tensor, ignore_index: int,
                    reduction: str, label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                    class_offset: int = 0, n_classes: Optional[int] = None, unit_grad: bool = False,
                    skip_unit: bool = False) -> Recipe:
    """The backward kernel of ``chosen``; tensors (x, dx, target, w, denom, lse, lse_low, grad), ``w``
    the class weights or x; ``unit_grad``: for an upstream gradient of 1, ``grad`` not read;
    ``skip_unit``: dx holds the gradient for an upstream gradient of 1 already, left as it is where
    ``grad`` (0-d) is 1 (persistent programs: planner.SCALE_PROGRAMS_PER_SM an SM)."""
    n_rows, n_cols = x.shape
    n_classes = n_cols if n_classes is None else n_classes
    inv_t = 1.0 / temperature
    tanh_scale = 1.0 / (softcap * inv_t) if softcap > 0 else 0.0
    flags = _flags(has_weight, reduction, label_smoothing, z_loss, softcap)
    grad_stride = grad.stride(0) if grad.dim() else 0
    key = (chosen, x.stride(0), x.stride(1), target.dtype, target.stride(0), w.dtype, dx.dtype, grad.dtype,
           grad_stride, aligned(x), aligned(dx), aligned(target), aligned(w), aligned(grad), aligned(lse),
           aligned(lse_low), ignore_index, class_offset, n_classes, tuple(flags.values()), unit_grad, skip_unit)
    if chosen.strategy == "rows":
        if skip_unit:
            raise AssertionError("cross_entropy: the short rows' backward has no persistent programs (skip_unit)")
        scalars = (n_rows, n_cols, x.stride(0), x.stride(1), target.stride(0), grad_stride, ignore_index, class_offset,
                   n_classes, label_smoothing, z_loss, softcap, tanh_scale, inv_t)
        return Recipe(_rows_backward, chosen.grid, key, scalars,
                      dict(_rows_meta(chosen), UNIT_GRAD=unit_grad, **flags))
    tiles_per_row = chosen.grid[1]
    grid = chosen.grid
    if skip_unit:
        grid = (max(1, min(n_rows * tiles_per_row, planner.SCALE_PROGRAMS_PER_SM * sm_count(x.device))),)
    scalars = (n_cols, x.stride(0), x.stride(1), target.stride(0), grad_stride, ignore_index, class_offset, n_classes,
               label_smoothing, z_loss, softcap, tanh_scale, inv_t, tiles_per_row, n_rows * tiles_per_row)
    return Recipe(_backward, grid, key, scalars, dict(
        BLOCK=chosen.block, TAIL=chosen.tail or chosen.block, ALIGN=chosen.align, CONTIGUOUS=chosen.contiguous,
        EDGES=chosen.edges, num_warps=chosen.num_warps, UNIT_GRAD=unit_grad, SKIP_UNIT=skip_unit, **flags))


def rows_backward(chosen: planner.Plan, x: torch.Tensor, dx: torch.Tensor, target: torch.Tensor,
                  weight: Optional[torch.Tensor], denom: torch.Tensor, lse: torch.Tensor, lse_low: torch.Tensor,
                  grad: torch.Tensor, ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
                  softcap: float, temperature: float, class_offset: int = 0, n_classes: Optional[int] = None,
                  unit_grad: bool = False) -> None:
    """dx (x's strides, or x itself) <- the gradient of x's rows from their lse and the upstream ``grad``
    (a 0-d tensor, or one value a row for "none"; ``unit_grad``: 1, ``grad`` not read)."""
    w = weight if weight is not None else x
    backward_recipe(chosen, x, dx, target, w, weight is not None, lse, lse_low, grad, ignore_index, reduction,
                    label_smoothing, z_loss, softcap, temperature, class_offset, n_classes, unit_grad)(
        x, dx, target, w, denom, lse, lse_low, grad)


# --------------------------------------------------------------------------------------------
# The ops' entry points: Triton, or torch for CPU tensors without the interpreter
# --------------------------------------------------------------------------------------------


def _weight_signature(weight: Optional[torch.Tensor]):
    return None if weight is None else (weight.dtype, aligned(weight))


def forward_plan(x, weight, label_smoothing, z_loss, softcap, return_lse, strategy, inplace) -> planner.Plan:
    """The plan of a forward over ``x`` (2-D): "forward_grad" where it writes the gradient, else "forward"."""
    return planner.choose("forward_grad" if inplace else "forward", x.shape[0], x.shape[1], x.dtype, x.device,
                          strategy, x.stride(0), x.stride(1),
                          **row_options(weight is not None, label_smoothing, softcap, z_loss, return_lse))


class ForwardCall:
    """One forward signature (shapes, strides, dtypes, alignment, options), decided once: its plan,
    its launches bound (_launch.BoundLaunch) and its buffers' templates (_buffers.template). An
    eager call is then its allocations and launches: a small call is the host's time.
    ``inplace``: the gradient (for an upstream gradient of 1) written over x, or with ``out_of_place``
    into a tensor of x's layout that each call is given (gradient_call)."""

    def __init__(self, x, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
                 return_lse, strategy, inplace, float32_loss=False, out_of_place=False):
        n_rows, n_cols = x.shape
        device = x.device
        self.options = (ignore_index, reduction, label_smoothing, z_loss, softcap, temperature)
        self.loss_dtype = loss_dtype = torch.float32 if float32_loss else x.dtype
        self.inplace, self.strategy = inplace, strategy
        self.signature = (return_lse, float32_loss)
        # upstream gradient's signature -> BackwardCall (out of place: -> backward_over's bound launch)
        self.backward_calls: dict = {}
        self.fused: Optional[list] = None  # [gradient_call's answer], once asked
        has_weight = weight is not None
        self.chosen = chosen = forward_plan(x, weight, label_smoothing, z_loss, softcap, return_lse, strategy, inplace)
        self.denom = _buffers.template((3 if needs_denom(reduction, has_weight, label_smoothing) else 0,),
                                       compute_dtype(x.dtype), device)
        self.torch_path = chosen.strategy == "torch" or n_rows == 0
        if self.torch_path:
            return
        self.loss_rows = _buffers.template((n_rows,), loss_dtype if reduction == "none" else torch.float32, device)
        self.lse = _buffers.template((n_rows,), torch.float32, device)
        self.loss = None if reduction == "none" else _buffers.template((), loss_dtype, device)
        # The launches' keys take the alignment of buffers like those every call allocates.
        denom, loss_rows, lse, lse_low = (_buffers.empty_like(t) for t in (self.denom, self.loss_rows, self.lse,
                                                                             self.lse))
        # The gradient's scale (mean) and the loss (W, with label smoothing) need the denominators first.
        count_first = denom.numel() > 0 and (inplace or (has_weight and label_smoothing > 0))
        count = (count_recipe(target, weight if has_weight else denom, has_weight, n_cols, ignore_index,
                              label_smoothing > 0) if count_first else None)
        count_too = denom.numel() > 0 and not count_first
        # "separate": the stream's launch (its plan the main one), then the backward kernel's over x.
        first, second = chosen.parts if chosen.strategy == "separate" else (chosen, None)
        # The stream kernel's last row to finish reduces the loss (planner.REDUCE_IN_ROWS_LAUNCH), over few rows.
        self.folded = (planner.REDUCE_IN_ROWS_LAUNCH and n_rows <= planner.REDUCE_IN_ROWS_MAX_ROWS
                       and self.loss is not None and first.strategy in ("stream", "two_pass") and not first.plain)
        w = weight if has_weight else x
        self.main = forward_recipe(first, x, target, w, has_weight, loss_rows, lse, lse_low, ignore_index, reduction,
                                   label_smoothing, z_loss, softcap, temperature, return_lse, reduce_into=self.folded,
                                   count_too=count_too, out_dtype=loss_dtype, out_of_place=out_of_place).bind()
        if out_of_place and second is not None:  # planner.gradient_in_forward keeps separate's plans in place
            raise AssertionError("cross_entropy: an out-of-place forward met the plan 'separate'")
        self.write_grad = None if second is None else backward_recipe(
            second, x, x, target, w, has_weight, lse, lse_low, lse, *self.options, unit_grad=True).bind()
        self.exchange = splits_rows(first) or self.folded
        reduce = None if self.loss is None or self.folded else reduce_recipe(
            loss_rows, lse, target, weight if has_weight else loss_rows, has_weight, _buffers.empty_like(self.loss),
            n_cols, ignore_index, reduction, z_loss, count_too, label_smoothing > 0)
        # (the bound launches and their programs, for reduce_scratch)
        self.count, self.count_programs = (count.bind(), count.grid[0]) if count else (None, 1)
        self.reduce, self.reduce_programs = (reduce.bind(), reduce.grid[0]) if reduce else (None, 1)

    def __call__(self, x, target, weight, dx=None):
        """(loss, lse, lse_low, denom) of these logits (see launch_forward); ``dx``: the gradient's
        tensor of an ``out_of_place`` call."""
        planner.record(self.chosen)
        denom = _buffers.empty_like(self.denom)
        if self.torch_path:
            return torch_forward(x, target, weight, denom, *self.options, self.inplace, self.loss_dtype)
        loss_rows, lse, lse_low = (_buffers.empty_like(self.loss_rows), _buffers.empty_like(self.lse),
                                   _buffers.empty_like(self.lse))
        if self.count is not None:
            self.count(denom, denom, target, denom if weight is None else weight, denom, denom,
                       *reduce_scratch(self.count_programs, x.device, denom))
        parts, counters = _exchange(self.chosen, x.device) if self.exchange else (lse, lse)
        loss = lse if self.loss is None else _buffers.empty_like(self.loss)
        dx = x if dx is None else dx
        self.main(x, target, x if weight is None else weight, denom, loss_rows, lse, lse_low, parts, counters, loss, dx)
        if self.write_grad is not None:
            self.write_grad(x, dx, target, x if weight is None else weight, denom, lse, lse_low, lse)
        if self.loss is None:
            return loss_rows, lse, lse_low, denom
        if self.reduce is not None:
            self.reduce(loss_rows, lse, target, loss_rows if weight is None else weight, denom, loss,
                        *reduce_scratch(self.reduce_programs, x.device, lse))
        return loss, lse, lse_low, denom

    def gradient_call(self, x, target, weight) -> Optional["ForwardCall"]:
        """For a call that keeps its logits (not ``inplace``), where its gradient is best computed in
        the forward (planner.gradient_in_forward): the ForwardCall writing it into a new tensor of
        x's layout (same_layout_buffer). Else None. Decided at the first call that needs a gradient."""
        if self.fused is None:
            call = None
            _, reduction, label_smoothing, z_loss, softcap, _ = self.options
            # The gate first: an out-of-place ForwardCall takes no plan it refuses ('separate').
            if (not self.inplace and self.strategy is None and not self.torch_path and dense(x)
                    and planner.gradient_in_forward(forward_plan(x, weight, label_smoothing, z_loss, softcap,
                                                                 self.signature[0], None, True), reduction, x.device)):
                call = ForwardCall(x, target, weight, *self.options, *self.signature[:1], None, True,
                                   self.signature[1], out_of_place=True)
            self.fused = [call]
        return self.fused[0]

    def backward_over(self, dx, x, target, weight, lse, lse_low, denom, grad):
        """The backward of a call of this ``out_of_place`` forward, which wrote ``dx`` for an upstream
        gradient of 1: for ``grad`` (0-d) of 1 dx as it is, else dx written again from the logits (so
        the gradient is rounded once, as the backward kernel's, not scaled after a first rounding)."""
        key = (grad.dtype, aligned(grad))
        recipe = self.backward_calls.get(key)
        if recipe is None:
            n_rows, n_cols = x.shape
            chosen = planner.choose("backward", n_rows, n_cols, x.dtype, x.device, None, x.stride(0), x.stride(1))
            recipe = remember(self.backward_calls, key, backward_recipe(
                chosen, x, dx, target, x if weight is None else weight, weight is not None, lse, lse_low, grad,
                *self.options, skip_unit=True).bind())
        recipe(x, dx, target, x if weight is None else weight, denom, lse, lse_low, grad)
        return dx

    def backward(self, x, target, weight, lse, lse_low, denom, grad):
        """launch_backward for the tensors of a call of this forward (x, target and weight as given
        to it, the lse, lse_low and denom it returned): everything its key holds but the upstream
        gradient is this forward's, so that alone is looked up (an autograd step's host time)."""
        key = (grad.shape, grad.stride(), grad.dtype, aligned(grad))
        call = self.backward_calls.get(key)
        if call is None:
            call = remember(self.backward_calls, key, BackwardCall(x, target, weight, lse, lse_low, grad, *self.options,
                                                                   self.strategy, 0, None))
        return call(x, target, weight, lse, lse_low, denom, grad)


class BackwardCall:
    """One backward signature, decided once (as ForwardCall)."""

    def __init__(self, x, target, weight, lse, lse_low, grad, ignore_index, reduction, label_smoothing, z_loss,
                 softcap, temperature, strategy, class_offset, n_classes):
        self.options = (ignore_index, reduction, label_smoothing, z_loss, softcap, temperature)
        self.shard = (class_offset, n_classes)
        self.copy = not dense(x)  # a layout whose gradient would take more memory than x's elements
        if self.copy:
            x = x.contiguous()
        n_rows, n_cols = x.shape
        # The forward's strategy does not carry over (the backward has one kernel), its "torch" does.
        self.chosen = planner.choose("backward", n_rows, n_cols, x.dtype, x.device,
                                     "torch" if strategy == "torch" else None, x.stride(0), x.stride(1))
        self.torch_path = self.chosen.strategy == "torch" or n_rows == 0 or n_cols == 0
        if self.torch_path:
            return
        w = x if weight is None else weight
        self.main = backward_recipe(self.chosen, x, same_layout_buffer(x), target, w, weight is not None, lse,
                                    lse_low, grad, ignore_index, reduction, label_smoothing, z_loss, softcap,
                                    temperature, class_offset, n_classes).bind()

    def __call__(self, x, target, weight, lse, lse_low, denom, grad):
        planner.record(self.chosen)
        if self.copy:
            x = x.contiguous()
        if self.torch_path:
            return torch_backward(x, target, weight, denom, lse, lse_low, grad, *self.options, *self.shard)
        dx = same_layout_buffer(x)
        self.main(x, dx, target, x if weight is None else weight, denom, lse, lse_low, grad)
        return dx


_CALLS: dict = {}
plan_cache(_CALLS.clear)


def forward_call(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
                 reduction: str, label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                 return_lse: bool, strategy: Optional[str] = None, float32_loss: bool = False, *,
                 inplace: bool = False) -> ForwardCall:
    """The ForwardCall of this signature (launch_forward's arguments), made once."""
    key = ("forward", x.shape, x.stride(), x.dtype, x.device, target.dtype, target.stride(), aligned(x),
           aligned(target), _weight_signature(weight), ignore_index, reduction, label_smoothing, z_loss, softcap,
           temperature, return_lse, strategy, float32_loss, inplace, interpreter_active())
    call = _CALLS.get(key)
    if call is None:
        call = remember(_CALLS, key, ForwardCall(x, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                                                 softcap, temperature, return_lse, strategy, inplace, float32_loss))
    return call


def launch_forward(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
                   reduction: str, label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                   return_lse: bool, strategy: Optional[str] = None, float32_loss: bool = False, *,
                   inplace: bool = False):
    """(loss, lse, lse_low, denom) of (rows, classes) logits ``x``, lse_low being the float32 lse's
    rounding error (the backward's, see _triton.split_lse); the loss in x's dtype, or float32
    (``float32_loss``: torch's autocast policy). ``inplace``: x is overwritten with the gradient of
    the loss (for an upstream gradient of 1). ``inplace`` is keyword-only: the custom ops and the
    eager path pass the same positional arguments, and a strategy must never land in it."""
    return forward_call(x, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
                        return_lse, strategy, float32_loss, inplace=inplace)(x, target, weight)


def launch_backward(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], lse: torch.Tensor,
                    lse_low: torch.Tensor, denom: torch.Tensor, grad: torch.Tensor, ignore_index: int, reduction: str,
                    label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                    strategy: Optional[str] = None, class_offset: int = 0,
                    n_classes: Optional[int] = None) -> torch.Tensor:
    """The gradient of (rows, classes) logits ``x`` from the forward's lse, lse_low and denom, for the
    upstream gradient ``grad`` (0-d, or (rows,) for reduction "none"). ``class_offset``,
    ``n_classes``: x holds classes [class_offset, class_offset + cols) of n_classes (a vocabulary
    shard)."""
    key = ("backward", x.shape, x.stride(), x.dtype, x.device, target.dtype, target.stride(), aligned(x),
           aligned(target), _weight_signature(weight), aligned(lse), aligned(lse_low), grad.shape, grad.stride(),
           grad.dtype, aligned(grad), ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
           strategy, class_offset, n_classes, interpreter_active())
    call = _CALLS.get(key)
    if call is None:
        call = remember(_CALLS, key, BackwardCall(x, target, weight, lse, lse_low, grad, ignore_index, reduction,
                                                  label_smoothing, z_loss, softcap, temperature, strategy,
                                                  class_offset, n_classes))
    return call(x, target, weight, lse, lse_low, denom, grad)


def scale_recipe(x: torch.Tensor, out: torch.Tensor, grad: torch.Tensor, in_place: bool) -> Recipe:
    """out <- x * grad (0-d, or one value a row); tensors (x, out, grad)."""
    rows, cols = x.shape
    align, edges, contiguous = planner.layout(rows, cols, x.dtype, x.stride(0), x.stride(1))
    block, warps, per_row, tiles, grid = planner.scale_launch(rows, cols, x.dtype, x.device, interpreter_active())
    per_row_grad = grad.dim() > 0
    grad_stride = grad.stride(0) if per_row_grad else 0
    key = (x.shape, x.stride(), x.dtype, out.dtype, grad.dtype, grad_stride, aligned(x), aligned(out), aligned(grad),
           in_place, grid)
    return Recipe(_scale, grid, key, (cols, x.stride(0), x.stride(1), grad_stride, per_row, tiles), dict(
        BLOCK=block, ALIGN=align, CONTIGUOUS=contiguous, EDGES=edges, PER_ROW=per_row_grad, IN_PLACE=in_place,
        num_warps=warps))


def launch_scale(x: torch.Tensor, grad: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x * grad (0-d, or one value a row of x) into ``out`` (x's strides; default: x itself, where an
    upstream gradient of 1 is left alone without a pass over x)."""
    in_place = out is None
    out = x if in_place else out
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return out
    if not kernels_take(x):
        dtype = compute_dtype(x.dtype)
        scaled = x.to(dtype) * (grad.to(dtype).unsqueeze(-1) if grad.dim() else grad.to(dtype))
        return out.copy_(scaled)
    key = ("scale", x.shape, x.stride(), x.dtype, x.device, out.dtype, aligned(x), aligned(out), grad.shape,
           grad.stride(), grad.dtype, aligned(grad), in_place, interpreter_active())
    call = _CALLS.get(key)
    if call is None:
        call = remember(_CALLS, key, scale_recipe(x, out, grad, in_place).bind())
    call(x, out, grad)
    return out
