"""linear_cross_entropy: the loss of ``x @ weight.T (+ bias)`` in chunks of rows, never holding the logits.

Per chunk of rows: the chunk's logits (one matmul, in x's dtype), the cross-entropy kernel over
them with the gradient written in place (one read, one write: ``forward_grad``), then, where a
gradient is wanted, grad_x of the chunk's rows = dlogits @ W (one matmul over the whole vocabulary:
cuBLAS accumulates it in fp32 and rounds once) and grad_W += dlogits.T @ x_chunk, accumulated
across chunks in **float32**: a bf16 accumulator rounds every chunk's partial sum (others have
lost convergence to it). For "mean" and "sum" all of that happens in the forward, so the backward
never recomputes the logits: it scales the stored gradients by the upstream one (skipped on the
device when that is 1) and rounds grad_W to the weight's dtype. Three matmuls in all.

reduction="none" takes any per-row upstream gradient, which multiplies each row of dlogits before
the grad_W matmul: the forward keeps only the lse, and the backward recomputes each chunk's
logits (four matmuls in all).

Extra memory (beyond x, weight, target and the gradients themselves): one chunk of logits, chunk
x V in x's dtype (chunk="auto" keeps it within linear_plan.LINEAR_CHUNK_BYTES, 512 MiB, or grad_W's
bytes where they are more and the chunks accumulate grad_W), and the fp32
grad_W accumulator, V x H x 4 bytes (2.1 GB at 128256 x 4096), held from the forward to the
backward, where grad_W (V x H in the weight's dtype) is written from it; with an fp32 weight the
accumulator is grad_W itself, and where the rows make one chunk there is no accumulation to do
(grad_W is that chunk's one matmul, written in the weight's dtype). chunk="auto" therefore takes
all the rows as one chunk where that peak (all logits beside grad_W) is no higher than the
chunks' (``linear_plan.linear_chunk_rows``): three whole matmuls, no accumulator traffic. On CUDA the accumulation runs
inside cuBLAS (``aten::mm.dtype_out`` for the first chunk, ``aten::addmm.dtype_out`` after it:
bf16 operands, the fp32 output read and written in place with beta = 1), with no temporary and no
zero fill; where torch lacks those overloads, slices of dlogits are multiplied in fp32.

``vocab_chunk`` takes slices of the vocabulary over all the rows instead (``_VocabSlices``): no
V x H accumulator, four matmuls, extra memory one slice of logits and a float32 grad-x accumulator.
"""

from __future__ import annotations

from typing import Optional

import torch

from ... import _autocast, _buffers, _validate
from . import linear_plan, plan as planner
from .launch import count, kernels_take, launch_scale, needs_denom, reduce, row_options, rows_backward, rows_forward
from .shards import merge_shard_loss, merge_shard_stats, shard_loss, shard_stats
from .torch_path import RowTerms, compute_dtype, torch_denom
from .op import LOGIT_DTYPES, check_class_weight, check_options, check_target, check_targets_in_range, class_weights

# Rows of dlogits.T (vocabulary entries) multiplied at once in float32 where cuBLAS cannot
# accumulate bf16 products into an fp32 output itself.
FALLBACK_SLICE_ROWS = 8192

_MIXED_ADDMM: dict = {}


def accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool) -> None:
    """acc = a @ b (``first``) or acc += a @ b, accumulated in float32 whatever a's and b's dtype: a
    float32 acc with 16-bit a, b is accumulated in float32 across calls; an acc of a's dtype takes
    one product (one chunk: cuBLAS accumulates it in fp32 and rounds once)."""
    if acc.dtype == a.dtype:
        torch.mm(a, b, out=acc) if first else acc.addmm_(a, b)
        return
    if acc.is_cuda and _MIXED_ADDMM.get(acc.device, True):
        try:
            if first:
                torch.ops.aten.mm.dtype_out(a, b, torch.float32, out=acc)
            else:
                torch.ops.aten.addmm.dtype_out(acc, a, b, torch.float32, out=acc)
            _MIXED_ADDMM[acc.device] = True
            return
        except (RuntimeError, NotImplementedError):  # an older torch: no bf16 x bf16 -> fp32 matmul
            _MIXED_ADDMM[acc.device] = False
    b32 = b.float()
    for start in range(0, a.shape[0], FALLBACK_SLICE_ROWS):
        stop = min(start + FALLBACK_SLICE_ROWS, a.shape[0])
        if first:
            torch.mm(a[start:stop].float(), b32, out=acc[start:stop])
        else:
            acc[start:stop].addmm_(a[start:stop].float(), b32)


