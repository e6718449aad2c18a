"""The eager torch route's model: whether an eager CUDA call runs torch's own kernel.

The tables are ``plan.py``'s (EAGER_HOST_US, TORCH_*: read at each call, so that
``override_plan("softmax", ...)`` reaches them); why the route exists is written there.
"""

from __future__ import annotations

import dataclasses

import torch

from ..._device import cdiv, sm_count
from . import plan


def torch_kernel_us(rows: int, cols: int, bytes_moved: int, sms: int,
                    long_row_gbs: float | None = None) -> float:
    """What torch's softmax-family kernel takes on the GPU for ``rows`` x ``cols`` moving ``bytes_moved``
    (rows longer than plan.TORCH_SHORT_ROW_COLS streaming at ``long_row_gbs`` at best)."""
    if cols <= plan.TORCH_SHORT_ROW_COLS:
        return bytes_moved / plan.TORCH_STREAM_GBS / 1e3
    long_row_gbs = long_row_gbs or plan.TORCH_LONG_ROW_GBS
    waves = cdiv(rows, sms * plan.TORCH_ROWS_PER_SM)
    return max(bytes_moved / long_row_gbs / 1e3, waves * (plan.TORCH_ROW_US + cols * plan.TORCH_ROW_NS_PER_ELEMENT / 1e3))


def eager_torch(chosen: plan.Plan, train: bool = False, out_dtype: torch.dtype | None = None,
                sms: int | None = None, inner: int = 1) -> bool:
    """Whether an eager CUDA call planned as ``chosen`` runs torch's kernel instead (see plan.EAGER_HOST_US).
    ``inner``: the elements of the input's dims after the softmax dim (torch's spatial kernel above 1)."""
    if chosen.strategy not in plan.TRITON_STRATEGIES:
        return False
    if inner > 1 and chosen.op in ("softmax", "log_softmax"):
        host_us = plan.EAGER_HOST_US["train"] if train else plan.EAGER_HOST_US["forward"][chosen.launches]
        return torch_spatial_us(chosen, inner, train, out_dtype) < host_us
    if train:
        return torch_step_us(chosen, out_dtype) < plan.EAGER_HOST_US["train"]
    forward = torch_kernel_us(chosen.rows, chosen.cols, chosen.bytes_moved(out_dtype), sms or sm_count(torch.device("cuda")))
    return chosen.op not in plan.EAGER_ROUTE_FORWARD_OFF and forward < plan.EAGER_HOST_US["forward"][chosen.launches]


def torch_spatial_us(chosen: plan.Plan, inner: int, train: bool = False, out_dtype: torch.dtype | None = None) -> float:
    """At least what torch's softmax or log_softmax takes on the GPU over a dim followed by ``inner`` > 1
    elements (its spatial kernels; with ``train`` the backward's too): each of its threads walks the dim
    (``chosen.cols``) in turn, a few threads of a block sharing it only where ``inner`` is at most 64
    (torch's SpatialSoftMax_getBlockSize), three passes forward and two backward, at no less than
    plan.TORCH_SPATIAL_STEP_NS a step, and its bytes at no more than plan.TORCH_SPATIAL_GBS."""
    inner_threads, dim_threads = min(inner, 1024), 1
    if inner_threads <= 64 and chosen.cols >= 64:
        while inner_threads * dim_threads <= 1024 and dim_threads <= chosen.cols:
            dim_threads *= 2
        dim_threads //= 2
    steps = cdiv(chosen.cols, dim_threads) * plan.TORCH_SPATIAL_STEP_NS / 1e3
    out_size = (out_dtype or chosen.dtype).itemsize
    forward = max(3 * steps, chosen.bytes_moved(out_dtype) / plan.TORCH_SPATIAL_GBS / 1e3)
    if not train:
        return forward
    return forward + max(2 * steps, chosen.rows * chosen.cols * (2 * out_size + chosen.dtype.itemsize)
                         / plan.TORCH_SPATIAL_GBS / 1e3)


def torch_step_us(chosen: plan.Plan, out_dtype: torch.dtype | None = None) -> float:
    """What torch's kernels take on the GPU for a forward and backward step planned as ``chosen``
    (plan.TORCH_STEP_NS_PER_ELEMENT; rows up to plan.TORCH_SHORT_ROW_COLS stream at plan.TORCH_STREAM_GBS)."""
    out_size = 4 if chosen.op == "logsumexp" else (out_dtype or chosen.dtype).itemsize
    # torch.logsumexp's kernels were not fitted: log_softmax's costs stand in.
    op = "log_softmax" if chosen.op == "logsumexp" else chosen.op
    backward_gbs = plan.TORCH_SOFTMAX_BACKWARD_LONG_ROW_GBS if op == "softmax" else plan.TORCH_LONG_ROW_GBS
    steps = ((op, chosen.dtype.itemsize, chosen.bytes_moved(out_dtype), plan.TORCH_LONG_ROW_GBS),
             (op + "_backward", min(out_size, 4), chosen.rows * chosen.cols * (2 * out_size + chosen.dtype.itemsize),
              backward_gbs))
    if chosen.cols <= plan.TORCH_SHORT_ROW_COLS:
        return sum(bytes_moved for _, _, bytes_moved, _ in steps) / plan.TORCH_STREAM_GBS / 1e3
    return sum(plan.TORCH_ROW_US + chosen.cols * plan.TORCH_STEP_NS_PER_ELEMENT[kernel][size] / 1e3 + bytes_moved / gbs / 1e3
               for kernel, size, bytes_moved, gbs in steps)


def eager_torch_note(chosen: plan.Plan, sms: int | None = None) -> str:
    """What ``explain`` adds where eager calls planned as ``chosen`` run torch's kernel ("" where none does)."""
    forward = chosen if not chosen.op.endswith("_backward") else dataclasses.replace(
        chosen, op=chosen.op.replace("_backward", ""))
    when = []
    if forward is chosen and eager_torch(chosen, sms=sms):
        when.append("without autograd")
    if eager_torch(forward, train=True, sms=sms):
        when.append("differentiated (forward and backward)")
    if not when:
        return ""
    return (f"eager calls: torch's own kernel when {' or '.join(when)}: torch's kernel would finish within "
            "our host time (plan.EAGER_HOST_US), so torch's leaner dispatch decides; CUDA-graph capture and "
            "torch.compile run the plan above")
