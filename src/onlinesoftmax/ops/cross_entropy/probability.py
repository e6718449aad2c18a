"""cross_entropy of probability targets (soft targets, distillation): Triton kernels.

Per row, with y = softcap(x) / T, q = (1 - eps) p + eps / C the targets mixed with the uniform
distribution, w the class weights (1 without), A = sum_c w_c q_c and the online normalizer (m, d)
of y (lse = m + log d)::

    loss = -sum_c w_c q_c (y_c - lse) + z lse^2 = A log d - B + z lse^2,   B = sum_c w_c q_c (y_c - m)
    dL/dy_c = g ((A + 2 z lse) p_c - w_c q_c),   p_c = exp((y_c - m) - log d)
    dL/dp_c = -g (1 - eps) w_c (y_c - lse)

The forward reads the logits and the targets once (B is kept relative to the running max and moved
with it: B += A (m_old - m_new)), writing five floats a row (the loss, m, log d, A, lse); where rows
are too few to fill the GPU they are cut into chunks, whose (m, d, A, B) a small kernel merges. The
backward reads both again and writes the logits' gradient (and the targets', when they need one). torch's
own path materializes the log-probabilities and their product with the targets (four tensors of
the logits' shape). -inf logits give what torch's -inf log-probabilities give (0 * -inf is NaN).
The reduction over rows is torch's (on the rows' float32 losses), autograd included.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ... import _buffers
from ..._device import cdiv, interpreter_active, next_power_of_2, plan_cache, remember, sm_count
from ..._launch import Launcher, aligned, op_when_compiling
from .kernels import transform
from . import plan as planner

# Columns a program takes a step, by the logits' element size; rows of up to 1024 columns share
# tiles of 1024 elements on 2 warps, longer rows step along on 8 (short rows, bf16 under CUDA
# graphs: 16384 x 129 0.0347 -> 0.0158 ms, 4007 x 369 0.0141 -> 0.0095 against tiles of 2048 on 8
# warps; docs/notes/2026-11/probe_probability_tiles-h200.log).
PROBABILITY_BLOCK = {4: 2048, 2: 4096}
PROBABILITY_TILE_ELEMENTS = 1024
PROBABILITY_WARPS = {True: 8, False: 2}  # by whether a step holds more than PROBABILITY_TILE_ELEMENTS
PROBABILITY_PROGRAMS_PER_SM = 4  # fewer rows' programs than this cut rows into chunks
STATS = 5  # floats a row: loss, ref (m, or 0 for an all -inf row), log d, A, lse


@triton.jit
def row_loss_stats(out_ptr, rows, live, n_rows, m, d, a, b, z_loss, Z: tl.constexpr):
    """Stores a row's (loss, ref, log d, A, lse) from its (m, d, A, B) (B relative to ref: m, or 0
    for an all -inf row) as five planes of n_rows floats."""
    ref = tl.where(m == float("-inf"), 0.0, m)
    log_d = tl.log(tl.where(live, d, 1.0))
    lse = ref + log_d
    loss = a * log_d - b
    if Z:
        loss += z_loss * lse * lse
    out = out_ptr + rows
    tl.store(out, loss, mask=live)
    tl.store(out + n_rows, ref, mask=live)
    tl.store(out + 2 * n_rows, log_d, mask=live)
    tl.store(out + 3 * n_rows, a, mask=live)
    tl.store(out + 4 * n_rows, lse, mask=live)


@triton.jit
def probability_forward_kernel(
    x_ptr, t_ptr, w_ptr, out_ptr, n_rows, n_cols, x_stride, t_stride, chunk_cols,
    softcap, inv_temperature, keep, spread, z_loss,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, SOFTCAP: tl.constexpr, Z: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # Programs over (ROWS rows, a chunk of chunk_cols columns). Whole rows (one chunk) store the
    # rows' stats; SPLIT stores each chunk's (m, d, A, B) in four planes of (chunks, n_rows) for
    # probability_merge_kernel.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < n_rows
    x_row = x_ptr + rows.to(tl.int64)[:, None] * x_stride
    t_row = t_ptr + rows.to(tl.int64)[:, None] * t_stride
    first = 0
    stop = n_cols
    if SPLIT:  # (whole rows keep a loop from 0 to n_cols: odd rows ran 8-24% slower through the chunk's bounds)
        first = tl.program_id(1) * chunk_cols
        stop = tl.minimum(first + chunk_cols, n_cols)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    d = tl.zeros([ROWS], tl.float32)
    a = tl.zeros([ROWS], tl.float32)
    b = tl.zeros([ROWS], tl.float32)
    for start in range(first, stop, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        in_row = cols < stop
        mask = live[:, None] & in_row[None, :]
        y = transform(tl.load(x_row + cols[None, :], mask=mask, other=0.0), softcap, inv_temperature, SOFTCAP)
        y = tl.where(mask, y, float("-inf"))
        q = tl.load(t_row + cols[None, :], mask=mask, other=0.0).to(tl.float32) * keep + spread
        if HAS_WEIGHT:
            q = q * tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)[None, :]
        q = tl.where(mask, q, 0.0)
        m_new = tl.maximum(m, tl.max(y, 1))
        # The reference point: 0 while every logit so far is -inf (exp(-inf - -inf) would be NaN).
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        # (While m is -inf, b holds -inf or NaN already if any entry was read.)
        b += a * tl.where(m == float("-inf"), 0.0, m - ref)
        d = d * tl.exp(m - ref) + tl.sum(tl.exp(y - ref[:, None]), 1)
        b += tl.sum(tl.where(mask, q * (y - ref[:, None]), 0.0), 1)
        a += tl.sum(q, 1)
        m = m_new
    if SPLIT:
        plane = tl.num_programs(1) * n_rows
        out = out_ptr + tl.program_id(1) * n_rows + rows
        tl.store(out, m, mask=live)
        tl.store(out + plane, d, mask=live)
        tl.store(out + 2 * plane, a, mask=live)
        tl.store(out + 3 * plane, b, mask=live)
    else:
        row_loss_stats(out_ptr, rows, live, n_rows, m, d, a, b, z_loss, Z)


@triton.jit
def probability_merge_kernel(partial_ptr, out_ptr, n_rows, n_chunks, z_loss, ROWS: tl.constexpr, Z: tl.constexpr):
    # The chunks' (m, d, A, B) of ROWS rows merged in chunk order into the rows' stats: B moves to
    # the row's reference point as the forward moves it along a row.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < n_rows
    plane = n_chunks * n_rows
    m = tl.full([ROWS], float("-inf"), tl.float32)
    for chunk in range(n_chunks):
        m = tl.maximum(m, tl.load(partial_ptr + chunk * n_rows + rows, mask=live, other=float("-inf")))
    ref = tl.where(m == float("-inf"), 0.0, m)
    d = tl.zeros([ROWS], tl.float32)
    a = tl.zeros([ROWS], tl.float32)
    b = tl.zeros([ROWS], tl.float32)
    for chunk in range(n_chunks):
        at = partial_ptr + chunk * n_rows + rows
        m_k = tl.load(at, mask=live, other=float("-inf"))
        a_k = tl.load(at + 2 * plane, mask=live, other=0.0)
        d += tl.load(at + plane, mask=live, other=0.0) * tl.exp(m_k - ref)
        b += tl.load(at + 3 * plane, mask=live, other=0.0) + a_k * (tl.where(m_k == float("-inf"), 0.0, m_k) - ref)
        a += a_k
    row_loss_stats(out_ptr, rows, live, n_rows, m, d, a, b, z_loss, Z)


@triton.jit
def probability_backward_kernel(
    x_ptr, t_ptr, w_ptr, stats_ptr, grad_ptr, dx_ptr, dt_ptr, n_rows, n_cols, x_stride, t_stride, grad_stride,
    chunk_cols, softcap, inv_temperature, keep, spread, z_loss, grad_scale,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, SOFTCAP: tl.constexpr, Z: tl.constexpr,
    TARGET_GRAD: tl.constexpr, SPLIT: tl.constexpr,
):
    # Programs over (ROWS rows, a chunk of columns), as the forward's; the gradients contiguous.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < n_rows
    r64 = rows.to(tl.int64)[:, None]
    ref = tl.load(stats_ptr + n_rows + rows, mask=live, other=0.0)
    log_d = tl.load(stats_ptr + 2 * n_rows + rows, mask=live, other=0.0)
    a = tl.load(stats_ptr + 3 * n_rows + rows, mask=live, other=0.0)
    g = tl.load(grad_ptr + rows.to(tl.int64) * grad_stride, mask=live, other=0.0).to(tl.float32) * grad_scale
    coefficient = a
    if Z:
        coefficient += 2.0 * z_loss * (ref + log_d)
    first = 0
    stop = n_cols
    if SPLIT:  # (as the forward's)
        first = tl.program_id(1) * chunk_cols
        stop = tl.minimum(first + chunk_cols, n_cols)
    for start in range(first, stop, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        in_row = cols < stop
        mask = live[:, None] & in_row[None, :]
        x = tl.load(x_ptr + r64 * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = transform(x, softcap, inv_temperature, SOFTCAP)
        shifted = (y - ref[:, None]) - log_d[:, None]  # y - lse, from its two parts
        w = 1.0
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)[None, :]
        p = tl.load(t_ptr + r64 * t_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = g[:, None] * (coefficient[:, None] * tl.exp(shifted) - w * (p * keep + spread))
        if SOFTCAP:
            # d(softcap tanh(x / softcap)) / dx = 1 - tanh^2, tanh = y T / softcap.
            tanh = y / (inv_temperature * softcap)
            dy = dy * (1.0 - tanh * tanh)
        tl.store(dx_ptr + r64 * n_cols + cols[None, :], (dy * inv_temperature).to(dx_ptr.dtype.element_ty), mask=mask)
        if TARGET_GRAD:
            dt = -g[:, None] * keep * w * shifted
            tl.store(dt_ptr + r64 * n_cols + cols[None, :], dt.to(dt_ptr.dtype.element_ty), mask=mask)


_FORWARD = Launcher(probability_forward_kernel)
_MERGE = Launcher(probability_merge_kernel)
_BACKWARD = Launcher(probability_backward_kernel)
MERGE_ROWS = 128  # rows a merge program takes


class Layout(NamedTuple):
    """How a (rows, C) call is cut into programs."""

    rows: int  # rows a program holds
    block: int  # columns a step
    num_warps: int
    chunks: int  # programs along a row (1: whole rows)
    chunk_cols: int  # columns a chunk (a multiple of block)


def layout(n_rows: int, n_cols: int, element_size: int, sms: int) -> Layout:
    """Tiles of PROBABILITY_TILE_ELEMENTS (ROWS short rows, or steps of PROBABILITY_BLOCK along a long
    one); where the rows' programs are fewer than PROBABILITY_PROGRAMS_PER_SM an SM, rows cut into
    that many chunks (a chunk at least a step)."""
    block = min(next_power_of_2(max(n_cols, 1)), PROBABILITY_BLOCK[min(element_size, 4)])
    rows = max(1, min(PROBABILITY_TILE_ELEMENTS // block, next_power_of_2(max(n_rows, 1))))
    if interpreter_active():  # the interpreter runs programs in turn: small tiles, every path
        block, rows = min(block, 64), min(rows, 4)
    steps = cdiv(max(n_cols, 1), block)
    chunks = max(1, min(steps, cdiv(PROBABILITY_PROGRAMS_PER_SM * sms, cdiv(max(n_rows, 1), rows))))
    chunk_cols = cdiv(steps, chunks) * block
    return Layout(rows, block, PROBABILITY_WARPS[block > PROBABILITY_TILE_ELEMENTS], cdiv(n_cols, chunk_cols),
                  chunk_cols)


def _scalars(label_smoothing, z_loss, softcap, temperature, n_cols) -> tuple:
    """(softcap, inverse temperature, keep, spread, z_loss) as the kernels take them."""
    return softcap or 1.0, 1.0 / temperature, 1.0 - label_smoothing, label_smoothing / n_cols, z_loss


class ForwardCall:
    """The forward of one signature (shapes, strides, dtypes, options, alignment), prepared once:
    ``call(x, target, weight)`` -> (STATS, rows) float32 stats (see the module's docstring)."""

    def __init__(self, x, target, weight, label_smoothing, z_loss, softcap, temperature):
        n_rows, n_cols = x.shape
        self.shape, self.device = (STATS, n_rows), x.device
        self.layout = cut = layout(n_rows, n_cols, x.element_size(), sm_count(x.device))
        self.chosen = planner.Plan("probabilities", "probability_rows", n_rows, n_cols, x.dtype, block=cut.block,
                                   num_warps=cut.num_warps, num_chunks=cut.chunks)
        flags = dict(HAS_WEIGHT=weight is not None, SOFTCAP=softcap > 0, Z=z_loss > 0)
        key = (n_rows, n_cols, x.stride(0), target.stride(0), x.dtype, target.dtype,
               None if weight is None else weight.dtype, aligned(x), aligned(target), cut, *flags.values())
        self.scalars = _scalars(label_smoothing, z_loss, softcap, temperature, n_cols)
        self.forward = _FORWARD.bind((cdiv(n_rows, cut.rows), cut.chunks), key, ROWS=cut.rows, BLOCK=cut.block,
                                     num_warps=cut.num_warps, SPLIT=cut.chunks > 1, **flags)
        self.merge = None
        if cut.chunks > 1:
            self.merge = _MERGE.bind((cdiv(n_rows, MERGE_ROWS),), (n_rows, cut.chunks, flags["Z"]), ROWS=MERGE_ROWS,
                                     Z=flags["Z"], num_warps=4)
        self.args = (n_rows, n_cols, x.stride(0), target.stride(0), cut.chunk_cols, *self.scalars)

    def __call__(self, x, target, weight):
        planner.record(self.chosen)
        stats = _buffers.empty(self.shape, torch.float32, self.device)
        if self.shape[1] == 0:
            return stats
        if self.merge is None:
            self.forward(x, target, x if weight is None else weight, stats, *self.args)
            return stats
        n_rows, chunks = self.shape[1], self.layout.chunks
        partials = _buffers.empty((4, chunks, n_rows), torch.float32, self.device)
        self.forward(x, target, x if weight is None else weight, partials, *self.args)
        self.merge(partials, stats, n_rows, chunks, self.scalars[4])
        return stats


class BackwardCall:
    """The backward of one signature: ``call(x, target, weight, stats, grad)`` -> (the logits'
    gradient, the targets' or an empty tensor), from the forward's stats and the rows' upstream
    gradient (any stride, 0 for one value broadcast) times ``grad_scale``."""

    def __init__(self, x, target, weight, grad, grad_scale, label_smoothing, z_loss, softcap, temperature,
                 target_grad):
        n_rows, n_cols = x.shape
        cut = layout(n_rows, n_cols, x.element_size(), sm_count(x.device))
        flags = dict(HAS_WEIGHT=weight is not None, SOFTCAP=softcap > 0, Z=z_loss > 0, TARGET_GRAD=target_grad)
        key = (n_rows, n_cols, x.stride(0), target.stride(0), grad.stride(0), x.dtype, target.dtype, grad.dtype,
               None if weight is None else weight.dtype, aligned(x), aligned(target), aligned(grad), cut,
               *flags.values())
        self.target_grad, self.rows = target_grad, n_rows
        self.backward = _BACKWARD.bind((cdiv(n_rows, cut.rows), cut.chunks), key, ROWS=cut.rows, BLOCK=cut.block,
                                       num_warps=cut.num_warps, SPLIT=cut.chunks > 1, **flags)
        self.args = (n_rows, n_cols, x.stride(0), target.stride(0), grad.stride(0), cut.chunk_cols,
                     *_scalars(label_smoothing, z_loss, softcap, temperature, n_cols), grad_scale)

    def __call__(self, x, target, weight, stats, grad):
        dx = _buffers.empty(x.shape, x.dtype, x.device)
        dt = _buffers.empty(target.shape, target.dtype, target.device) if self.target_grad else dx.new_empty(0)
        if self.rows:
            self.backward(x, target, x if weight is None else weight, stats, grad, dx, dt if self.target_grad else dx,
                          *self.args)
        return dx, dt


# Prepared calls by signature (plan_cache clears them with the plans).
_FORWARD_CALLS: dict = {}
_BACKWARD_CALLS: dict = {}
plan_cache(_FORWARD_CALLS.clear)
plan_cache(_BACKWARD_CALLS.clear)


def launch_probability_forward(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                               label_smoothing: float, z_loss: float, softcap: float, temperature: float) -> torch.Tensor:
    """(STATS, rows) float32 of (rows, C) logits and targets with unit column stride: each row's
    loss, m, log d, A and lse (see the module's docstring)."""
    key = (x.shape, x.stride(0), target.stride(0), x.dtype, target.dtype, None if weight is None else weight.dtype,
           x.device, aligned(x), aligned(target), label_smoothing, z_loss, softcap, temperature)
    call = _FORWARD_CALLS.get(key)
    if call is None:
        call = remember(_FORWARD_CALLS, key, ForwardCall(x, target, weight, label_smoothing, z_loss, softcap,
                                                         temperature))
    return call(x, target, weight)


def launch_probability_backward(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, stats: torch.Tensor,
                                grad: torch.Tensor, grad_scale: float, label_smoothing: float, z_loss: float,
                                softcap: float, temperature: float, target_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the logits' gradient, the targets' gradient or an empty tensor); see BackwardCall."""
    key = (x.shape, x.stride(0), target.stride(0), x.dtype, target.dtype, None if weight is None else weight.dtype,
           x.device, aligned(x), aligned(target), grad.stride(0), grad.dtype, aligned(grad), grad_scale,
           label_smoothing, z_loss, softcap, temperature, target_grad)
    call = _BACKWARD_CALLS.get(key)
    if call is None:
        call = remember(_BACKWARD_CALLS, key, BackwardCall(x, target, weight, grad, grad_scale, label_smoothing, z_loss,
                                                           softcap, temperature, target_grad))
    return call(x, target, weight, stats, grad)


# --------------------------------------------------------------------------------------------
# Custom ops (torch.compile) and autograd
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("onlinesoftmax::probability_cross_entropy_forward", mutates_args=())
def _forward_op(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, label_smoothing: float,
                z_loss: float, softcap: float, temperature: float) -> torch.Tensor:
    return launch_probability_forward(x, target, weight, label_smoothing, z_loss, softcap, temperature)


@_forward_op.register_fake
def _(x, target, weight, label_smoothing, z_loss, softcap, temperature):
    return x.new_empty((STATS, x.shape[0]), dtype=torch.float32)


@torch.library.custom_op("onlinesoftmax::probability_cross_entropy_backward", mutates_args=())
def _backward_op(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, stats: torch.Tensor,
                 grad: torch.Tensor, grad_scale: float, label_smoothing: float, z_loss: float, softcap: float,
                 temperature: float, target_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_probability_backward(x, target, weight, stats, grad, grad_scale, label_smoothing, z_loss, softcap,
                                       temperature, target_grad)


@_backward_op.register_fake
def _(x, target, weight, stats, grad, grad_scale, label_smoothing, z_loss, softcap, temperature, target_grad):
    return x.new_empty(x.shape), target.new_empty(target.shape) if target_grad else x.new_empty(0)


forward = op_when_compiling(_forward_op, launch_probability_forward)
backward = op_when_compiling(_backward_op, launch_probability_backward)


class ProbabilityCrossEntropy(torch.autograd.Function):
    """(rows' float32 losses, rows' float32 lse) of (rows, C) logits and probability targets, unit
    column stride; options (label_smoothing, z_loss, softcap (0: none), temperature)."""

    @staticmethod
    def forward(ctx, x, target, weight, options):
        stats = forward(x, target, weight, *options)
        ctx.save_for_backward(x, target, weight, stats)
        ctx.options = options
        ctx.mark_non_differentiable(stats[4])
        return stats[0], stats[4]

    @staticmethod
    def backward(ctx, grad, _grad_lse):
        x, target, weight, stats = ctx.saved_tensors
        dx, dt = backward(x, target, weight, stats, grad, 1.0, *ctx.options, ctx.needs_input_grad[1])
        return dx, dt if ctx.needs_input_grad[1] else None, None, None
