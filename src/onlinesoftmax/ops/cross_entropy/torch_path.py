"""cross_entropy's arithmetic in torch ops: the path for CPU tensors without Triton (float32, or
float64 for float64 logits), for float64 logits on CUDA, ``strategy="torch"``, and a vocabulary
shard's statistics and gradient (``class_offset``) where the kernels do not run. The kernels'
conventions throughout: an out-of-range target's row is NaN, an ignored row's gradient is 0.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from ... import cpu


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the arithmetic runs in: float32, or float64 for float64 logits (torch's own kernels then,
    at torch's precision)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def transformed(x: torch.Tensor, softcap: float, temperature: float) -> torch.Tensor:
    """softcap(x) / T in float32 (float64 for float64 x); x itself when it already has that dtype and
    there is nothing to apply (no copy)."""
    y = x.to(compute_dtype(x.dtype))
    if softcap > 0:
        y = softcap * torch.tanh(y / softcap)
    return y * (1.0 / temperature) if temperature != 1.0 else y


def row_lse(y: torch.Tensor, dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lse, lse_low) per row with cross-entropy's conventions: a row holding +inf or NaN gives NaN
    (torch.logsumexp gives +inf for +inf), an all -inf row -inf; lse_low is the lse's rounding error
    (0 where the lse is not finite), as the kernels give. In ``dtype`` (y's by default).

    d = 1 / p(argmax), from torch's fused softmax: one pass where sub, exp and sum are three (on the
    CPU machine 0.25 against 0.41 ms a million float32 logits). Its float32 sum is torch's own
    log_softmax's: log d within about 2e-6 over 32000 logits (float64 reference), the pair
    (lse, lse_low) within 4e-6 at logits near 12345, where the float32 lse alone is 5e-4 off."""
    dtype = dtype or y.dtype
    if y.shape[-1] == 0:
        return row_normalizer(y, dtype)[0], torch.zeros(y.shape[:-1], dtype=dtype, device=y.device)
    m = y.amax(-1).to(dtype)  # exact in y's dtype
    log_d = torch.where(m == -math.inf, -math.inf, -torch.log(torch.softmax(y, -1, dtype=dtype).amax(-1)))
    return m + log_d, cpu.split_lse(m, log_d)[1]