def _chunk_logits(x_chunk, weight, bias, out, vocab_parts):
    for lo, hi in vocab_parts:
        if bias is None:
            torch.mm(x_chunk, weight[lo:hi].t(), out=out[:, lo:hi])
        else:
            torch.addmm(bias[lo:hi], x_chunk, weight[lo:hi].t(), out=out[:, lo:hi])
    return out


def _chunk_loss(logits, target, class_weight, denom, loss_rows, lse_parts, options, write_grad, strategy):
    """The cross-entropy of one chunk's logits into its rows of loss_rows and lse_parts (2, rows: the
    lse and its rounding error); with ``write_grad`` the gradient over the logits (for an upstream
    gradient of 1)."""
    lse, lse_low = lse_parts
    ignore_index, reduction, label_smoothing, z_loss, softcap, temperature, return_lse = options
    chosen = planner.choose("forward_grad" if write_grad else "forward", logits.shape[0], logits.shape[1],
                            logits.dtype, logits.device, strategy, logits.stride(0), logits.stride(1),
                            **row_options(class_weight is not None, label_smoothing, softcap, z_loss, return_lse))
    planner.record(chosen)
    if chosen.strategy != "torch":
        rows_forward(chosen, logits, target, class_weight, denom, loss_rows, lse, lse_low, ignore_index, reduction,
                     label_smoothing, z_loss, softcap, temperature, return_lse)
        return
    terms = RowTerms(logits, target, class_weight, ignore_index, softcap, temperature)
    for part, value in zip(lse_parts, terms.lse()):
        part.copy_(value)
    loss = terms.loss(lse, lse_low, terms.target_logit(), terms.smoothing_sum() if label_smoothing > 0 else None,
                      label_smoothing)
    if reduction == "none":
        loss = loss + torch.where(terms.valid, z_loss * lse * lse, 0.0)
    loss_rows.copy_(loss)
    if write_grad:
        logits.copy_(terms.gradient(lse, lse_low, torch.ones(()), denom, reduction, label_smoothing, z_loss,
                                    softcap, temperature))


def _chunk_gradient(logits, target, class_weight, denom, lse_parts, grad, options, strategy, class_offset=0,
                    n_classes=None):
    """dlogits of one chunk over its logits, from the lse parts and the upstream gradient (0-d, or one
    a row); ``class_offset``, ``n_classes``: the logits are classes [class_offset, class_offset + cols)
    of n_classes (a vocabulary slice). The backward has one kernel: a forward strategy does not carry
    over, its "torch" does (as launch.BackwardCall's)."""
    lse, lse_low = lse_parts
    ignore_index, reduction, label_smoothing, z_loss, softcap, temperature, _ = options
    chosen = planner.choose("backward", logits.shape[0], logits.shape[1], logits.dtype, logits.device,
                            "torch" if strategy == "torch" else None, logits.stride(0), logits.stride(1))
    if chosen.strategy != "torch":
        rows_backward(chosen, logits, logits, target, class_weight, denom, lse, lse_low, grad, ignore_index,
                      reduction, label_smoothing, z_loss, softcap, temperature, class_offset, n_classes)
        return
    terms = RowTerms(logits, target, class_weight, ignore_index, softcap, temperature, class_offset, n_classes)
    logits.copy_(terms.gradient(lse, lse_low, grad, denom, reduction, label_smoothing, z_loss, softcap, temperature))


