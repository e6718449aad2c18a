"""softmax / log_softmax / logsumexp launchers: row layout, cached launch recipes, the launches.

``launch_forward`` and ``launch_backward`` run one call of a validated op on the strategy
``plan.py`` chose. ``row_normalizers``, ``normalize_rows``, ``grad_dots`` and ``grad_rows`` are
the launchers :mod:`onlinesoftmax.distributed` builds on: each rank reduces its shard's rows to
partials, the ranks exchange them, and each writes its shard from the merged partials.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from ... import _buffers, cpu
from ..._device import (inline_ptx_allowed, interpreter_active, next_power_of_2, plan_cache, remember,
                         triton_runs_on)
from ..._launch import Launcher, aligned
from ..._triton import COUNTER_STRIDE
from . import plan as planner
from .kernels import (
    PARTIAL_MAX,
    PARTIAL_ONLINE,
    PARTIAL_SUM,
    looped_backward_kernel,
    looped_softmax_kernel,
    merge_partials_kernel,
    row_on_chip_backward_kernel,
    row_on_chip_softmax_kernel,
    split_row_backward_apply_kernel,
    split_row_backward_dot_kernel,
    split_row_normalize_kernel,
    split_row_on_chip_backward_kernel,
    split_row_on_chip_softmax_kernel,
    split_row_partials_kernel,
)


def _stride_groups(sizes, strides):
    """Merge adjacent dims whose strides chain (stride[i] == stride[i+1] * size[i+1]) into
    (size, stride) groups, outermost first; size-1 dims carry no stride and are dropped."""
    groups = []
    for size, stride in reversed([(sz, st) for sz, st in zip(sizes, strides) if sz != 1]):
        if groups and stride == groups[-1][1] * groups[-1][0]:
            groups[-1] = (groups[-1][0] * size, groups[-1][1])
        else:
            groups.append((size, stride))
    return groups[::-1]


def _row_layout(t: torch.Tensor, dim: int):
    """Describe the rows of ``t`` (every index but ``dim``) with at most two (size, stride) levels.

    Returns ``(t, inner, strides, side)``: row r sits at ``(r // inner) * stride_outer +
    (r % inner) * stride_inner`` and its columns ``stride_col`` apart; ``side`` says where the
    two levels come from ("both" sides of ``dim``, or all "before" / "after" it), which fixes the
    matching strides of a contiguous output. Views that need three or more levels are copied.
    """
    before = _stride_groups(t.shape[:dim], t.stride()[:dim])
    after = _stride_groups(t.shape[dim + 1:], t.stride()[dim + 1:])
    groups = before + after
    if len(groups) > 2:
        return _row_layout(t.contiguous(), dim)
    side = "both" if before and after else ("after" if after else "before")
    col_stride = t.stride(dim) if t.shape[dim] > 1 else 1
    if len(groups) == 2:
        return t, groups[1][0], (groups[0][1], col_stride, groups[1][1]), side
    return t, 1, (groups[0][1] if groups else 0, col_stride, 0), side


def _contiguous_row_strides(shape, dim: int, inner: int, side: str):
    """Strides of a contiguous tensor of ``shape`` under the row split ``inner`` of another tensor."""
    cols = shape[dim]
    inner_total = math.prod(shape[dim + 1:])
    if side == "both":
        return cols * inner_total, inner_total, 1
    unit = 1 if side == "after" else cols  # distance between consecutive rows
    return inner * unit, inner_total, unit


def _shape_rows(shape, dim):
    return math.prod(shape[:dim]) * math.prod(shape[dim + 1:]), shape[dim]


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: one object per signature
class _Recipe:
    """Everything about a launch that the input's shape, strides, dtype and options decide.

    Built once per distinct call signature (held by its ForwardCall or BackwardCall). The recipe's
    own identity, with the input pointer's alignment, is the compiled-kernel key (see ``_launch``).
    """

    plan: planner.Plan
    copy_input: bool  # the row dims do not merge into two (size, stride) levels: copy once
    inner: int
    in_strides: tuple
    out_strides: tuple
    contiguous: bool
    lse_shape: tuple
    opaque_widen: bool  # kernels may widen 16-bit tiles through inline PTX (not under the interpreter)
    granule: int  # elements in 16 bytes where rows are read in granules (see _row_granule), else 1
    # Where rows are read in granules: the most elements, up to a granule, that every row's start and
    # length are multiples of (the granule where rows are whole granules: every row's head is 0); else 1.
    row_multiple: int


def _row_granule(elem: int, n_cols: int, inner: int, in_strides: tuple, out_strides: tuple,
                 contiguous: bool) -> tuple[int, bool, int]:
    """(granule, misaligned, row_multiple): elements in 16 bytes where the kernels read rows in whole
    16-byte granules, else 1; whether rows start off 16-byte boundaries; and where there are
    granules, the most elements up to one that every row's start and length are multiples of
    (the lowest set bit of their gcd), else 1.

    Triton issues 16-byte accesses only where it proves the address and the mask uniform over
    each, and it learns divisibility only from integers divisible by 16. So granules are used
    wherever the row length or a row stride is no multiple of 16 elements: rows of an odd length
    start at another alignment each, and rows of 95704 bf16 (a multiple of 8), though every one
    starts on a 16-byte boundary, were read 2 bytes a load (bf16 1742 x 95704: 0.69x torch's
    log_softmax). Granules need a unit column stride, and the input's rows where the output's are,
    so that one row offset aligns both."""
    granule = 16 // elem
    # The inner stride only counts where there is more than one inner row.
    row_strides = (in_strides[0], in_strides[2]) if inner > 1 else (in_strides[0],)
    same_rows = row_strides == ((out_strides[0], out_strides[2]) if inner > 1 else (out_strides[0],))
    misaligned = any(stride % granule for stride in row_strides)
    unproven = n_cols % 16 or any(stride % 16 for stride in row_strides)
    if not (contiguous and unproven and same_rows):
        return 1, misaligned, 1
    common = math.gcd(n_cols, *row_strides)
    return granule, misaligned, min(granule, common & -common) if common else granule


def _unit_rows(inner: int, in_strides: tuple, out_strides: tuple) -> int:
    """The most consecutive rows (a power of two, 16 or more), from any multiple of it, that are
    consecutive elements of the input and of a contiguous output, their first on a multiple of 16
    elements: those of one inner slice of unit stride, or rows of unit stride outright; else 0."""
    if inner > 1:
        unit = (inner & -inner) if in_strides[2] == out_strides[2] == 1 and not (in_strides[0] % 16 or
                                                                                  out_strides[0] % 16) else 0
    else:
        unit = 1 << 30 if in_strides[0] == out_strides[0] == 1 else 0
    return unit if unit >= 16 else 0


def _make_recipe(t: torch.Tensor, dim: int, op: str, algorithm: str, strategy: Optional[str],
                 device: Optional[torch.device] = None, **choose_args) -> _Recipe:
    n_rows, n_cols = _shape_rows(t.shape, dim)
    laid_out, inner, in_strides, side = _row_layout(t, dim)
    out_strides = _contiguous_row_strides(t.shape, dim, inner, side)
    contiguous = in_strides[1] == 1 and out_strides[1] == 1
    granule, misaligned, row_multiple = _row_granule(t.element_size(), n_cols, inner, in_strides, out_strides,
                                                     contiguous)
    chosen = planner.choose(op, n_rows, n_cols, t.dtype, device or t.device, algorithm, strategy,
                            misaligned_rows=granule > 1 and misaligned, granule_rows=granule > 1,
                            row_multiple=row_multiple, unit_rows=_unit_rows(inner, in_strides, out_strides),
                            **choose_args)
    return _Recipe(chosen, laid_out is not t, inner, in_strides, out_strides, contiguous,
                   t.shape[:dim] + t.shape[dim + 1:], inline_ptx_allowed(), granule, row_multiple)


def contiguous_plan(op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device,
                    algorithm: str = "auto", strategy: Optional[str] = None, **choose_args) -> planner.Plan:
    """The plan the launchers make for a contiguous (rows, cols) tensor on ``device``, its rows read
    as they read them (_row_granule), from the layout alone: what ``explain`` prints and the probes
    model. ``choose_args``: planner.choose's ``sms`` and ``interpreting``."""
    layout = torch.empty((rows, cols), dtype=dtype, device="meta")
    return _make_recipe(layout, 1, op, algorithm, strategy, torch.device(device), **choose_args).plan


_row_on_chip_softmax = Launcher(row_on_chip_softmax_kernel)
_looped_softmax = Launcher(looped_softmax_kernel)
_split_row_partials = Launcher(split_row_partials_kernel)
_split_row_normalize = Launcher(split_row_normalize_kernel)
_merge_partials = Launcher(merge_partials_kernel)
_split_row_on_chip_softmax = Launcher(split_row_on_chip_softmax_kernel)
_split_row_on_chip_backward = Launcher(split_row_on_chip_backward_kernel)
_row_on_chip_backward = Launcher(row_on_chip_backward_kernel)
_looped_backward = Launcher(looped_backward_kernel)
_split_row_backward_dot = Launcher(split_row_backward_dot_kernel)
_split_row_backward_apply = Launcher(split_row_backward_apply_kernel)


def _by_alignment(launcher: Launcher, grid, recipe: _Recipe, meta_for, *tag) -> dict:
    """``{is_aligned: bound launch}``: one launch of ``launcher`` for an input 16-byte aligned and
    one for an input that is not, ``meta_for(align)`` giving each one's constexprs (``align``: the
    granule where rows are read in granules and the tensor allows it, else 1; outputs are always
    aligned)."""
    return {aligned: launcher.bind(grid, (recipe, aligned, *tag), **meta_for(recipe.granule if aligned else 1))
            for aligned in (False, True)}


def _row_align(recipe: _Recipe, align: int) -> int:
    """row_on_chip's ROW_ALIGN: the granule where rows read in granules all start and end on 16-byte
    boundaries (the kernel then tells Triton so); where they start and end on 8- or 4-byte ones
    (bf16 rows of 8604: 4 elements), that many elements, so that Triton reads 8 or 4 bytes a load
    and not one element (bf16 9682 x 8604 logsumexp: 126 registers a thread and 2-byte loads, 0.27
    ms, where 9682 x 8608 took 63 registers); else 1. Only for an input that is 16-byte aligned
    (align > 1): Triton knows nothing of another one's base."""
    return 1 if align == 1 else recipe.row_multiple


def _one_launch(bound: dict, ints: tuple):
    """The launch of a strategy that is one kernel over three tensors, its integers and 1 / T."""

    def launch(a, b, c, inv_t, is_aligned):
        bound[is_aligned](a, b, c, *ints, inv_t)

    return launch


def _exchange_sizes(plan: planner.Plan, planes: int) -> Optional[tuple]:
    """(partials, counters) that split_row_on_chip's launches take from _buffers.row_exchange:
    ``planes`` floats per chunk, the ticket counter and one arrival counter per row (see
    _triton.take_ticket); None for rows of one chunk, which exchange nothing (the launch passes a
    tensor of its own for both pointers). Decided with the launch, not per call."""
    if plan.num_chunks == 1:
        return None
    return planes * plan.rows * plan.num_chunks, COUNTER_STRIDE.value * (1 + plan.rows)


def torch_forward(x: torch.Tensor, dim: int, op: str, inv_temperature: float, out_dtype: torch.dtype) -> torch.Tensor:
    """The ``"torch"`` strategy: torch's own kernels, with the launchers' conventions (a float32
    lse; ``out_dtype`` at least as wide as ``x``'s, the callers having rounded narrower inputs).
    Also the public functions' path to torch (CPU tensors, other dtypes, small eager calls), so the
    common case, no temperature and x's own dtype, is one torch call."""
    if inv_temperature != 1.0:
        x = x.to(torch.promote_types(x.dtype, torch.float32)) * inv_temperature
    if op == "logsumexp":
        return torch.logsumexp(x.to(torch.promote_types(x.dtype, torch.float32)), dim)
    fn = torch.log_softmax if op == "log_softmax" else torch.softmax
    if x.dtype == out_dtype:
        return fn(x, dim)
    # A wider out_dtype: torch's dtype= (an exact upcast first). A narrower one (x widened for the
    # temperature): computed in x's dtype, rounded once.
    return fn(x, dim, dtype=out_dtype) if out_dtype.itemsize > x.dtype.itemsize else fn(x, dim).to(out_dtype)


def torch_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, inv_temperature: float,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """The ``"torch"`` strategy's backward: aten's softmax backward kernels."""
    backward = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    dx = backward(dy.to(y.dtype), y, dim, y.dtype)
    if inv_temperature != 1.0:
        dx = dx * inv_temperature
    return dx.to(out_dtype)


class ForwardCall:
    """One forward call signature (shape, strides, dtypes, dim, op, options) with everything but
    the tensors' addresses decided, so that a repeated call (a decode loop, a training step) costs
    an allocation and a launch: on the H100 machine's host the Python around a launch cost as much
    as a decode-sized kernel."""

    def __init__(self, x: torch.Tensor, dim: int, op: str, out_dtype: Optional[torch.dtype], algorithm: str,
                 strategy: Optional[str]):
        self.dim, self.op = dim, op
        self.out_dtype = out_dtype or x.dtype
        self.x_dtype, self.strategy = x.dtype, strategy
        self.backward_calls: dict = {}  # dy's signature -> BackwardCall (see backward)
        self.recipe = recipe = _make_recipe(x, dim, op, algorithm, strategy)
        self.plan = chosen = recipe.plan
        self.write_lse = op == "logsumexp"
        self.device = device = x.device
        self.shape = x.shape
        self.empty = x.numel() == 0
        # The output is allocated like the input where it can be (see _buffers.empty_like), else
        # from a template of y (or of the lse).
        self.like = not self.write_lse and self.out_dtype == x.dtype and x.is_contiguous() and not recipe.copy_input
        self.out = (_buffers.template(recipe.lse_shape, torch.float32, device) if self.write_lse
                    else None if self.like else _buffers.template(x.shape, self.out_dtype, device))
        self.launch = None
        if chosen.strategy in planner.TRITON_STRATEGIES:
            self.launch = self._launcher(recipe, chosen, device)

    def _launcher(self, recipe, chosen, device):
        common = dict(LOG=self.op == "log_softmax", WRITE_Y=not self.write_lse, WRITE_LSE=self.write_lse,
                      CONTIGUOUS=recipe.contiguous)
        strides = (*recipe.in_strides, *recipe.out_strides)
        n_cols, inner = chosen.cols, recipe.inner
        if chosen.strategy == "row_on_chip":
            bound = _by_alignment(_row_on_chip_softmax, chosen.grid, recipe, lambda align: dict(
                BLOCK_COLS=chosen.block_cols, ROWS_PER_PROGRAM=chosen.rows_per_program, HOLD_INPUT=chosen.hold_input,
                OPAQUE_WIDEN=recipe.opaque_widen, ROW_ALIGN=_row_align(recipe, align), TAIL_COLS=chosen.tail_cols,
                UNIT_ROWS=chosen.unit_rows, num_warps=chosen.num_warps, **common))
            return _one_launch(bound, (chosen.rows, n_cols, inner, *strides))
        if chosen.strategy == "looped":
            bound = _by_alignment(_looped_softmax, chosen.grid, recipe, lambda align: dict(
                BLOCK=chosen.block_cols, SAFE=chosen.algorithm == "safe", ALIGN=align, num_warps=chosen.num_warps,
                **common))
            return _one_launch(bound, (n_cols, inner, *strides))
        if chosen.strategy == "split_row_on_chip":
            bound = _by_alignment(_split_row_on_chip_softmax, chosen.grid, recipe, lambda align: dict(
                BLOCK_COLS=chosen.block_cols, CHUNKS_POW2=next_power_of_2(chosen.num_chunks),
                OPAQUE_WIDEN=recipe.opaque_widen, ALIGN=align, num_warps=chosen.num_warps, **chosen.compile_options,
                **common))
            ints = (n_cols, inner, *strides, chosen.chunk_size, chosen.num_chunks)
            sizes = _exchange_sizes(chosen, 2)  # (m, d) per chunk

            def launch(x, y, lse, inv_t, is_aligned):
                parts, counters = _buffers.row_exchange(*sizes, device) if sizes else (x, x)
                bound[is_aligned](x, y, lse, parts, counters, *ints, inv_t)
        else:
            chunks_pow2 = next_power_of_2(chosen.num_chunks)
            passes = (PARTIAL_MAX, PARTIAL_SUM) if chosen.algorithm == "safe" else (PARTIAL_ONLINE,)
            grid = (chosen.rows, 1 if self.write_lse else chosen.num_chunks)
            partial_ints = (n_cols, inner, *recipe.in_strides, chosen.chunk_size, chosen.num_chunks)
            normalize_ints = (n_cols, inner, *strides, chosen.chunk_size, chosen.num_chunks)
            by_pass = [_by_alignment(_split_row_partials, chosen.grid, recipe, lambda align, p=p: dict(
                BLOCK=chosen.block_cols, CHUNKS_POW2=chunks_pow2, CONTIGUOUS=recipe.contiguous, PASS=p, ALIGN=align,
                num_warps=chosen.num_warps), p) for p in passes]
            partials = {a: [bound[a] for bound in by_pass] for a in (False, True)}
            normalize = _by_alignment(_split_row_normalize, grid, recipe, lambda align: dict(
                BLOCK=chosen.block_cols, PARTIALS_POW2=chunks_pow2, ALIGN=align, num_warps=chosen.num_warps, **common))

            # One buffer for the three planes, no views of it: on the H100 machine's host each
            # tensor view cost about 5 us per call, as much as a launch.
            parts_template = _buffers.template((3, chosen.rows, chosen.num_chunks), torch.float32, device)

            def launch(x, y, lse, inv_t, is_aligned):
                parts = _buffers.empty_like(parts_template)
                for partial in partials[is_aligned]:
                    partial(x, parts, *partial_ints, inv_t)
                normalize[is_aligned](x, y, lse, parts, *normalize_ints, inv_t)
        return launch

    def __call__(self, x: torch.Tensor, temperature: float) -> torch.Tensor:
        chosen = self.plan
        planner.record(chosen)
        if self.launch is None:
            if chosen.strategy == "torch":
                return torch_forward(x, self.dim, self.op, 1.0 / temperature, self.out_dtype)
            return cpu.forward(x, self.dim, self.op, 1.0 / temperature, self.out_dtype, chosen.algorithm)
        # The output a launch does not write is passed as x: a valid pointer that is never stored to.
        if self.like:
            y, lse = _buffers.empty_like(x), x
        elif self.write_lse:
            y, lse = x, _buffers.empty_like(self.out)
        else:
            y, lse = _buffers.empty_like(self.out), x
        if self.empty:
            if self.write_lse:
                lse.fill_(float("-inf"))
            return lse if self.write_lse else y
        if self.recipe.copy_input:
            x = x.contiguous()
            y = x if self.write_lse else y
        self.launch(x, y, lse, 1.0 / temperature, aligned(x))
        return lse if self.write_lse else y

    def backward(self, y: torch.Tensor, dy: torch.Tensor, temperature: float) -> torch.Tensor:
        """dx of this softmax / log_softmax call's output y (dx in x's dtype): everything of the
        backward's signature but dy's layout is this call's, so only that is looked up (an eager
        training step's host time)."""
        key = (dy.shape, dy.stride(), dy.dtype)
        call = self.backward_calls.get(key)
        if call is None:
            call = remember(self.backward_calls, key, backward_call(y, dy, self.dim, self.op == "log_softmax",
                                                                    self.x_dtype, self.strategy))
        return call(y, dy, temperature)


class BackwardCall:
    """One backward call signature, decided once (see ForwardCall): dx for y = softmax(x / T) (or
    log_softmax) given the upstream gradient dy. dy (from upstream) can be any view and is laid out
    by the recipe; y (our own output) and dx are contiguous."""

    def __init__(self, y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, out_dtype: Optional[torch.dtype],
                 strategy: Optional[str]):
        self.dim, self.log = dim, log
        self.out_dtype = out_dtype or y.dtype
        op = "log_softmax_backward" if log else "softmax_backward"
        self.recipe = recipe = _make_recipe(dy, dim, op, "auto", strategy)
        self.plan = chosen = recipe.plan
        self.device = device = y.device
        self.shape = y.shape
        self.empty = y.numel() == 0
        self.like = self.out_dtype == y.dtype  # dx allocated like the (contiguous) y, else from a template
        self.dx = None if self.like else _buffers.template(y.shape, self.out_dtype, device)
        self.launch = None
        if chosen.strategy not in planner.TRITON_STRATEGIES:
            return
        # y, dy and dx in 16-byte granules where the recipe says so (see ForwardCall).
        y_strides = dx_strides = recipe.out_strides
        n_cols, inner, dy_strides = chosen.cols, recipe.inner, recipe.in_strides
        strides = (*y_strides, *dy_strides, *dx_strides)
        base = dict(CONTIGUOUS=recipe.contiguous, LOG=log, num_warps=chosen.num_warps)
        if chosen.strategy == "row_on_chip":
            bound = _by_alignment(_row_on_chip_backward, chosen.grid, recipe, lambda align: dict(
                BLOCK_COLS=chosen.block_cols, ROWS_PER_PROGRAM=chosen.rows_per_program,
                OPAQUE_WIDEN=recipe.opaque_widen, ROW_ALIGN=_row_align(recipe, align), TAIL_COLS=chosen.tail_cols,
                UNIT_ROWS=chosen.unit_rows, **base))
            launch = _one_launch(bound, (chosen.rows, n_cols, inner, *strides))
        elif chosen.strategy == "looped":
            bound = _by_alignment(_looped_backward, chosen.grid, recipe, lambda align: dict(
                BLOCK=chosen.block_cols, ALIGN=align, **base))
            launch = _one_launch(bound, (n_cols, inner, *strides))
        elif chosen.strategy == "split_row_on_chip":
            bound = _by_alignment(_split_row_on_chip_backward, chosen.grid, recipe, lambda align: dict(
                BLOCK_COLS=chosen.block_cols, CHUNKS_POW2=next_power_of_2(chosen.num_chunks),
                OPAQUE_WIDEN=recipe.opaque_widen, ALIGN=align, TAIL_COLS=chosen.tail_cols, **chosen.compile_options,
                **base))
            ints = (n_cols, inner, *strides, chosen.chunk_size, chosen.num_chunks)
            sizes = _exchange_sizes(chosen, 1)  # the dot per chunk

            def launch(y, dy, dx, inv_t, is_aligned):
                parts, counters = _buffers.row_exchange(*sizes, device) if sizes else (y, y)
                bound[is_aligned](y, dy, dx, parts, counters, *ints, inv_t)
        else:
            dot_ints = (n_cols, inner, *y_strides, *dy_strides, chosen.chunk_size, chosen.num_chunks)
            apply_ints = (n_cols, inner, *strides, chosen.chunk_size, chosen.num_chunks)
            dots = _by_alignment(_split_row_backward_dot, chosen.grid, recipe, lambda align: dict(
                BLOCK=chosen.block_cols, ALIGN=align, **base))
            applies = _by_alignment(_split_row_backward_apply, chosen.grid, recipe, lambda align: dict(
                BLOCK=chosen.block_cols, PARTIALS_POW2=next_power_of_2(chosen.num_chunks), ALIGN=align, **base))

            parts_template = _buffers.template((chosen.rows, chosen.num_chunks), torch.float32, device)

            def launch(y, dy, dx, inv_t, is_aligned):
                parts = _buffers.empty_like(parts_template)
                dots[is_aligned](y, dy, parts, *dot_ints)
                applies[is_aligned](y, dy, dx, parts, *apply_ints, inv_t)
        self.launch = launch

    def __call__(self, y: torch.Tensor, dy: torch.Tensor, temperature: float) -> torch.Tensor:
        chosen = self.plan
        planner.record(chosen)
        if self.launch is None:
            if chosen.strategy == "torch":
                return torch_backward(y, dy, self.dim, self.log, 1.0 / temperature, self.out_dtype)
            return cpu.backward(y, dy, self.dim, self.log, 1.0 / temperature, self.out_dtype)
        if not y.is_contiguous():
            y = y.contiguous()
        dx = _buffers.empty_like(y if self.like else self.dx)
        if self.empty:
            return dx
        if self.recipe.copy_input:
            dy = dy.contiguous()
        self.launch(y, dy, dx, 1.0 / temperature, aligned(dy) and aligned(y))
        return dx


_CALLS: dict = {}
plan_cache(_CALLS.clear)


def _cached(key, make):
    call = _CALLS.get(key)
    return call if call is not None else remember(_CALLS, key, make())


def forward_call(x: torch.Tensor, dim: int, op: str, out_dtype: Optional[torch.dtype] = None,
                 algorithm: str = "auto", strategy: Optional[str] = None) -> ForwardCall:
    """The ForwardCall of this signature, made once."""
    key = ("forward", x.shape, x.stride(), x.dtype, x.device, dim, op, out_dtype, algorithm, strategy,
           interpreter_active())
    return _cached(key, lambda: ForwardCall(x, dim, op, out_dtype, algorithm, strategy))


def backward_call(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, out_dtype: Optional[torch.dtype] = None,
                  strategy: Optional[str] = None) -> BackwardCall:
    """The BackwardCall of this signature, made once."""
    key = ("backward", dy.shape, dy.stride(), dy.dtype, y.dtype, y.device, dim, log, out_dtype, strategy,
           interpreter_active())
    return _cached(key, lambda: BackwardCall(y, dy, dim, log, out_dtype, strategy))


def launch_forward(x: torch.Tensor, dim: int, op: str, temperature: float = 1.0,
                   out_dtype: Optional[torch.dtype] = None, algorithm: str = "auto",
                   strategy: Optional[str] = None) -> torch.Tensor:
    """Run ``op`` over ``dim`` of ``x``: softmax / log_softmax return y (dtype ``out_dtype``);
    logsumexp returns the fp32 log-sum-exp with ``dim`` removed. Inputs are validated by callers."""
    return forward_call(x, dim, op, out_dtype, algorithm, strategy)(x, temperature)


def launch_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, temperature: float = 1.0,
                    out_dtype: Optional[torch.dtype] = None, strategy: Optional[str] = None) -> torch.Tensor:
    """dx for y = softmax(x / T) (or log_softmax) given the upstream gradient dy."""
    return backward_call(y, dy, dim, log, out_dtype, strategy)(y, dy, temperature)