def row_normalizer(y: torch.Tensor, dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, d) per row of y, with the kernels' conventions (an all -inf or empty row is (-inf, 0)),
    in ``dtype`` (y's by default)."""
    dtype = dtype or y.dtype
    if y.shape[-1] == 0:
        return (torch.full(y.shape[:-1], -math.inf, dtype=dtype, device=y.device),
                torch.zeros(y.shape[:-1], dtype=dtype, device=y.device))
    m = y.amax(-1).to(dtype)  # exact in y's dtype
    ref = torch.where(m == -math.inf, torch.zeros_like(m), m)
    # The exponential in place: one temporary of y's size, not two (the difference is made in dtype
    # by type promotion, without a copy of y).
    return m, torch.sub(y, ref.unsqueeze(-1)).exp_().sum(-1)


def torch_denom(target, weight, denom, n_classes, ignore_index):
    """denom <- (valid rows, sum of their targets' weights, sum of all class weights), if it has room."""
    if denom.numel():
        valid = target != ignore_index
        n_valid = valid.sum().to(denom.dtype)
        if weight is None:
            # full_like, not a tensor from a Python number: that copy from the host synchronizes.
            denom.copy_(torch.stack([n_valid, n_valid, torch.full_like(n_valid, n_classes)]))
        else:
            w = weight.to(denom.dtype)
            w_t = torch.where(valid, w[torch.where(valid, target, 0).clamp(0, n_classes - 1)], 0.0)
            denom.copy_(torch.stack([n_valid, w_t.sum(), w.sum()]))
    return denom


def row_losses(lse, lse_low, y_t, s, w_t, w_sum, n_classes, label_smoothing, valid, bad):
    """The rows' losses in torch ops, as the kernels' ``row_loss`` computes them: from each row's lse
    and its rounding error lse_low, target logit y_t, the smoothing sum s of its (weighted) logits,
    the target's weight w_t and the classes' w_sum. 0 where ``valid`` is False (ignored rows), NaN
    where ``bad`` (a target out of range)."""
    loss = (1.0 - label_smoothing) * w_t * ((lse - y_t) + lse_low)
    if label_smoothing > 0:
        loss = loss + label_smoothing * ((w_sum * lse - s) + w_sum * lse_low) / n_classes
    return torch.where(bad, math.nan, torch.where(valid, loss, 0.0))


class RowTerms:
    """What the loss and the gradient of a row need besides its logits: y (float32 transformed
    logits, made when first used), valid (not ignored), bad (target out of range), in_shard (the
    target among x's columns), local (its column there, 0 elsewhere), w_t, W and the columns' weights.

    The gradient of a whole row (not a vocabulary shard) takes its probabilities from torch's fused
    softmax (one pass where sub, sub and exp are three: on CPU 0.20 against 0.39 ms a million
    float32 logits), a shard's from the global lse.
    """

    def __init__(self, x, target, weight, ignore_index, softcap, temperature, class_offset=0, n_classes=None):
        n_classes = x.shape[1] if n_classes is None else n_classes
        self.x, self.softcap, self.temperature = x, softcap, temperature
        self.dtype = compute_dtype(x.dtype)
        self.plain = softcap == 0 and temperature == 1.0  # y is x in self.dtype
        self.whole = class_offset == 0 and n_classes == x.shape[1]
        self.valid = target != ignore_index
        self.bad = self.valid & ((target < 0) | (target >= n_classes))
        local = target - class_offset
        self.in_shard = self.valid & ~self.bad & (local >= 0) & (local < x.shape[1])
        self.local = torch.where(self.in_shard, local, 0)
        self.n_classes = n_classes
        if weight is None:
            self.w_t, self.w_sum, self.w_cols = (torch.ones(x.shape[0], dtype=self.dtype, device=x.device),
                                                 float(n_classes), 1.0)
        else:
            w = weight.to(self.dtype)
            self.w_t = w[torch.where(self.valid & ~self.bad, target, 0)]
            self.w_sum = w.sum()
            self.w_cols = w[class_offset:class_offset + x.shape[1]]

    @functools.cached_property
    def y(self) -> torch.Tensor:
        return transformed(self.x, self.softcap, self.temperature)

    def _logits(self) -> torch.Tensor:
        """y, or x itself where y is x in float32 (the ops below convert as they read)."""
        return self.x if self.plain else self.y

    def lse(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(lse, lse_low) of each row, as row_lse."""
        return row_lse(self._logits(), self.dtype)

    def target_logit(self) -> torch.Tensor:
        if self.x.shape[1] == 0:
            return torch.full((self.x.shape[0],), -math.inf, dtype=self.dtype, device=self.x.device)
        y_t = self._logits().gather(1, self.local.unsqueeze(1)).squeeze(1).to(self.dtype)
        return torch.where(self.in_shard, y_t, -math.inf)

    def smoothing_sum(self) -> torch.Tensor:
        if isinstance(self.w_cols, float):
            return self._logits().sum(-1, dtype=self.dtype)
        # Not y @ w: BLAS blocks a matrix-vector product by the rows it is given, so a row's sum
        # would change with the row chunk it came in (cpu.row_chunks); a row's own reduction does not.
        return (self.y * self.w_cols).sum(-1)

    def loss(self, lse, lse_low, y_t, s, label_smoothing):
        return row_losses(lse, lse_low, y_t, s, self.w_t, self.w_sum, self.n_classes, label_smoothing, self.valid,
                          self.bad)

    def gradient(self, lse, lse_low, grad, denom, reduction, label_smoothing, z_loss, softcap, temperature):
        upstream = grad.to(device=self.x.device, dtype=self.dtype)
        scale = scale_z = upstream
        if reduction == "mean":
            scale, scale_z = upstream / denom[1], upstream / denom[0]
        b = scale * (1.0 - label_smoothing) * self.w_t
        e = scale * label_smoothing / self.n_classes
        a = b + e * self.w_sum if label_smoothing > 0 else b
        if z_loss > 0:
            a = a + 2.0 * z_loss * lse * scale_z
        # In place after the one new tensor: about as many passes as torch's own log_softmax backward.
        # A whole row's probabilities are torch's softmax (the same normalizer as the lse, computed
        # again in one pass); a shard's come from the global lse, kept in two floats.
        if self.whole:
            g = torch.softmax(self._logits(), -1, dtype=self.dtype)
        else:
            g = torch.sub(self.y, lse.unsqueeze(1)).sub_(lse_low.unsqueeze(1)).exp_()
        g.mul_(a.unsqueeze(1))
        if self.x.shape[1]:
            g.scatter_add_(1, self.local.unsqueeze(1), -(b * self.in_shard).unsqueeze(1))
        if label_smoothing > 0:
            e = e.unsqueeze(-1) if torch.is_tensor(e) and e.dim() else e
            g.sub_(e * self.w_cols if torch.is_tensor(self.w_cols) else e)
        if softcap > 0:
            th = self.y * (temperature / softcap)
            g.mul_(th.mul_(th).neg_().add_(1.0))
        if temperature != 1.0:
            g.div_(temperature)
        # A CPU tensor's row masks are read on the host for free (a GPU's would synchronize): each
        # fill is a pass over the gradient, 9 ms a step at bf16 512 x 50257 on the CPU machine.
        on_cpu = g.device.type == "cpu"
        if not on_cpu or not bool(self.valid.all()):
            g.masked_fill_(~self.valid.unsqueeze(1), 0.0)
        if not on_cpu or bool(self.bad.any()):
            g.masked_fill_(self.bad.unsqueeze(1), math.nan)
        return g


def torch_forward(x, target, weight, denom, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
                  inplace, loss_dtype=None):
    torch_denom(target, weight, denom, x.shape[1], ignore_index)
    weight = None if weight is None else weight.to(compute_dtype(x.dtype))  # once, not a chunk
    losses, z_terms, lses, lows = [], [], [], []
    for rows in cpu.row_chunks(x):
        terms = RowTerms(x[rows], target[rows], weight, ignore_index, softcap, temperature)
        lse, lse_low = terms.lse()
        losses.append(terms.loss(lse, lse_low, terms.target_logit(),
                                 terms.smoothing_sum() if label_smoothing > 0 else None, label_smoothing))
        z_terms.append(torch.where(terms.valid, z_loss * lse * lse, 0.0))
        lses.append(lse)
        lows.append(lse_low)
        if inplace:
            x[rows].copy_(terms.gradient(lse, lse_low, torch.ones(()), denom, reduction, label_smoothing, z_loss,
                                         softcap, temperature))
    loss, z_term, lse, lse_low = (t[0] if len(t) == 1 else torch.cat(t) for t in (losses, z_terms, lses, lows))
    loss_dtype = loss_dtype or x.dtype
    if reduction == "none":
        return (loss + z_term).to(loss_dtype), lse, lse_low, denom
    total, total_z = loss.sum(), z_term.sum()
    if reduction == "mean":
        total, total_z = total / denom[1], total_z / denom[0]
    return (total + total_z).to(loss_dtype), lse, lse_low, denom


def torch_backward(x, target, weight, denom, lse, lse_low, grad, ignore_index, reduction, label_smoothing, z_loss,
                   softcap, temperature, class_offset=0, n_classes=None):
    chunks = cpu.row_chunks(x)
    weight = None if weight is None else weight.to(compute_dtype(x.dtype))  # once, not a chunk
    out = None if len(chunks) == 1 else torch.empty_like(x)
    for rows in chunks:
        terms = RowTerms(x[rows], target[rows], weight, ignore_index, softcap, temperature, class_offset, n_classes)
        g = terms.gradient(lse[rows], lse_low[rows], grad[rows] if grad.dim() else grad, denom, reduction,
                           label_smoothing, z_loss, softcap, temperature)
        if out is None:
            return g.to(x.dtype)
        out[rows] = g
    return out
