"""The library's algorithms for tensors without Triton, in vectorized PyTorch.

The softmax family's ``"vectorized"`` strategy (on request: CPU tensors get torch's own kernels by
default), and the CPU paths of attention and softmax_topk when Triton's interpreter is off.
``"online"`` is the split-row algorithm: the row is cut into chunks, every chunk's (m, d) is
computed at once, and the partials are merged with the (m, d) operator. ``"safe"`` is the
three-pass version. Accumulation is float32.
"""

from __future__ import annotations

import torch

# Chunk length of the split: any value gives the same result up to rounding.
CHUNK = 4096
# Rows that the row-wise CPU paths (softmax_topk, cross_entropy's torch path) take together: float32
# temporaries of about 4 MB, which the allocator keeps and the caches hold. Temporaries of a whole
# large tensor were fresh memory, page-faulted in at every call (bf16 512 x 50257: its float32 copy
# alone took 27 ms on the CPU machine, torch's whole log_softmax 17).
ROW_CHUNK_ELEMENTS = 1 << 20


def row_chunks(x: torch.Tensor) -> list:
    """Slices of the rows of a 2-d x that a row-wise CPU path computes one after another (one
    slice for CUDA tensors, and for small ones)."""
    rows, cols = x.shape
    if x.device.type != "cpu" or rows * cols <= ROW_CHUNK_ELEMENTS:
        return [slice(0, rows)]
    step = max(1, ROW_CHUNK_ELEMENTS // max(cols, 1))
    return [slice(start, start + step) for start in range(0, rows, step)]


def reference_point(m: torch.Tensor) -> torch.Tensor:
    # exp(-inf - -inf) is NaN; an all -inf group keeps d = 0 by measuring from 0 instead.
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)


