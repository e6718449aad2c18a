"""linear_cross_entropy under torch.compile: the call as two custom ops (see linear.py for the
computation they run)."""

from __future__ import annotations

from typing import Optional

import torch

from .launch import needs_denom
from .linear import _chunk_rows, _forward, _gradient_buffers, _loss, _loss_and_lse, _Pass, _slice_classes, \
    _VocabSlices
from .torch_path import compute_dtype

# A traced call plans nothing itself (a plan reads the sizes, which torch.compile may trace as
# symbols): the ops plan their chunks when they run, and what they return has shapes and dtypes
# the compiler knows without the plan. For "mean" and "sum" over chunks of rows the forward op
# computes the gradients too, as the eager call does (three matmuls); otherwise the backward op
# recomputes the logits (four). chunk and vocab_chunk travel as ints: chunk 0 is "auto";
# vocab_chunk -1 is None, 0 "auto".


def _plan_codes(chunk, vocab_chunk) -> tuple[int, int]:
    return (0 if chunk == "auto" else chunk,
            -1 if vocab_chunk is None else 0 if vocab_chunk == "auto" else vocab_chunk)


def _plan_values(chunk_code: int, vocab_chunk_code: int) -> tuple:
    return ("auto" if chunk_code == 0 else chunk_code,
            None if vocab_chunk_code < 0 else "auto" if vocab_chunk_code == 0 else vocab_chunk_code)


def _grads_in_forward(reduction: str, vocab_chunk: int, wanted) -> bool:
    """Whether a traced call's forward computes the gradients (for an upstream gradient of 1, as the
    eager call's "mean" and "sum" do: three matmuls) rather than its backward recomputing the logits."""
    return reduction != "none" and vocab_chunk < 0 and any(wanted)


@torch.library.custom_op("onlinesoftmax::linear_cross_entropy_forward", mutates_args=())
def _traced_forward_op(x2: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
                       class_weight: Optional[torch.Tensor], ignore_index: int, reduction: str,
                       label_smoothing: float, z_loss: float, softcap: float, temperature: float, return_lse: bool,
                       chunk: int, vocab_chunk: int, strategy: Optional[str], want_x: bool, want_w: bool,
                       want_b: bool, float32_loss: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                  torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, lse parts, denom, grad x, grad weight, grad bias) of a traced call (chunk and
    vocab_chunk as _plan_codes gives them); the gradients where _grads_in_forward, else empty, in
    their inputs' dtypes (the fake cannot know the chunk count, which decides the dtype of the eager
    call's grad W until its backward: a float32 accumulator is rounded here)."""
    options = (ignore_index, reduction, label_smoothing, z_loss, softcap, temperature, return_lse)
    wanted = (want_x, want_w, want_b and bias is not None)
    chunk, vocab_chunk_value = _plan_values(chunk, vocab_chunk)
    loss_dtype = torch.float32 if float32_loss else x2.dtype
    if _grads_in_forward(reduction, vocab_chunk, wanted):
        chunk_rows = _chunk_rows(x2, weight, chunk, want_w and compute_dtype(weight.dtype) != weight.dtype)
        loss, lse_parts, denom, grads = _forward(x2, weight, bias, target, class_weight, options, chunk_rows,
                                                 strategy, wanted, loss_dtype)
        grads = tuple(g if g is None or g.dtype == t.dtype else g.to(t.dtype)
                      for g, t in zip(grads, (x2, weight, bias if bias is not None else x2)))
    else:
        loss, lse_parts, denom = _loss(x2, weight, bias, target, class_weight, options, chunk, vocab_chunk_value,
                                       strategy, loss_dtype)
        grads = (None,) * 3
    return loss, lse_parts, denom, *(g if g is not None else t.new_empty((0,))
                                     for g, t in zip(grads, (x2, weight, x2)))


@_traced_forward_op.register_fake
def _(x2, weight, bias, target, class_weight, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
      return_lse, chunk, vocab_chunk, strategy, want_x, want_w, want_b, float32_loss):
    rows, stats = x2.shape[0], compute_dtype(x2.dtype)
    denom = 3 if needs_denom(reduction, class_weight is not None, label_smoothing) else 0
    grads = _grads_in_forward(reduction, vocab_chunk, (want_x, want_w, want_b and bias is not None))
    return (x2.new_empty((rows,) if reduction == "none" else (), dtype=torch.float32 if float32_loss else x2.dtype),
            x2.new_empty((2, rows), dtype=stats),
            x2.new_empty((denom,), dtype=stats), x2.new_empty(x2.shape if grads and want_x else (0,)),
            weight.new_empty(weight.shape if grads and want_w else (0,)),
            x2.new_empty(bias.shape if grads and want_b and bias is not None else (0,)))


