"""The same algorithms for tensors without Triton: vectorized PyTorch (the ``"torch"`` strategy).

Used for CPU tensors when Triton's interpreter is off. ``"online"`` is the split-row algorithm:
the row is cut into chunks, every chunk's (m, d) is computed at once, and the partials are merged
with the (m, d) operator. ``"safe"`` is the three-pass version. Accumulation is float32.
"""

from __future__ import annotations

import torch

# Chunk length of the split: any value gives the same result up to rounding.
CHUNK = 4096


def _reference_point(m: torch.Tensor) -> torch.Tensor:
    # exp(-inf - -inf) is NaN; an all -inf group keeps d = 0 by measuring from 0 instead.
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)


def normalizer(x: torch.Tensor, algorithm: str = "online") -> tuple[torch.Tensor, torch.Tensor]:
    """(m, d) over the last dim of a float32 tensor with at least one column."""
    if algorithm == "safe":
        m = x.amax(-1)
        return m, torch.exp(x - _reference_point(m).unsqueeze(-1)).sum(-1)
    n = x.shape[-1]
    chunks = -(-n // CHUNK)
    if chunks * CHUNK != n:
        x = torch.nn.functional.pad(x, (0, chunks * CHUNK - n), value=float("-inf"))
    parts = x.reshape(*x.shape[:-1], chunks, CHUNK)
    part_m = parts.amax(-1)  # amax propagates NaN, like the kernels' max
    part_d = torch.exp(parts - _reference_point(part_m).unsqueeze(-1)).sum(-1)
    m = part_m.amax(-1)
    return m, (part_d * torch.exp(part_m - _reference_point(m).unsqueeze(-1))).sum(-1)


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
