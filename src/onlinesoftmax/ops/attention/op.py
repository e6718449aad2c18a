"""Flash attention (Dao et al., 2022): custom ops for torch.compile, autograd, the public function.

See ``kernels.py`` for the algorithm and the memory traffic, ``plan.py`` for the block sizes.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from ... import _autocast, _validate
from ..._device import remember
from ..._launch import op_when_compiling
from .launch import launch_backward, launch_forward

# --------------------------------------------------------------------------------------------
# Custom ops: torch.compile sees opaque forward and backward ops with shape-only fakes
# --------------------------------------------------------------------------------------------

@torch.library.custom_op("onlinesoftmax::attention_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_forward(q, k, v, mode, scale)


@_forward_op.register_fake
def _(q, k, v, mode, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("onlinesoftmax::attention_backward", mutates_args=())
def _backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, mode: str, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_backward(do, q, k, v, out, lse, mode, scale)


@_backward_op.register_fake
def _(do, q, k, v, out, lse, mode, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_forward = op_when_compiling(_forward_op, launch_forward)
_backward = op_when_compiling(_backward_op, launch_backward)


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mode, scale):
        out, lse = _forward(q, k, v, mode, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (mode, scale)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # else autograd allocates and fills zeros for lse's gradient every backward
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse = ctx.saved_tensors
        mode, scale = ctx.config
        dq, dk, dv = _backward(d_out, q, k, v, out, lse, mode, scale)
        return dq, dk, dv, None, None


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------

CAUSAL_MODES = ("top_left", "bottom_right")
# Any head dim in this range runs (plan.py pads it). 256 is SDPA FLASH's limit too; below 8 the GPU
# tests found a gradient at 1.2% error at D1 (bf16's 1% bound), and no model has such heads.
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256
# The head dims whose launch plans were swept on the GPU (plan.py); the others take the rows above them.
TUNED_HEAD_DIMS = (32, 64, 80, 96, 128, 192, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_BATCH_HEADS = 65535


def _causal_mode(causal, name: str = "attention") -> str:
    if causal is False or causal is None:
        return "none"
    if causal is True:
        return "top_left"
    if isinstance(causal, str) and causal in CAUSAL_MODES:
        return causal
    raise ValueError(f"{name}: causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")


# Argument signatures validate() accepted, with its answer: the checks depend only on these (a
# repeated call, as a training or serving loop makes, skips them).
_CHECKED: dict = {}


def validate(q, k, v, causal, scale, name: str = "attention"):
    """Check attention arguments; returns (mode, scale). Shared with distributed.attention."""
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: {arg} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{name}: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} runs in float16 and bfloat16 (fp32 accumulation inside); got {q.dtype}: "
                        "cast the inputs with .to(torch.bfloat16) or .half(), or use "
                        "torch.nn.functional.scaled_dot_product_attention for this dtype")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{name} runs on CUDA and CPU tensors, got a tensor on {q.device}")
    if k.shape != v.shape:
        raise ValueError(f"{name}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{name}: batch sizes differ: q has {q.shape[0]}, k and v have {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"{name}: head dims differ: q has {q.shape[3]}, k and v have {k.shape[3]}")
    if not MIN_HEAD_DIM <= q.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head dim {q.shape[3]} is not supported: {MIN_HEAD_DIM} to {MAX_HEAD_DIM} "
                         "(pad q, k and v with zeros along the head dim)")
    n_heads_q, n_heads_kv = q.shape[1], k.shape[1]
    if n_heads_kv == 0 or n_heads_q % n_heads_kv:
        raise ValueError(f"{name}: the query heads ({n_heads_q}) must be a multiple of the key/value heads "
                         f"({n_heads_kv}) for grouped-query attention")
    if q.shape[0] * n_heads_q > MAX_BATCH_HEADS:
        # batch x heads is the grid's second axis (CUDA caps it at 65535); the first axis, query
        # blocks, keeps the programs that share a head's K and V adjacent for the L2.
        raise ValueError(f"{name}: batch x query heads = {q.shape[0] * n_heads_q} exceeds {MAX_BATCH_HEADS}; "
                         "split the batch into several calls")
    mode = _causal_mode(causal, name)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[3])
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{name}: scale must be a real number or None, got {type(scale).__name__}")
    if not (_validate.finite(scale) and scale > 0):
        raise ValueError(f"{name}: scale must be finite and > 0, got {scale!r}")
    return mode, float(scale)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: Union[bool, str] = False,
              scale: Optional[float] = None, return_lse: bool = False):
    """Scaled dot-product attention in one pass over the keys (FlashAttention, Dao et al., 2022, arXiv:2205.14135).

    ``out = softmax(scale * q @ k^T + mask) @ v`` without forming the score matrix.

    Parameters
    ----------
    q : Tensor, shape (B, Hq, Sq, D)
    k, v : Tensor, shape (B, Hkv, Sk, D)
        float16 or bfloat16, CUDA or CPU, any strides (the SDPA layout; a (B, S, H, D) tensor
        viewed with ``.transpose(1, 2)`` is read in place). ``Hq`` must be a multiple of ``Hkv``
        (grouped-query attention; ``Hkv = 1`` is multi-query). ``D`` from 8 to 256 (launch plans
        measured at 32, 64, 80, 96, 128, 144, 160, 192 and 256; other dims take the next one's,
        their blocks padded to a power of two or the dim computed as two: ``plan.py``). ``Sq`` and
        ``Sk`` may differ and take any value, 0 included.
    causal : bool or {"top_left", "bottom_right"}
        ``False``: no mask. ``True`` or ``"top_left"``: query ``i`` sees keys ``j <= i``, as SDPA's
        ``is_causal`` (the mask ``tril(ones(Sq, Sk))``). ``"bottom_right"``: query ``i`` sees keys
        ``j <= i + Sk - Sq``, the queries being the last ``Sq`` positions of the sequence (decoding
        with a KV cache: ``Sq = 1`` sees every key). The two agree when ``Sq == Sk``.
    scale : float, optional
        Multiplies ``q @ k^T``; finite and > 0; ``1 / sqrt(D)`` by default.
    return_lse : bool
        Also return the natural-log log-sum-exp of each query row's scaled, masked scores.

    Returns
    -------
    out : Tensor, shape (B, Hq, Sq, D), dtype of ``q`` (inside an autocast region, q, k and v are
        taken in the region's dtype first, as ``scaled_dot_product_attention`` takes them), contiguous
    lse : Tensor, shape (B, Hq, Sq), float32 (only with ``return_lse=True``)
        ``log(sum_j exp(scale * q_i . k_j))`` over the visible keys: two attentions over disjoint
        key sets merge as ``out = w_a out_a + w_b out_b``, ``w_x = exp(lse_x - logaddexp(lse_a, lse_b))``.
        Not differentiable (its gradient is taken as zero).

    Notes
    -----
    A query row with no visible key (``"bottom_right"`` with ``Sq > Sk`` for the first ``Sq - Sk``
    rows, or ``Sk = 0``) gives an output row of zeros, an ``lse`` of ``-inf`` and zero gradients,
    never NaN (SDPA returns NaN there on some backends). Accumulation and softmax statistics are
    fp32. Differentiable through Triton backward kernels without atomics (bitwise reproducible);
    traceable by ``torch.compile(fullgraph=True)`` through custom ops. CPU tensors run a blockwise
    online implementation in PyTorch, or the Triton kernels when ``TRITON_INTERPRET=1``.

    Raises
    ------
    TypeError
        Non-tensor inputs, mixed dtypes, dtypes other than float16/bfloat16 (float32: cast first),
        a non-numeric scale.
    ValueError
        Not 4-D, mismatched batch / head dim / k-v shapes, ``Hq`` not a multiple of ``Hkv``, an
        unsupported head dim, inputs on different or unsupported devices, an unknown ``causal``,
        a scale that is not finite and positive.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> q = k = v = torch.randn(1, 2, 5, 32, dtype=torch.bfloat16)
    >>> onlinesoftmax.attention(q, k, v, causal=True).shape
    torch.Size([1, 2, 5, 32])
    """
    if _autocast.active_for(q):
        # scaled_dot_product_attention's policy: q, k and v in the region's dtype (see _autocast).
        return _autocast.call_lower_precision(_attention, (q, k, v), causal, scale, return_lse)
    return _attention(q, k, v, causal, scale, return_lse)


def _attention(q, k, v, causal, scale, return_lse):
    try:
        # The types too: True == 1 and 1 == 1.0, but validate takes some of these and refuses others.
        # While torch.compile traces, no lookup by shape: it would specialize every dim to its
        # traced value (a dynamic batch or sequence compiled again at each new size).
        key = None if torch.compiler.is_compiling() else (
            q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, type(causal),
            scale, type(scale), type(q), type(k), type(v))
        checked = None if key is None else _CHECKED.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option: validate says what is wrong
        key = checked = None
    if checked is None:
        checked = validate(q, k, v, causal, scale)
        if key is not None:
            remember(_CHECKED, key, checked)
    mode, scale = checked
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _AttentionFunction.apply(q, k, v, mode, scale)
    else:
        out, lse = _forward(q, k, v, mode, scale)
    return (out, lse) if return_lse else out