def _reduce_loss(loss_rows, lse, target, class_weight, denom, dtype, vocab, options):
    ignore_index, reduction, label_smoothing, z_loss = options[:4]
    if reduction == "none":
        return loss_rows
    if kernels_take(loss_rows, dtype):
        out = _buffers.empty((), dtype, loss_rows.device)
        reduce(loss_rows, lse, target, class_weight, denom, out, vocab, ignore_index, reduction, z_loss, False,
               label_smoothing)
        return out
    z_term = torch.where(target != ignore_index, z_loss * lse * lse, 0.0)
    total, total_z = loss_rows.sum(), z_term.sum()
    if reduction == "mean":
        total, total_z = total / denom[1], total_z / denom[0]
    return (total + total_z).to(dtype)


def zero_for_cpu_matmul(padding):
    """Zero a logits buffer's columns past its classes where torch's CPU bf16 matmul runs: it was
    seen reading a narrow operand's row past its last column (NaN padding made grad x NaN with a
    64 + 11 split). cuBLAS reads only a view's own columns, so CUDA buffers skip the fill."""
    if padding.device.type == "cpu":
        padding.zero_()


class _Pass:
    """One pass over the chunks; what it computes is set by its flags."""

    def __init__(self, x2, weight, bias, target, class_weight, options, chunk_rows, strategy):
        self.x2, self.weight, self.bias, self.target, self.class_weight = x2, weight, bias, target, class_weight
        self.options, self.chunk_rows, self.strategy = options, chunk_rows, strategy
        rows, vocab = x2.shape[0], weight.shape[0]
        self.chunks = [(start, min(start + chunk_rows, rows)) for start in range(0, rows, chunk_rows)]
        # The matmuls take the vocabulary in aligned parts, the logits buffer's rows padded (see
        # linear_plan.LINEAR_VOCAB_MULTIPLE); the kernels and the bias gradient take the V columns.
        self.vocab_parts = linear_plan.linear_vocab_parts(vocab)
        padded = _buffers.empty((min(chunk_rows, rows), linear_plan.linear_logits_width(vocab)), x2.dtype, x2.device)
        zero_for_cpu_matmul(padded[:, vocab:])
        self.logits = padded[:, :vocab]

    def grads(self, grad_x, grad_w, grad_b, start, stop, logits):
        x_chunk = self.x2[start:stop]
        if grad_x is not None:
            # The tail first, then the aligned part added in cuBLAS's fp32 (the larger sum rounded once).
            for i, (lo, hi) in enumerate(reversed(self.vocab_parts)):
                if i == 0:
                    torch.mm(logits[:, lo:hi], self.weight[lo:hi], out=grad_x[start:stop])
                else:
                    grad_x[start:stop].addmm_(logits[:, lo:hi], self.weight[lo:hi])
        if grad_w is not None:
            for lo, hi in self.vocab_parts:
                accumulate(grad_w[lo:hi], logits[:, lo:hi].t(), x_chunk, first=start == 0)
        if grad_b is not None:
            grad_b += logits.sum(0, dtype=grad_b.dtype)

    def forward(self, loss_rows, lse_parts, denom, grad_x, grad_w, grad_b):
        write_grad = grad_x is not None or grad_w is not None or grad_b is not None
        for start, stop in self.chunks:
            logits = _chunk_logits(self.x2[start:stop], self.weight, self.bias, self.logits[:stop - start],
                                   self.vocab_parts)
            _chunk_loss(logits, self.target[start:stop], self.class_weight, denom, loss_rows[start:stop],
                        lse_parts[:, start:stop], self.options, write_grad, self.strategy)
            self.grads(grad_x, grad_w, grad_b, start, stop, logits)

    def backward(self, lse_parts, denom, grad, grad_x, grad_w, grad_b):
        for start, stop in self.chunks:
            logits = _chunk_logits(self.x2[start:stop], self.weight, self.bias, self.logits[:stop - start],
                                   self.vocab_parts)
            _chunk_gradient(logits, self.target[start:stop], self.class_weight, denom, lse_parts[:, start:stop],
                            grad if grad.dim() == 0 else grad[start:stop], self.options, self.strategy)
            self.grads(grad_x, grad_w, grad_b, start, stop, logits)