def merge_normalizers(m: torch.Tensor, d: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (m, d) operator applied over ``axis`` at once (amax keeps NaN, as the kernels' max)."""
    m_all = m.amax(axis)
    return m_all, (d * torch.exp(m - reference_point(m_all).unsqueeze(axis))).sum(axis)


def normalizer(x: torch.Tensor, algorithm: str = "online") -> tuple[torch.Tensor, torch.Tensor]:
    """(m, d) over the last dim of a float32 tensor with at least one column."""
    if algorithm == "safe":
        m = x.amax(-1)
        return m, torch.exp(x - reference_point(m).unsqueeze(-1)).sum(-1)
    n = x.shape[-1]
    chunks = -(-n // CHUNK)
    if chunks * CHUNK != n:
        x = torch.nn.functional.pad(x, (0, chunks * CHUNK - n), value=float("-inf"))
    parts = x.reshape(*x.shape[:-1], chunks, CHUNK)
    part_m = parts.amax(-1)  # amax propagates NaN, like the kernels' max
    part_d = torch.exp(parts - reference_point(part_m).unsqueeze(-1)).sum(-1)
    m = part_m.amax(-1)
    return m, (part_d * torch.exp(part_m - reference_point(m).unsqueeze(-1))).sum(-1)


def finish_lse(m: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isinf(m), m, m + torch.log(d))


def forward(x: torch.Tensor, dim: int, op: str, inv_temperature: float, out_dtype: torch.dtype,
            algorithm: str = "online") -> torch.Tensor:
    xt = x.movedim(dim, -1).float() * inv_temperature
    if op == "logsumexp":
        if xt.shape[-1] == 0:
            return torch.full(xt.shape[:-1], float("-inf"), device=x.device)
        return finish_lse(*normalizer(xt, algorithm))
    if xt.numel() == 0:
        return torch.empty(x.shape, dtype=out_dtype, device=x.device)
    m, d = normalizer(xt, algorithm)
    if op == "log_softmax":
        y = (xt - m.unsqueeze(-1)) - torch.log(d).unsqueeze(-1)
    else:
        y = torch.exp(xt - m.unsqueeze(-1)) / d.unsqueeze(-1)
    return y.to(out_dtype).movedim(-1, dim).contiguous()


def backward(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, inv_temperature: float,
             out_dtype: torch.dtype) -> torch.Tensor:
    y32, dy32 = y.float(), dy.float()
    if log:
        dx = dy32 - torch.exp(y32) * dy32.sum(dim, keepdim=True)
    else:
        dx = y32 * (dy32 - (dy32 * y32).sum(dim, keepdim=True))
    return (dx * inv_temperature).to(out_dtype).contiguous()


# --------------------------------------------------------------------------------------------
# Attention (FlashAttention): the blockwise online algorithm of attention.py, a block of keys at a time
# --------------------------------------------------------------------------------------------

# Keys per block: bounds the (B, H, Sq, block) score tile in memory; the result does not depend on it
# beyond rounding.
ATTENTION_KEY_BLOCK = 1024


def _attention_visible(n_queries: int, start: int, stop: int, n_keys: int, mode: str, device) -> torch.Tensor | None:
    """[Sq, stop - start] mask of visible keys (key j seen by query i when j <= i + offset), None if all."""
    if mode == "none":
        return None
    offset = n_keys - n_queries if mode == "bottom_right" else 0
    rows = torch.arange(n_queries, device=device)[:, None]
    cols = torch.arange(start, stop, device=device)[None, :]
    return cols <= rows + offset


def _expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    return t.float().repeat_interleave(group, dim=1) if group > 1 else t.float()


def attention_forward(q, k, v, mode: str, scale: float):
    """(out, lse) of softmax(scale q k^T + mask) v: running max, sum and rescaled accumulator per row."""
    batch, n_heads, n_queries, head_dim = q.shape
    n_keys = k.shape[2]
    group = n_heads // k.shape[1]
    qf, kf, vf = q.float(), _expand_kv(k, group), _expand_kv(v, group)
    m = torch.full((batch, n_heads, n_queries), float("-inf"), device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((batch, n_heads, n_queries, head_dim), device=q.device)
    for start in range(0, n_keys, ATTENTION_KEY_BLOCK):
        stop = min(start + ATTENTION_KEY_BLOCK, n_keys)
        s = (qf @ kf[:, :, start:stop].transpose(-1, -2)) * scale
        mask = _attention_visible(n_queries, start, stop, n_keys, mode, q.device)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_ref = reference_point(m_new)
        p = torch.exp(s - m_ref.unsqueeze(-1))
        alpha = torch.exp(m - m_ref)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + p @ vf[:, :, start:stop]
        m = m_new
    # Rows with no visible key: output 0 and lse -inf, as the kernels.
    has_keys = l > 0
    out = torch.where(has_keys.unsqueeze(-1), acc / torch.where(has_keys, l, 1.0).unsqueeze(-1), 0.0)
    lse = torch.where(has_keys, m + torch.log(torch.where(has_keys, l, 1.0)), float("-inf"))
    return out.to(q.dtype), lse


def attention_backward(do, q, k, v, out, lse, mode: str, scale: float):
    """(dq, dk, dv) from P = exp(scale q k^T - lse) recomputed a key block at a time."""
    batch, n_heads, n_queries, head_dim = q.shape
    n_heads_kv, n_keys = k.shape[1], k.shape[2]
    group = n_heads // n_heads_kv
    qf, kf, vf, dof = q.float(), _expand_kv(k, group), _expand_kv(v, group), do.float()
    delta = (dof * out.float()).sum(-1, keepdim=True)
    lse_ref = torch.where(lse == float("-inf"), float("inf"), lse).unsqueeze(-1)
    dq = torch.zeros_like(qf)
    dk = torch.zeros((batch, n_heads_kv, n_keys, head_dim), device=q.device)
    dv = torch.zeros_like(dk)
    for start in range(0, n_keys, ATTENTION_KEY_BLOCK):
        stop = min(start + ATTENTION_KEY_BLOCK, n_keys)
        kc, vc = kf[:, :, start:stop], vf[:, :, start:stop]
        p = torch.exp((qf @ kc.transpose(-1, -2)) * scale - lse_ref)
        mask = _attention_visible(n_queries, start, stop, n_keys, mode, q.device)
        if mask is not None:
            p = p.masked_fill(~mask, 0.0)
        ds = p * (dof @ vc.transpose(-1, -2) - delta)
        dq += ds @ kc
        # The GQA sum over each group of query heads.
        dv[:, :, start:stop] = (p.transpose(-1, -2) @ dof).reshape(batch, n_heads_kv, group, stop - start, head_dim).sum(2)
        dk[:, :, start:stop] = (ds.transpose(-1, -2) @ qf).reshape(batch, n_heads_kv, group, stop - start, head_dim).sum(2)
    return (dq * scale).to(q.dtype), (dk * scale).to(k.dtype), dv.to(v.dtype)


# --------------------------------------------------------------------------------------------
# Fused softmax + top-k (onlinesoftmax.topk): the same results in vectorized torch
# --------------------------------------------------------------------------------------------


def split_lse(m: torch.Tensor, log_d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lse, low): m + log_d rounded, and its rounding error exactly (TwoSum), 0 where m is not
    finite (the kernels' _triton.split_lse)."""
    lse = m + log_d
    log_d_part = lse - m
    low = (m - (lse - log_d_part)) + (log_d - log_d_part)
    finite = torch.isfinite(m)
    return torch.where(finite, lse, m), torch.where(finite, low, 0.0)


def softmax_topk(x2: torch.Tensor, k: int, inv_temperature: float, values: torch.Tensor, indices: torch.Tensor,
                 lse: torch.Tensor, lse_low: torch.Tensor) -> None:
    """Fill ``values``, ``indices`` (rows, k), and ``lse`` and ``lse_low`` (rows,: the lse in two
    floats, see split_lse) for the rows of ``x2`` (rows, cols), row_chunks at a time.

    The kernels' semantics: ranking by x / T in float32 with the lower index winning ties (a stable
    descending sort; -0.0 made +0.0 first), rows that softmax turns into NaN give NaN values and
    indices 0..k-1. Also the path for CUDA tensors when k exceeds the kernels' list size.
    """
    for rows in row_chunks(x2):
        _softmax_topk_rows(x2[rows], k, inv_temperature, values[rows], indices[rows], lse[rows], lse_low[rows])


def _softmax_topk_rows(x2, k, inv_temperature, values, indices, lse, lse_low) -> None:
    scaled = x2.float()
    if inv_temperature != 1.0:
        scaled = scaled * inv_temperature
    if k == 0 or scaled.shape[-1] == 0:
        row_max = scaled.amax(-1) if scaled.shape[-1] else torch.full_like(lse, float("-inf"))
        parts = split_lse(row_max, torch.logsumexp(scaled - reference_point(row_max).unsqueeze(-1), -1))
        lse.copy_(parts[0])
        lse_low.copy_(parts[1])
        return
    # Few full passes over the row (each costs as much as torch's fused softmax on a CPU): one
    # topk of k + 1, which also shows whether the k-th value is tied beyond the k, and one softmax.
    cols = scaled.shape[-1]
    top = torch.topk(scaled, min(k + 1, cols), -1)
    order = top.indices[:, :k]
    kth = top.values[:, k - 1:k]
    if cols > k:
        crowded = ((top.values[:, k] == kth[:, 0]) | torch.isnan(kth[:, 0])).nonzero()[:, 0]
    else:
        crowded = order.new_empty(0)
    if crowded.numel():
        # torch.topk takes any of the elements tied at the k-th value; ours takes the lowest
        # indices: every element above it, then the first ties.
        rows, t = scaled[crowded], kth[crowded]
        above, ties = rows > t, rows == t
        chosen = above | (ties & (ties.cumsum(-1) <= k - above.sum(-1, keepdim=True)))
        # Rows holding NaN (their result is NaN, with indices 0..k-1 set below) keep any k columns.
        nan_rows = torch.isnan(rows).any(-1, keepdim=True)
        chosen = torch.where(nan_rows, torch.arange(rows.shape[-1], device=rows.device) < k, chosen)
        order = order.index_put((crowded,), chosen.nonzero()[:, 1].reshape(-1, k))
    # Within the k, by value with the lower index first (-0.0 and 0.0 compare equal).
    order = order.sort(-1).values
    order = order.gather(-1, torch.sort(scaled.gather(-1, order), dim=-1, descending=True, stable=True).indices)
    probs = torch.softmax(scaled, -1)
    values.copy_(probs.gather(-1, order))
    row_max = scaled.amax(-1) if crowded.numel() else top.values[:, 0]
    nan_row = torch.isnan(probs[:, 0])  # NaN or +inf in the row, or every entry -inf
    slots = torch.arange(k, device=x2.device).expand_as(order)
    indices.copy_(torch.where(nan_row.unsqueeze(-1), slots, order))
    # lse = m + log d, and d = 1 / p(argmax).
    p_max = probs.gather(-1, order[:, :1])[:, 0]
    parts = split_lse(row_max, -torch.log(p_max))
    lse.copy_(parts[0])
    lse_low.copy_(parts[1])


def softmax_topk_backward(x2, lse, lse_low, indices, dv, dlse, inv_temperature: float, dx: torch.Tensor) -> None:
    """dx <- (scatter(dv * y_c) - y * (<dv, y_c> - dlse)) / T with y = exp((x / T - lse) - lse_low),
    computed in float32 row_chunks at a time."""
    for rows in row_chunks(x2):
        dx[rows] = _softmax_topk_backward_rows(x2[rows], lse[rows], lse_low[rows], indices[rows], dv[rows],
                                               dlse[rows], inv_temperature)


def _softmax_topk_backward_rows(x2, lse, lse_low, indices, dv, dlse, inv_temperature):
    y = torch.exp(x2.float() * inv_temperature - lse.unsqueeze(-1) - lse_low.unsqueeze(-1))
    y_chosen = y.gather(-1, indices)
    s = (dv.float() * y_chosen).sum(-1, keepdim=True) - dlse.float().unsqueeze(-1)
    dx = -y * s
    dx.scatter_(-1, indices, y_chosen * (dv.float() - s))
    return dx * inv_temperature
