"""Attention over keys sharded across ranks: partial attentions merged through their log-sum-exp.

Two attentions over disjoint key sets merge exactly as two (m, d) pairs do: with ``lse_x`` the
log-sum-exp of each partial's scores, ``out = sum_x exp(lse_x - lse) out_x`` and
``lse = logaddexp(lse_a, lse_b)``. Context-parallel attention gathers every rank's partial and
merges them in rank order on every rank.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .. import _autocast
from ..ops.attention import attention as attention_op
from ..ops.attention import launch as attention_launch
from ..ops.attention.op import validate as validate_attention
from ..ops.decode.op import launch_merge
from ._group import NoContext, all_gather, check_group, gather_shapes


def _merge_stacked(outs: torch.Tensor, lses: torch.Tensor, out_dtype: torch.dtype):
    """Merge partial attentions stacked on dim 0, in that order: the public merge's kernel."""
    out, lse = launch_merge(outs, lses)
    return out.to(out_dtype), lse


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Merge two attentions over disjoint key sets through their log-sum-exp
    (:func:`onlinesoftmax.merge_attention` of the pair).

    Parameters
    ----------
    out_a, out_b : Tensor, shape (..., D)
        Partial attention outputs (each normalized over its own keys), same shape and dtype.
    lse_a, lse_b : Tensor, shape (...)
        Their natural-log log-sum-exp (as :func:`onlinesoftmax.attention` returns with
        ``return_lse=True``); ``-inf`` marks a partial that saw no key.

    Returns
    -------
    out : Tensor, shape (..., D), dtype of ``out_a``
        ``w_a out_a + w_b out_b`` with ``w_x = exp(lse_x - lse)``, computed in float32.
    lse : Tensor, shape (...), float32
        ``logaddexp(lse_a, lse_b)``; ``-inf`` (with an output of zeros, never NaN) when both
        partials are empty; an empty partial's output is not read. A NaN lse, or NaN in the output
        of a partial that has keys, propagates.

    Raises
    ------
    ValueError
        Mismatched shapes. TypeError: non-tensor input.
    """
    for name, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"merge_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise ValueError(f"merge_attention: expected out_a, out_b of one shape (..., D) and lse_a, lse_b of shape "
                         f"(...); got {tuple(out_a.shape)}, {tuple(lse_a.shape)}, {tuple(out_b.shape)}, "
                         f"{tuple(lse_b.shape)}")
    return _merge_stacked(torch.stack([out_a, out_b]), torch.stack([lse_a.float(), lse_b.float()]), out_a.dtype)


def _local_pieces(n_queries: int, n_keys: int, offset: int, total_keys: int, mode: str):
    """The attention calls that mask this rank's keys (global positions offset + j) correctly.

    Query i sees global key g when g <= i + c (c = 0 for "top_left", total - Sq for
    "bottom_right"), i.e. local key j when j <= i + c - offset. The attention op only offers
    c' = 0 ("top_left") and c' = Sk - Sq ("bottom_right") on its own inputs, so each case becomes
    slices: returns [(query_start, key_start, key_stop, mode)] covering every visible pair once.
    """
    if mode == "none" or n_keys == 0:
        return [(0, 0, n_keys, "none")] if n_keys else []
    shift = (0 if mode == "top_left" else total_keys - n_queries) - offset  # j <= i + shift
    if shift >= n_keys - 1:
        return [(0, 0, n_keys, "none")]  # every query sees every local key
    if shift <= 0:
        # Queries before -shift see nothing; from there query i' = i + shift sees j <= i'.
        return [(-shift, 0, n_keys, "top_left")] if -shift < n_queries else []
    # 0 < shift < Sk - 1: keys j <= shift are visible to every query, key shift + j' to i >= j'.
    return [(0, 0, shift, "none"), (0, shift, n_keys, "top_left")]


def _attention_partial(q, k, v, offset, total_keys, mode, scale):
    """This rank's (out, lse) over its keys, float32 lse; rows with no visible key: zeros and -inf."""
    batch, heads, n_queries, head_dim = q.shape
    outs, lses = [], []
    for q_start, k_start, k_stop, piece_mode in _local_pieces(n_queries, k.shape[2], offset, total_keys, mode):
        out_p, lse_p = attention_op(q[:, :, q_start:], k[:, :, k_start:k_stop], v[:, :, k_start:k_stop],
                                               causal=False if piece_mode == "none" else piece_mode,
                                               scale=scale, return_lse=True)
        out_full = torch.zeros((batch, heads, n_queries, head_dim), dtype=q.dtype, device=q.device)
        lse_full = torch.full((batch, heads, n_queries), float("-inf"), device=q.device)
        out_full[:, :, q_start:] = out_p
        lse_full[:, :, q_start:] = lse_p
        outs.append(out_full)
        lses.append(lse_full)
    if not outs:
        return (torch.zeros((batch, heads, n_queries, head_dim), dtype=q.dtype, device=q.device),
                torch.full((batch, heads, n_queries), float("-inf"), device=q.device))
    if len(outs) == 1:
        return outs[0], lses[0]
    return _merge_stacked(torch.stack(outs), torch.stack(lses), q.dtype)