def _gradient_buffers(x2, weight, bias, wanted, chunks):
    """grad x in x's dtype (each chunk's rows written once); grad W a float32 accumulator across
    several chunks, in the weight's dtype for one (its one matmul rounds once)."""
    want_x, want_w, want_b = wanted
    empty = _buffers.empty if chunks else (lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device))
    grad_x = empty(x2.shape, x2.dtype, x2.device) if want_x else None
    w_dtype = compute_dtype(weight.dtype) if chunks > 1 else weight.dtype
    grad_w = empty(weight.shape, w_dtype, weight.device) if want_w else None
    grad_b = torch.zeros(bias.shape, dtype=compute_dtype(bias.dtype), device=bias.device) if want_b else None
    return grad_x, grad_w, grad_b


def _denominators(target, class_weight, vocab, options, dtype, device):
    ignore_index, reduction, label_smoothing = options[:3]
    denom = _buffers.empty((3 if needs_denom(reduction, class_weight is not None, label_smoothing) else 0,),
                           compute_dtype(dtype), device)
    if denom.numel():
        if kernels_take(target, dtype):
            count(target, class_weight, denom, vocab, ignore_index, label_smoothing)
        else:
            torch_denom(target, class_weight, denom, vocab, ignore_index)
    return denom


def _forward(x2, weight, bias, target, class_weight, options, chunk_rows, strategy, wanted, loss_dtype):
    """(loss in ``loss_dtype``, lse parts (2, rows: the lse and its rounding error), denom, grads or
    None): grads computed in the forward when ``wanted`` asks for any and the reduction allows it
    (not "none")."""
    rows, vocab = x2.shape[0], weight.shape[0]
    reduction = options[1]
    denom = _denominators(target, class_weight, vocab, options, x2.dtype, x2.device)
    loss_rows = _buffers.empty((rows,), loss_dtype if reduction == "none" else compute_dtype(x2.dtype), x2.device)
    lse_parts = _buffers.empty((2, rows), compute_dtype(x2.dtype), x2.device)
    chunks = -(-rows // chunk_rows)
    grads = (_gradient_buffers(x2, weight, bias, wanted, chunks) if any(wanted) and reduction != "none"
             else (None,) * 3)
    if rows:
        _Pass(x2, weight, bias, target, class_weight, options, chunk_rows, strategy).forward(
            loss_rows, lse_parts, denom, *grads)
    loss = _reduce_loss(loss_rows, lse_parts[0], target, class_weight, denom, loss_dtype, vocab, options)
    return loss, lse_parts, denom, grads


def _scaled(grad, upstream, dtype):
    """grad (2-d) * upstream in ``dtype``: in place where grad has that dtype (skipped on the device
    for an upstream gradient of 1), else into a new tensor (the fp32 accumulator's one rounding)."""
    if grad.dtype == dtype:
        return launch_scale(grad, upstream)
    return launch_scale(grad, upstream, _buffers.empty(grad.shape, dtype, grad.device))


def _loss_and_lse(ctx, loss, lse):
    """A Function's outputs: the lse not differentiable, and no zeros made for its gradient (autograd
    would allocate and fill them every backward)."""
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)
    return loss, lse


