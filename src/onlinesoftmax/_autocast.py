"""torch.autocast: torch's policy for the ops that have a torch counterpart, applied where the
public functions take their arguments.

Inside an autocast region torch's own ops change dtypes (``torch.amp``'s op lists, as PyTorch 2.5
to 2.13 have them):

- on CUDA, ``softmax`` and ``log_softmax`` of a half-precision tensor compute and return float32
  (``dtype=torch.float32`` where none is given), and so does ``torch.topk`` of that softmax (our
  softmax_topk); ``logsumexp`` and ``cross_entropy`` run in float32, so the loss and the lse are
  float32;
- on the CPU, ``cross_entropy`` alone does;
- ``scaled_dot_product_attention`` and ``linear`` take their floating inputs (float64 excepted) in
  the region's dtype, on both (our attention and attention_with_kvcache as the former).

A drop-in gives what torch gives, so the public functions apply the same policy (the distributed
ops as their local counterparts). The half-precision
tensors are read as they are (an upcast to float32 is exact, and the kernels compute in float32);
what changes is the dtype written. Their own torch ops run with autocast off (the policy is applied
once, at the boundary). The gradients come back in the inputs' dtypes, as through torch's casts.
"""

from __future__ import annotations

import torch

# Whether any autocast region is active: one C call, which the public functions make first (bound
# to a module-level name: an eager call pays no attribute lookup for it).
any_enabled = torch._C._is_any_autocast_enabled
HALF = (torch.float16, torch.bfloat16)

# The device types on which torch computes each op in float32 inside an autocast region.
FLOAT32_OPS = {"softmax": ("cuda",), "log_softmax": ("cuda",), "logsumexp": ("cuda",),
               "cross_entropy": ("cuda", "cpu")}


def enabled(device_type: str) -> bool:
    """Whether an autocast region for ``device_type`` is active: one C call where none is (every
    eager call pays it), the public query while torch.compile traces (dynamo follows that one)."""
    if torch.compiler.is_compiling():
        return torch.is_autocast_enabled(device_type)
    return any_enabled() and torch.is_autocast_enabled(device_type)


def float32_result(op: str, x) -> bool:
    """Whether torch, in the autocast region now active, computes ``op`` of the tensor ``x`` in
    float32 where x is half precision (float32 and float64 are left as they are)."""
    return (isinstance(x, torch.Tensor) and x.dtype in HALF and x.device.type in FLOAT32_OPS[op]
            and enabled(x.device.type))


def lower_precision(device_type: str, *tensors):
    """The tensors as ``scaled_dot_product_attention`` and ``linear`` take them in the active
    autocast region of ``device_type`` (callers check it is active): floating tensors but float64
    cast to its dtype, None and other tensors as they are."""
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                 and t.dtype != dtype else t for t in tensors)


def active_for(t) -> bool:
    """Whether an autocast region is active on tensor ``t``'s device (False for a non-tensor, which
    the caller's own checks then refuse)."""
    return any_enabled() and isinstance(t, torch.Tensor) and enabled(t.device.type)


def call_lower_precision(fn, tensors: tuple, *args, **kwargs):
    """``fn(*tensors, *args, **kwargs)`` inside the active autocast region (callers check it is),
    the tensors as lower_precision gives them and the region off for the call: the public
    functions that take scaled_dot_product_attention's policy."""
    device_type = tensors[0].device.type
    with off(device_type):
        return fn(*lower_precision(device_type, *tensors), *args, **kwargs)


def off(device_type: str):
    """A context in which torch's ops inside ours are not cast again."""
    return torch.autocast(device_type, enabled=False)
