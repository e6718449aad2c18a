"""CrossEntropyLoss and LinearCrossEntropyLoss: torch.nn's loss modules on cross_entropy and
linear_cross_entropy, with torch's constructor arguments and conventions, so that a model swaps the
module and nothing else (its state_dict keys included)."""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn import _reduction

from .linear import linear_cross_entropy
from .op import cross_entropy


class CrossEntropyLoss(torch.nn.Module):
    """``torch.nn.CrossEntropyLoss`` computed by :func:`onlinesoftmax.cross_entropy`.

    The arguments torch's module takes, in its order, then this library's options (keyword-only).
    As torch's, ``forward(input, target)`` takes the classes at dim 1 of an input of more than two
    dims ((N, C, d1, ...), targets (N, d1, ...)), through a view that puts them last (the functional
    ``cross_entropy`` takes the class dim last). With N = 1 the kernels read that view as it is
    (rows of unit stride, at tiles of their own); with N > 1 its rows do not merge into one dim and
    it is copied first (docs/perf-cross_entropy.md, "Short rows").

    Parameters
    ----------
    weight : Tensor, optional
        (C,) per-class weights, a buffer of the module as in torch (``.to()`` moves it, the
        state_dict holds it).
    size_average, reduce : bool, optional
        torch's deprecated arguments, mapped to ``reduction`` by torch's own rule (with its warning).
    ignore_index, reduction, label_smoothing
        As torch's.
    z_loss, softcap, temperature, inplace_backward, gradient_in_forward
        As :func:`onlinesoftmax.cross_entropy`. ``inplace_backward=True`` overwrites the module's
        input with its gradient during the forward.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> loss_fn = onlinesoftmax.CrossEntropyLoss(label_smoothing=0.1)
    >>> x, t = torch.randn(4, 10), torch.tensor([1, 2, 3, -100])
    >>> torch.allclose(loss_fn(x, t), torch.nn.CrossEntropyLoss(label_smoothing=0.1)(x, t), atol=1e-6)
    True
    """

    def __init__(self, weight: Optional[torch.Tensor] = None, size_average=None, ignore_index: int = -100,
                 reduce=None, reduction: str = "mean", label_smoothing: float = 0.0, *, z_loss: float = 0.0,
                 softcap: Optional[float] = None, temperature: float = 1.0, inplace_backward: bool = False,
                 gradient_in_forward: bool = False):
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = _reduction.legacy_get_string(size_average, reduce)
        self.register_buffer("weight", weight)
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing
        self.z_loss, self.softcap, self.temperature = z_loss, softcap, temperature
        self.inplace_backward, self.gradient_in_forward = inplace_backward, gradient_in_forward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if isinstance(input, torch.Tensor) and input.dim() > 2:
            input = input.movedim(1, -1)
            if isinstance(target, torch.Tensor) and target.is_floating_point() and target.dim() > 2:
                target = target.movedim(1, -1)  # probability targets have the input's shape
        return cross_entropy(input, target, ignore_index=self.ignore_index, reduction=self.reduction,
                             label_smoothing=self.label_smoothing, z_loss=self.z_loss, softcap=self.softcap,
                             temperature=self.temperature, weight=self.weight,
                             inplace_backward=self.inplace_backward, gradient_in_forward=self.gradient_in_forward)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, softcap={self.softcap}, "
                f"temperature={self.temperature}, inplace_backward={self.inplace_backward}")


class LinearCrossEntropyLoss(torch.nn.Module):
    """The loss of a linear output projection, as torch 2.13's ``torch.nn.LinearCrossEntropyLoss``,
    computed by :func:`onlinesoftmax.linear_cross_entropy` (the logits never materialized).

    The module owns the projection as ``self.linear``, a ``torch.nn.Linear(in_features,
    num_classes)`` (the state_dict keys ``linear.weight`` and ``linear.bias`` are torch's), and
    ``forward(input, target)`` takes (..., in_features) hidden states and ``input.shape[:-1]``
    class indices. torch's ``out_features`` (a K-dimensional loss) and ``options`` (its chunking)
    are not taken: ``chunk`` and ``vocab_chunk`` set ours.

    Parameters
    ----------
    in_features, num_classes, bias, device, dtype
        The projection's, as ``torch.nn.Linear``.
    reduction, weight, label_smoothing
        As torch's; ``weight`` (num_classes,) per-class weights, a buffer.
    ignore_index : int, optional
        As torch's: None means -100.
    chunk, vocab_chunk, z_loss, softcap, temperature
        As :func:`onlinesoftmax.linear_cross_entropy`.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> loss_fn = onlinesoftmax.LinearCrossEntropyLoss(8, 10)
    >>> h, t = torch.randn(4, 8), torch.tensor([1, 2, 3, -100])
    >>> want = torch.nn.functional.cross_entropy(loss_fn.linear(h), t)
    >>> torch.allclose(loss_fn(h, t), want, atol=1e-5)
    True
    """

    def __init__(self, in_features: int, num_classes: int, *, bias: bool = False, device=None, dtype=None,
                 reduction: str = "mean", weight: Optional[torch.Tensor] = None, ignore_index: Optional[int] = None,
                 label_smoothing: float = 0.0, chunk="auto", vocab_chunk=None, z_loss: float = 0.0,
                 softcap: Optional[float] = None, temperature: float = 1.0):
        super().__init__()
        if weight is not None and tuple(weight.shape) != (num_classes,):
            raise ValueError(f"LinearCrossEntropyLoss: weight must have shape ({num_classes},), "
                             f"got {tuple(weight.shape)}")
        self.linear = torch.nn.Linear(in_features, num_classes, bias=bias, device=device, dtype=dtype)
        self.register_buffer("weight", weight)
        self.num_classes = num_classes
        self.reduction, self.label_smoothing = reduction, label_smoothing
        self.ignore_index = -100 if ignore_index is None else ignore_index
        self.chunk, self.vocab_chunk = chunk, vocab_chunk
        self.z_loss, self.softcap, self.temperature = z_loss, softcap, temperature

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(input, self.linear.weight, target, self.linear.bias, chunk=self.chunk,
                                    vocab_chunk=self.vocab_chunk, ignore_index=self.ignore_index,
                                    reduction=self.reduction, label_smoothing=self.label_smoothing,
                                    z_loss=self.z_loss, softcap=self.softcap, temperature=self.temperature,
                                    class_weight=self.weight)

    def extra_repr(self) -> str:
        return (f"num_classes={self.num_classes}, ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, chunk={self.chunk!r}, vocab_chunk={self.vocab_chunk!r}")