class _LinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, target, class_weight, options, chunk_rows, strategy, loss_dtype):
        wanted = ctx.needs_input_grad[:3]
        loss, lse_parts, denom, grads = _forward(x2, weight, bias, target, class_weight, options, chunk_rows,
                                                 strategy, wanted, loss_dtype)
        ctx.options, ctx.chunk_rows, ctx.strategy, ctx.wanted = options, chunk_rows, strategy, wanted
        if options[1] == "none":
            ctx.save_for_backward(x2, weight, bias, target, class_weight, lse_parts, denom)
        else:
            ctx.save_for_backward(*grads)
        ctx.dtypes = (x2.dtype, weight.dtype, bias.dtype if bias is not None else None)
        return _loss_and_lse(ctx, loss, lse_parts[0])

    @staticmethod
    def backward(ctx, dloss, _dlse):
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        if ctx.options[1] == "none":
            x2, weight, bias, target, class_weight, lse_parts, denom = ctx.saved_tensors
            grads = _gradient_buffers(x2, weight, bias, ctx.wanted, -(-x2.shape[0] // ctx.chunk_rows))
            _Pass(x2, weight, bias, target, class_weight, ctx.options, ctx.chunk_rows, ctx.strategy).backward(
                lse_parts, denom, dloss, *grads)
            upstream = torch.ones((), device=dloss.device)
        else:
            grads = ctx.saved_tensors
            upstream = dloss
        grad_x, grad_w, grad_b = grads
        grad_x = _scaled(grad_x, upstream, x_dtype) if grad_x is not None else None
        grad_w = _scaled(grad_w, upstream, w_dtype) if grad_w is not None else None
        grad_b = (grad_b * upstream.to(grad_b.dtype)).to(b_dtype) if grad_b is not None else None
        return grad_x, grad_w, grad_b, None, None, None, None, None, None


class _VocabSlices:
    """linear_cross_entropy by slices of the vocabulary, every row at once (``vocab_chunk``).

    Forward: each slice's logits (one matmul), reduced by the kernels to four numbers a row (the
    slice's (m, d), smoothing sum and target logit: the vocabulary-parallel loss's statistics, a
    slice standing for a rank), merged in slice order into the lse and the loss. Nothing but the
    lse (and its rounding error) is kept for the backward. Backward: each slice's logits again,
    the gradient over them in place (softmax with the global lse, the upstream gradient applied
    in the same pass: 0-d or one a row), then grad_W of the slice's classes = dlogits^T x (one
    matmul over all the rows: float32 inside cuBLAS, rounded once, no accumulator) and grad_x +=
    dlogits W_slice in a float32 accumulator of grad_x's shape. Four matmuls; extra memory is one
    slice of logits (rows x vocab_chunk) and the grad_x accumulator, not V x H."""

    def __init__(self, x2, weight, bias, target, class_weight, options, vocab_chunk, strategy):
        self.x2, self.weight, self.bias, self.target, self.class_weight = x2, weight, bias, target, class_weight
        self.options, self.strategy = options, strategy
        vocab = self.vocab = weight.shape[0]
        self.slices = [(lo, min(lo + vocab_chunk, vocab)) for lo in range(0, vocab, vocab_chunk)]
        self.triton = strategy != "torch" and kernels_take(x2)
        width = linear_plan.linear_logits_width(vocab_chunk)
        self.padded = _buffers.empty((x2.shape[0], width), x2.dtype, x2.device)
        # Past a slice's classes: here for the full slices, in logits() for a narrower last one.
        zero_for_cpu_matmul(self.padded[:, vocab_chunk:])
        self.vocab_chunk = vocab_chunk

    def logits(self, lo, hi):
        """The logits of classes [lo, hi) over all the rows, in the padded buffer."""
        out = self.padded[:, :hi - lo]
        if hi - lo < self.vocab_chunk:  # the last slice, after full ones that wrote past its classes
            zero_for_cpu_matmul(self.padded[:, hi - lo:])
        bias = None if self.bias is None else self.bias[lo:hi]
        return _chunk_logits(self.x2, self.weight[lo:hi], bias, out, linear_plan.linear_vocab_parts(hi - lo))

    def forward(self, denom, loss_dtype):
        """(loss in ``loss_dtype``, lse, lse_low) of every row."""
        read_ignored = self.options[6]  # return_lse: the lse of ignored rows too
        stats = torch.stack([shard_stats(self.logits(lo, hi), self.target, self.class_weight, lo, self.vocab,
                                         self.options[:6], self.triton, read_ignored) for lo, hi in self.slices])
        if self.triton and self.target.numel():
            loss, lse, lse_low, _ = merge_shard_loss(stats, self.target, self.class_weight, self.vocab, self.options,
                                                     loss_dtype, denom)
            return loss, lse, lse_low
        lse, lse_low, s, y_t = merge_shard_stats(stats)
        loss = shard_loss(lse, lse_low, s, y_t, self.target, self.class_weight, denom, self.vocab, self.options,
                          loss_dtype)
        return loss, lse, lse_low

    def backward(self, lse, lse_low, denom, grad, wanted):
        """(grad x, grad weight, grad bias), None where not ``wanted``, for the upstream gradient ``grad``."""
        x2, weight, bias = self.x2, self.weight, self.bias
        want_x, want_w, want_b = wanted
        grad_x = _buffers.empty(x2.shape, compute_dtype(x2.dtype), x2.device) if want_x else None
        grad_w = _buffers.empty(weight.shape, weight.dtype, weight.device) if want_w else None
        grad_b = _buffers.empty(bias.shape, compute_dtype(bias.dtype), bias.device) if want_b else None
        for i, (lo, hi) in enumerate(self.slices):
            logits = self.logits(lo, hi)
            _chunk_gradient(logits, self.target, self.class_weight, denom, (lse, lse_low), grad, self.options,
                            self.strategy, lo, self.vocab)
            for j, (a, b) in enumerate(linear_plan.linear_vocab_parts(hi - lo)):
                if want_w:
                    torch.mm(logits[:, a:b].t(), x2, out=grad_w[lo + a:lo + b])
                if want_x:
                    accumulate(grad_x, logits[:, a:b], weight[lo + a:lo + b], first=i == 0 and j == 0)
            if want_b:
                torch.sum(logits, 0, dtype=grad_b.dtype, out=grad_b[lo:hi])
        return (None if grad_x is None else grad_x.to(x2.dtype), grad_w,
                None if grad_b is None else grad_b.to(bias.dtype))


class _VocabSlicedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, target, class_weight, options, vocab_chunk, strategy, loss_dtype):
        denom = _denominators(target, class_weight, weight.shape[0], options, x2.dtype, x2.device)
        loss, lse, lse_low = _VocabSlices(x2, weight, bias, target, class_weight, options, vocab_chunk,
                                          strategy).forward(denom, loss_dtype)
        ctx.save_for_backward(x2, weight, bias, target, class_weight, lse, lse_low, denom)
        ctx.config = (options, vocab_chunk, strategy)
        return _loss_and_lse(ctx, loss, lse)

    @staticmethod
    def backward(ctx, dloss, _dlse):
        x2, weight, bias, target, class_weight, lse, lse_low, denom = ctx.saved_tensors
        slices = _VocabSlices(x2, weight, bias, target, class_weight, *ctx.config)
        grads = slices.backward(lse, lse_low, denom, dloss, ctx.needs_input_grad[:3])
        return (*grads, None, None, None, None, None, None)


def _slice_classes(x2, weight, vocab_chunk):
    """The classes a vocabulary slice takes, or None where the call takes chunks of rows."""
    if vocab_chunk is None or not x2.shape[0]:
        return None
    return linear_plan.linear_vocab_chunk(x2.shape[0], weight.shape[0], x2.dtype, vocab_chunk)


def _chunk_rows(x2, weight, chunk, accumulates_weight: bool) -> int:
    return linear_plan.linear_chunk_rows(x2.shape[0], weight.shape[0], x2.shape[1], x2.dtype, accumulates_weight, chunk)


def _loss(x2, weight, bias, target, class_weight, options, chunk, vocab_chunk, strategy, loss_dtype):
    """(loss in ``loss_dtype``, lse parts (2, rows: the lse and its rounding error), denom) without
    gradients."""
    slice_classes = _slice_classes(x2, weight, vocab_chunk)
    if slice_classes is not None:
        denom = _denominators(target, class_weight, weight.shape[0], options, x2.dtype, x2.device)
        loss, lse, lse_low = _VocabSlices(x2, weight, bias, target, class_weight, options, slice_classes,
                                          strategy).forward(denom, loss_dtype)
        return loss, torch.stack((lse, lse_low)), denom
    chunk_rows = _chunk_rows(x2, weight, chunk, False)
    return _forward(x2, weight, bias, target, class_weight, options, chunk_rows, strategy, (False,) * 3,
                    loss_dtype)[:3]


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, *, chunk="auto", vocab_chunk=None,
                         ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                         softcap: Optional[float] = None, temperature: float = 1.0,
                         class_weight: Optional[torch.Tensor] = None, return_lse: bool = False,
                         strategy: Optional[str] = None):
    """Cross-entropy of ``x @ weight.T (+ bias)`` against class indices, without materializing the logits.

    The same loss as ``cross_entropy(x @ weight.T + bias, target, ...)`` (see
    :func:`onlinesoftmax.cross_entropy` for the options), computed a chunk of rows at a time: at
    most one chunk of logits exists at once, and for "mean" and "sum" the gradients of x, weight and
    bias are computed in the forward from each chunk's in-place logit gradient, so that the backward
    does not recompute the logits.

    Parameters
    ----------
    x : Tensor
        (..., H) hidden states, float32, float16 or bfloat16, or float64 (torch's kernels for the
        loss, in float64), on CUDA or CPU.
    weight : Tensor
        (V, H) output projection (``torch.nn.Linear(H, V).weight``), x's dtype.
    target : Tensor
        ``x.shape[:-1]`` int64 or int32 class indices in [0, V), or ``ignore_index``.
    bias : Tensor, optional
        (V,), x's dtype.
    chunk : "auto" or int
        Rows per chunk. "auto": the most rows whose logits take at most 512 MiB (2048 rows at
        V = 128256 in bf16), or grad weight's bytes where chunks accumulate it in float32 and
        that is more (4096 rows at V = 128256, H = 4096), in multiples of 128; or all rows at
        once where that peaks no higher than chunks with their float32 grad-weight accumulator
        (8192 rows at V = 128256, H = 4096 in bf16). An int forces it.
    class_weight : Tensor, optional
        (V,) per-class weights: ``cross_entropy``'s ``weight`` (renamed: ``weight`` is the projection).
    ignore_index, reduction, label_smoothing, z_loss, softcap, temperature, return_lse
        As :func:`onlinesoftmax.cross_entropy`.
    strategy : str, optional
        Expert/testing override of the chunks' cross-entropy kernel.

    Returns
    -------
    Tensor, or (Tensor, Tensor) with ``return_lse``
        The loss in x's dtype (0-d, or ``target.shape`` for "none"), and the lse per row in float32
        (float64 for float64 x). Inside an autocast region, as torch's ``linear`` then
        ``cross_entropy``: x, weight and bias are taken in the region's dtype (gradients return in
        their own) and the loss is float32.

    Notes
    -----
    Gradients: grad_x per chunk is one matmul over the whole vocabulary (fp32 inside cuBLAS, rounded
    once); grad_weight and grad_bias accumulate across chunks in float32 and are rounded to their
    dtype once, in the backward. Extra memory: one chunk of logits plus the fp32 grad_weight
    accumulator (V x H x 4 bytes; none beyond the gradient for an fp32 weight): see the module
    docstring; ``vocab_chunk`` trades a fourth matmul for that accumulator. "none" recomputes the
    logits in the backward (4 matmuls instead of 3). The backward may run once. Traceable by
    ``torch.compile(fullgraph=True)``, dynamic dims included: the compiled call is two custom ops,
    the eager call's chunks and matmuls; for "mean" and "sum" it rounds grad_weight to the weight's
    dtype in the forward (the compiler must know the gradients' dtypes before the plan counts the
    chunks), so an upstream gradient other than 1 rounds it twice, as the eager call's one chunk does.

    Raises
    ------
    TypeError, ValueError
        As :func:`onlinesoftmax.cross_entropy`; also mismatched H, dtypes or devices, a bad ``chunk``.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> x, w = torch.randn(4, 8), torch.randn(10, 8)
    >>> t = torch.tensor([1, 2, 3, -100])
    >>> torch.allclose(onlinesoftmax.linear_cross_entropy(x, w, t, chunk=2),
    ...                torch.nn.functional.cross_entropy(x @ w.T, t), atol=1e-5)
    True
    """
    options = (chunk, vocab_chunk, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature,
               class_weight, return_lse, strategy)
    if _autocast.active_for(x):
        # torch's x @ weight.T + bias in the region's dtype, and its cross_entropy in float32 (see _autocast).
        x, weight, bias = _autocast.lower_precision(x.device.type, x, weight, bias)
        with _autocast.off(x.device.type):
            return _linear_cross_entropy(x, weight, target, bias, *options, x.dtype in _autocast.HALF)
    return _linear_cross_entropy(x, weight, target, bias, *options, False)