class _ContextParallelAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mode, scale, group, offset, total_keys):
        out_r, lse_r = _attention_partial(q, k, v, offset, total_keys, mode, scale)
        # The one collective of the forward: each rank's partial (out, lse) as one byte buffer.
        payload = torch.cat([out_r.contiguous().view(torch.uint8).reshape(-1),
                             lse_r.contiguous().view(torch.uint8).reshape(-1)])
        gathered = all_gather(payload, group)
        world = gathered.shape[0]
        out_bytes = out_r.numel() * out_r.element_size()
        outs = gathered[:, :out_bytes].contiguous().view(q.dtype).reshape((world,) + tuple(out_r.shape))
        lses = gathered[:, out_bytes:].contiguous().view(torch.float32).reshape((world,) + tuple(lse_r.shape))
        out, lse = _merge_stacked(outs, lses, q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (mode, scale, group, offset, total_keys)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # else autograd allocates and fills zeros for lse's gradient every backward
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        # The flash backward of each local piece with the GLOBAL (out, lse): P = exp(s - lse) and
        # delta = rowsum(d_out * out) are then the full attention's, so dk and dv of this rank's
        # keys are exact and dq is this rank's share; the shares are summed in rank order.
        q, k, v, out, lse = ctx.saved_tensors
        mode, scale, group, offset, total_keys = ctx.config
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        d_out = torch.zeros_like(out) if d_out is None else d_out.to(out.dtype)
        for q0, k0, k1, piece_mode in _local_pieces(q.shape[2], k.shape[2], offset, total_keys, mode):
            dq_p, dk_p, dv_p = attention_launch.launch_backward(
                d_out[:, :, q0:].contiguous(), q[:, :, q0:].contiguous(), k[:, :, k0:k1].contiguous(),
                v[:, :, k0:k1].contiguous(), out[:, :, q0:].contiguous(), lse[:, :, q0:].contiguous(),
                piece_mode, scale)
            dq[:, :, q0:] += dq_p.float()
            dk[:, :, k0:k1] += dk_p.float()
            dv[:, :, k0:k1] += dv_p.float()
        dq = all_gather(dq, group).sum(0)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def attention(q: torch.Tensor, k_shard: torch.Tensor, v_shard: torch.Tensor, *, causal=False,
              scale: Optional[float] = None, group=None, return_lse: bool = False):
    """Context-parallel attention: the keys and values are sharded along the sequence across ranks.

    Parameters
    ----------
    q : Tensor, shape (B, Hq, Sq, D)
        Every query, the same on every rank (float16 or bfloat16, as :func:`onlinesoftmax.attention`).
    k_shard, v_shard : Tensor, shape (B, Hkv, Sk_r, D)
        This rank's contiguous shard of the keys and values (rank 0 the first positions); shard
        lengths may differ, 0 included.
    causal : bool or {"top_left", "bottom_right"}
        As :func:`onlinesoftmax.attention`, over the global key positions (shard offset + local
        index): ``True``/``"top_left"`` lets query i see global keys ``<= i``; ``"bottom_right"``
        keys ``<= i + Sk - Sq`` with Sk the total over ranks.
    scale : float, optional
        ``1 / sqrt(D)`` by default.
    group : ProcessGroup, optional
        The default group when None.
    return_lse : bool
        Also return the float32 log-sum-exp over all keys (B, Hq, Sq); not differentiable.

    Returns
    -------
    out : Tensor, shape (B, Hq, Sq, D), dtype of ``q`` (inside an autocast region q, k and v are
        taken in its dtype, as :func:`onlinesoftmax.attention` takes them); bitwise the same on every rank
    lse : Tensor (only with ``return_lse``)

    Notes
    -----
    Two collectives: an all_gather of the 16-integer shape description (which gives each rank
    its shard offset for the causal mask and checks that the shards fit), then one all_gather of
    each rank's partial (out, lse) as bytes; every rank merges the partials in rank order with the
    log-sum-exp weights of :func:`merge_attention` (fp32; a rank whose keys a query cannot see
    sends lse ``-inf`` and weighs 0). The causal mask of a shard is one or two calls of the
    attention op on slices (its ``top_left`` mask on a query or key slice, or no mask).

    Differentiable: the backward pass runs the attention op's backward on each local piece with
    the merged (out, lse), which makes dk and dv of this rank's keys exact and dq this rank's
    share, then all-gathers the fp32 dq shares and sums them in rank order (q is replicated, so
    every rank receives the full dq). ``d_out`` must be the same on every rank (a loss computed
    redundantly), as for any replicated output.

    Raises
    ------
    As :func:`onlinesoftmax.attention`, plus RuntimeError (not initialized) and ValueError (the
    group cannot communicate this device's tensors; shapes other than the key length differ).
    """
    if _autocast.active_for(q):
        # As onlinesoftmax.attention (scaled_dot_product_attention's policy): q, k and v in the
        # region's dtype, the call run with autocast off (see onlinesoftmax._autocast).
        return _autocast.call_lower_precision(attention, (q, k_shard, v_shard), causal=causal, scale=scale,
                                              group=group, return_lse=return_lse)
    name = "distributed.attention"
    mode, scale = validate_attention(q, k_shard, v_shard, causal, scale, name)
    check_group(q.device, group, name)
    table = gather_shapes(k_shard, 2, group, name, extra=q.shape[2] * 100003 + q.shape[1])
    rank = dist.get_rank(group)
    sizes = table[:, 3]
    offset, total_keys = int(sizes[:rank].sum()), int(sizes.sum())
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_shard, v_shard)):
        out, lse = _ContextParallelAttentionFunction.apply(q, k_shard, v_shard, mode, scale, group, offset, total_keys)
    else:
        out, lse = _ContextParallelAttentionFunction.forward(NoContext(), q, k_shard, v_shard, mode, scale, group,
                                                             offset, total_keys)
    return (out, lse) if return_lse else out
