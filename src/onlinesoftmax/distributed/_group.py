"""Process groups for the sharded ops: the group check, the one all_gather, the shape check; and
what the row-sharded ops (softmax family, softmax_topk) share: the shard's checks, the local strategy.

A gloo group communicates CPU tensors; CUDA tensors given to a gloo group are staged through host
memory for the collective (one copy each way of a few bytes per row), so that several processes
sharing one GPU can run the sharded ops' CUDA kernels under gloo: that is how the GPU test suite
exercises them on a machine with one GPU. NCCL communicates CUDA tensors in place.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .. import _buffers, _validate
from .._device import triton_runs_on

# Length of the per-rank description exchanged by the shape check: ndim, dim, dtype code, the
# shard size along dim, an op-specific value (k for top-k), then up to 11 sizes.
META_LENGTH = 16
META_MAX_DIMS = META_LENGTH - 5
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}


def _backend_for(device: torch.device, backend: str):
    """The backend of ``backend`` (as ``dist.get_backend`` spells it) that serves ``device``, or None."""
    backend = str(backend).lower()
    if ":" in backend:  # a multi-device group, "cpu:gloo,cuda:nccl"
        mapping = dict(part.split(":", 1) for part in backend.split(","))
        return mapping.get(device.type)
    usable = {"nccl": ("cuda",), "gloo": ("cpu", "cuda"), "mpi": ("cpu", "cuda"), "ucc": ("cpu", "cuda")}
    return backend if device.type in usable.get(backend, (device.type,)) else None


def check_group(device: torch.device, group=None, name: str = "distributed op") -> None:
    """Raise unless torch.distributed is initialized and ``group`` can communicate ``device`` tensors.

    Runs before any collective, so a rank with a wrong device raises instead of entering a
    collective the others cannot complete.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{name}: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first (or run under torchrun)")
    backend = dist.get_backend(group)
    if _backend_for(device, backend) is None:
        raise ValueError(f"{name}: the process group's backend {backend!r} cannot communicate tensors on "
                         f"{device}; NCCL communicates CUDA tensors only: move the tensor to this rank's GPU")


def _staged_through_host(tensor: torch.Tensor, group) -> bool:
    return tensor.device.type == "cuda" and _backend_for(tensor.device, dist.get_backend(group)) == "gloo"


def all_gather(tensor: torch.Tensor, group) -> torch.Tensor:
    """(world_size, *tensor.shape): every rank's ``tensor`` in rank order, in one collective."""
    world = dist.get_world_size(group)
    flat = tensor.contiguous().reshape(-1)
    host = _staged_through_host(tensor, group)
    if host:
        flat = flat.cpu()
        out = torch.empty((world * flat.numel(),), dtype=flat.dtype)
    else:
        out = _buffers.empty((world * flat.numel(),), tensor.dtype, tensor.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, flat, group=group)
    if host:
        out = out.to(tensor.device)
    return out.reshape((world,) + tuple(tensor.shape))


def gather_shapes(x: torch.Tensor, dim: int, group, name: str, extra: int = 0) -> torch.Tensor:
    """All-gather each rank's (ndim, dim, dtype, shard size, extra, sizes) and raise the same
    ValueError on every rank when the shards do not fit together. Returns the (world, 16) table."""
    if x.dim() > META_MAX_DIMS:
        raise ValueError(f"{name}: at most {META_MAX_DIMS} dims are supported, got {x.dim()}")
    sizes = list(x.shape) + [-1] * (META_MAX_DIMS - x.dim())
    sizes[dim] = -1  # the sharded dim may differ
    meta = torch.tensor([x.dim(), dim, _DTYPE_CODES.get(x.dtype, 99), x.shape[dim], extra] + sizes,
                        dtype=torch.int64, device=x.device)
    table = all_gather(meta, group).cpu()
    if not torch.equal(table[:, [0, 1, 2, 4]], table[:1, [0, 1, 2, 4]].expand(len(table), -1)):
        raise ValueError(f"{name}: ranks disagree on ndim, dim, dtype or k: (ndim, dim, dtype, k) per rank = "
                         f"{table[:, [0, 1, 2, 4]].tolist()}")
    if not torch.equal(table[:, 5:], table[:1, 5:].expand(len(table), -1)):
        shapes = [[int(s) for s in row[5:5 + int(row[0])]] for row in table]
        raise ValueError(f"{name}: every dim but the sharded dim {dim} must have the same size on every rank, "
                         f"got shapes {shapes} (-1 marks dim {dim}); is dim {dim} the dimension the tensor "
                         "is sharded along?")
    return table


def rows_view(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with ``dim`` moved last and the rest flattened: (rows, shard columns), contiguous."""
    rows = 1
    for i, size in enumerate(x.shape):
        if i != dim:
            rows *= size
    if dim == x.dim() - 1 and x.is_contiguous():
        # The common call, the last dim of a contiguous shard: no op at all where x is 2-d (each
        # view or movedim is host time on a call that is mostly host time).
        return x if x.dim() == 2 else x.view(rows, x.shape[dim])
    return x.movedim(dim, -1).reshape(rows, x.shape[dim]).contiguous()


def from_rows(y2: torch.Tensor, like_shape, dim: int) -> torch.Tensor:
    """The (rows, n) result ``y2`` in the shape of ``like_shape`` with ``dim`` of size n."""
    if dim == len(like_shape) - 1:
        return y2 if y2.dim() == len(like_shape) else y2.reshape(like_shape)
    moved = list(like_shape)
    moved.append(moved.pop(dim))
    return y2.reshape(moved).movedim(-1, dim)


class NoContext:
    """Stands in for autograd's ctx when no graph is recorded (saves nothing worth keeping)."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


# --------------------------------------------------------------------------------------------
# The row-sharded ops' shard checks and local strategy
# --------------------------------------------------------------------------------------------

STRATEGIES = ("split_row", "torch")

_last_strategy: Optional[str] = None


def last_strategy() -> Optional[str]:
    """The local strategy of the most recent softmax-family or softmax_topk call in this process:
    "split_row" or "torch"."""
    return _last_strategy


def local_strategy(x: torch.Tensor, strategy: Optional[str], name: str) -> str:
    """The strategy a row-sharded call runs on its shard ``x`` (checked; remembered for last_strategy)."""
    global _last_strategy
    if strategy is not None:
        _validate.choice(strategy, STRATEGIES, name, "strategy")
    if strategy == "split_row" and not triton_runs_on(x.device):
        raise ValueError(f"{name}: strategy 'split_row' runs Triton kernels, which need a CUDA tensor "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")
    _last_strategy = strategy or ("split_row" if triton_runs_on(x.device) else "torch")
    return _last_strategy


def checked_shard(x, dim: int, name: str, temperature=1.0):
    """(x, dim normalized) after the checks every row-sharded op makes of its shard."""
    _validate.tensor(x, name)
    _validate.float_dtype(x, name)
    _validate.device(x, name)
    _validate.positive(temperature, name, "temperature")
    return x, _validate.dim(dim, x.dim(), name)