def _linear_cross_entropy(x, weight, target, bias, chunk, vocab_chunk, ignore_index, reduction, label_smoothing,
                          z_loss, softcap, temperature, class_weight, return_lse, strategy, float32_loss):
    name = "linear_cross_entropy"
    for arg, t in (("x", x), ("weight", weight)):
        _validate.tensor(t, name, arg)
        _validate.float_dtype(t, name, LOGIT_DTYPES)
        _validate.device(t, name)
    if x.dim() == 0 or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"{name}: x must be (..., H) and weight (V, H) with the same H, got x {tuple(x.shape)} "
                         f"and weight {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"{name}: weight must have x's dtype ({_validate.dtype_name(x.dtype)}), got "
                        f"{_validate.dtype_name(weight.dtype)}; cast it (as autocast would)")
    _validate.same_device(name, x=x, weight=weight)
    vocab = weight.shape[0]
    if vocab == 0:
        raise ValueError(f"{name}: weight must have at least one row (class)")
    check_target(x, target, name)
    if bias is not None:
        _validate.tensor(bias, name, "bias")
        if bias.shape != (vocab,) or bias.dtype != x.dtype:
            raise ValueError(f"{name}: bias must be ({vocab},) in x's dtype, got {tuple(bias.shape)} {bias.dtype}")
        _validate.same_device(name, x=x, bias=bias)
    softcap = check_options(name, ignore_index, reduction, label_smoothing, z_loss, softcap, temperature)
    check_class_weight(class_weight, vocab, x, name, "class_weight")
    class_weight = class_weights(class_weight)
    if chunk != "auto":
        if _validate.integer(chunk, name, "chunk") < 1:
            raise ValueError(f"{name}: chunk must be 'auto' or a positive int, got {chunk}")
    if vocab_chunk is not None:
        if vocab_chunk != "auto" and _validate.integer(vocab_chunk, name, "vocab_chunk") < 1:
            raise ValueError(f"{name}: vocab_chunk must be None, 'auto' or a positive int, got {vocab_chunk}")
        if chunk != "auto":
            raise ValueError(f"{name}: chunk (rows a chunk) and vocab_chunk (classes a slice) exclude each other; "
                             f"got chunk={chunk} and vocab_chunk={vocab_chunk}")
    check_targets_in_range(target, vocab, ignore_index, name)
    x2 = x.reshape(target.numel(), x.shape[-1])
    t1 = target.reshape(-1)
    options = (ignore_index, reduction, float(label_smoothing), float(z_loss), softcap, float(temperature), return_lse)
    tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if torch.compiler.is_compiling():
        codes = _plan_codes(chunk, vocab_chunk)
        if tracked:
            loss, lse = _TracedLinearFunction.apply(x2, weight, bias, t1, class_weight, options, *codes, strategy,
                                                    float32_loss)
        else:
            loss, lse_parts = _traced_forward_op(x2, weight, bias, t1, class_weight, *options, *codes, strategy,
                                                 False, False, False, float32_loss)[:2]
            lse = lse_parts[0]
        return _shaped(loss, lse, target, reduction, return_lse)
    loss_dtype = torch.float32 if float32_loss else x.dtype
    if not tracked:
        loss, lse_parts, _ = _loss(x2, weight, bias, t1, class_weight, options, chunk, vocab_chunk, strategy,
                                   loss_dtype)
        lse = lse_parts[0]
    elif vocab_chunk is not None and x2.shape[0]:
        loss, lse = _VocabSlicedFunction.apply(x2, weight, bias, t1, class_weight, options,
                                               _slice_classes(x2, weight, vocab_chunk), strategy, loss_dtype)
    else:
        chunk_rows = _chunk_rows(x2, weight, chunk, weight.requires_grad and compute_dtype(weight.dtype) != weight.dtype)
        loss, lse = _LinearCrossEntropyFunction.apply(x2, weight, bias, t1, class_weight, options, chunk_rows,
                                                      strategy, loss_dtype)
    return _shaped(loss, lse, target, reduction, return_lse)


def _shaped(loss, lse, target, reduction, return_lse):
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return (loss, lse.reshape(target.shape)) if return_lse else loss


# The traced call's custom ops need the functions above (their module imports this one's names).
from .linear_compile import _TracedLinearFunction, _plan_codes, _traced_forward_op  # noqa: E402