# --------------------------------------------------------------------------------------------
# Rows reduced to partials and written from merged partials (onlinesoftmax.distributed)
# --------------------------------------------------------------------------------------------
# Each takes contiguous (rows, cols) tensors. With ``triton=False``, and on CPU tensors without the
# interpreter, they run the same arithmetic in torch (onlinesoftmax.cpu).


def _contiguous_rows_align(*tensors: torch.Tensor) -> int:
    """ALIGN for contiguous (rows, n) tensors: whole granules where n is no multiple of 16 (see _row_granule)."""
    granule = 16 // tensors[0].element_size()
    return granule if tensors[0].shape[1] % 16 and all(aligned(t) for t in tensors) else 1


def _split_row_plan(op: str, t: torch.Tensor) -> planner.Plan:
    chosen = planner.choose(op, t.shape[0], t.shape[1], t.dtype, t.device, "online", "split_row")
    planner.record(chosen)
    return chosen


def row_normalizers(x2: torch.Tensor, triton: bool = True) -> torch.Tensor:
    """(2, rows) float32: the m and the d of every row of ``x2``; (-inf, 0) where a row has no column."""
    rows, n = x2.shape
    if n == 0 or rows == 0:
        return torch.stack([torch.full((rows,), float("-inf"), device=x2.device), torch.zeros(rows, device=x2.device)])
    if not (triton and triton_runs_on(x2.device)):
        return torch.stack(cpu.normalizer(x2.float()))
    chosen = _split_row_plan("logsumexp", x2)
    pair = _buffers.empty((2, rows), torch.float32, x2.device)
    # The m and d planes of the chunks' partials; one chunk's planes are the pair itself.
    parts = pair if chosen.num_chunks == 1 else _buffers.empty((2, rows, chosen.num_chunks), torch.float32, x2.device)
    _split_row_partials(
        chosen.grid, (chosen, aligned(x2)), x2, parts, n, 1, n, 1, 0, chosen.chunk_size, chosen.num_chunks, 1.0,
        BLOCK=chosen.block_cols, CHUNKS_POW2=next_power_of_2(chosen.num_chunks), CONTIGUOUS=True,
        PASS=PARTIAL_ONLINE, ALIGN=_contiguous_rows_align(x2), num_warps=chosen.num_warps)
    if chosen.num_chunks == 1:
        return pair
    chunks_pow2 = next_power_of_2(chosen.num_chunks)
    _merge_partials((rows,), (chosen.num_chunks, chunks_pow2), parts, pair, chosen.num_chunks, CHUNKS_POW2=chunks_pow2,
                    num_warps=1)
    return pair