@torch.library.custom_op("onlinesoftmax::linear_cross_entropy_backward", mutates_args=())
def _traced_backward_op(x2: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
                        class_weight: Optional[torch.Tensor], lse_parts: torch.Tensor, denom: torch.Tensor,
                        grad: torch.Tensor, ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
                        softcap: float, temperature: float, return_lse: bool, chunk: int, vocab_chunk: int,
                        strategy: Optional[str], want_x: bool, want_w: bool,
                        want_b: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad x, grad weight, grad bias) in their inputs' dtypes for the upstream ``grad``, each
    empty where not wanted, from the logits recomputed a chunk (or a vocabulary slice) at a time."""
    options = (ignore_index, reduction, label_smoothing, z_loss, softcap, temperature, return_lse)
    wanted = (want_x, want_w, want_b and bias is not None)
    chunk, vocab_chunk = _plan_values(chunk, vocab_chunk)
    slice_classes = _slice_classes(x2, weight, vocab_chunk)
    if slice_classes is not None:
        grads = _VocabSlices(x2, weight, bias, target, class_weight, options, slice_classes, strategy).backward(
            lse_parts[0], lse_parts[1], denom, grad, wanted)
    else:
        chunk_rows = _chunk_rows(x2, weight, chunk, want_w and compute_dtype(weight.dtype) != weight.dtype)
        grads = _gradient_buffers(x2, weight, bias, wanted, -(-x2.shape[0] // chunk_rows))
        if x2.shape[0]:
            _Pass(x2, weight, bias, target, class_weight, options, chunk_rows, strategy).backward(
                lse_parts, denom, grad, *grads)
    return tuple(g.to(t.dtype) if g is not None else x2.new_empty((0,))
                 for g, t in zip(grads, (x2, weight, bias if bias is not None else x2)))


@_traced_backward_op.register_fake
def _(x2, weight, bias, target, class_weight, lse_parts, denom, grad, ignore_index, reduction, label_smoothing,
      z_loss, softcap, temperature, return_lse, chunk, vocab_chunk, strategy, want_x, want_w, want_b):
    return (x2.new_empty(x2.shape) if want_x else x2.new_empty((0,)),
            weight.new_empty(weight.shape) if want_w else x2.new_empty((0,)),
            bias.new_empty(bias.shape) if want_b and bias is not None else x2.new_empty((0,)))


class _TracedLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, target, class_weight, options, chunk, vocab_chunk, strategy, float32_loss):
        wanted = ctx.needs_input_grad[:3]
        loss, lse_parts, denom, *grads = _traced_forward_op(x2, weight, bias, target, class_weight, *options, chunk,
                                                            vocab_chunk, strategy, *wanted, float32_loss)
        ctx.grads_in_forward = _grads_in_forward(options[1], vocab_chunk, wanted)
        if ctx.grads_in_forward:
            ctx.save_for_backward(*grads)
        else:
            ctx.save_for_backward(x2, weight, bias, target, class_weight, lse_parts, denom)
        ctx.config = (options, chunk, vocab_chunk, strategy)
        return _loss_and_lse(ctx, loss, lse_parts[0])

    @staticmethod
    def backward(ctx, dloss, _dlse):
        wanted = ctx.needs_input_grad[:3]
        if ctx.grads_in_forward:
            # The forward's gradients times the upstream one (0-d: the product keeps their dtype).
            grads = tuple(g * dloss if want else None for g, want in zip(ctx.saved_tensors, wanted))
        else:
            x2, weight, bias, target, class_weight, lse_parts, denom = ctx.saved_tensors
            options, chunk, vocab_chunk, strategy = ctx.config
            grads = _traced_backward_op(x2, weight, bias, target, class_weight, lse_parts, denom, dloss, *options,
                                        chunk, vocab_chunk, strategy, *wanted)
            grads = tuple(g if want else None for g, want in zip(grads, wanted))
        return (*grads, None, None, None, None, None, None, None)