def normalize_rows(x2: torch.Tensor, pairs: torch.Tensor, log: bool, triton: bool = True) -> torch.Tensor:
    """softmax (or log_softmax) of ``x2``'s rows from n partial (m, d) pairs a row, merged in index
    order: ``pairs`` (n, 2, rows) float32, as an all_gather of n ranks' row_normalizers lays them
    out."""
    rows, n = x2.shape
    if not (triton and triton_runs_on(x2.device)):
        m, d = cpu.merge_normalizers(pairs[:, 0], pairs[:, 1], 0)
        xt = x2.float()
        y = (xt - m[:, None]) - torch.log(d)[:, None] if log else torch.exp(xt - m[:, None]) / d[:, None]
        return y.to(x2.dtype)
    y = _buffers.empty(x2.shape, x2.dtype, x2.device)
    if y.numel() == 0:
        return y
    chosen = _split_row_plan("softmax", x2)
    n_partials = pairs.shape[0]
    _split_row_normalize(
        (rows, chosen.num_chunks), (chosen, aligned(x2), n_partials, log, "rank_major"),
        x2, y, x2, pairs, n, 1, n, 1, 0, n, 1, 0, chosen.chunk_size, n_partials, 1.0,
        BLOCK=chosen.block_cols, PARTIALS_POW2=next_power_of_2(n_partials), CONTIGUOUS=True,
        LOG=log, WRITE_Y=True, WRITE_LSE=False, ALIGN=_contiguous_rows_align(x2), RANK_MAJOR=True,
        num_warps=chosen.num_warps)
    return y


def grad_dots(y2: torch.Tensor, dy2: torch.Tensor, log: bool, triton: bool = True) -> torch.Tensor:
    """Per row, float32: sum(dy * y) for softmax, sum(dy) for log_softmax."""
    rows, n = y2.shape
    if n == 0 or not (triton and triton_runs_on(y2.device)):
        return dy2.float().sum(1) if log else (dy2.float() * y2.float()).sum(1)
    chosen = _split_row_plan("softmax_backward", y2)
    parts = _buffers.empty((rows, chosen.num_chunks), torch.float32, y2.device)
    _split_row_backward_dot(
        chosen.grid, (chosen, aligned(y2), aligned(dy2), log), y2, dy2, parts, n, 1, n, 1, 0, n, 1, 0,
        chosen.chunk_size, chosen.num_chunks,
        BLOCK=chosen.block_cols, CONTIGUOUS=True, LOG=log, ALIGN=_contiguous_rows_align(y2, dy2),
        num_warps=chosen.num_warps)
    return parts.sum(1)


def grad_rows(y2: torch.Tensor, dy2: torch.Tensor, dot_parts: torch.Tensor, log: bool,
              triton: bool = True) -> torch.Tensor:
    """dx of ``y2``'s rows from (rows, n) float32 partial dots, summed in index order."""
    rows, n = y2.shape
    if not (triton and triton_runs_on(y2.device)):
        dot = dot_parts.sum(1)[:, None]
        y32, dy32 = y2.float(), dy2.float()
        return (dy32 - torch.exp(y32) * dot if log else y32 * (dy32 - dot)).to(y2.dtype)
    dx = _buffers.empty(y2.shape, y2.dtype, y2.device)
    if dx.numel() == 0:
        return dx
    chosen = _split_row_plan("softmax_backward", y2)
    n_partials = dot_parts.shape[1]
    _split_row_backward_apply(
        (rows, chosen.num_chunks), (chosen, aligned(y2), aligned(dy2), n_partials, log),
        y2, dy2, dx, dot_parts.contiguous(), n, 1, n, 1, 0, n, 1, 0, n, 1, 0, chosen.chunk_size, n_partials, 1.0,
        BLOCK=chosen.block_cols, PARTIALS_POW2=next_power_of_2(n_partials), CONTIGUOUS=True,
        LOG=log, ALIGN=_contiguous_rows_align(y2, dy2), num_warps=chosen.num_warps)
    return dx
