"""Triton's interpreter (``TRITON_INTERPRET=1``) made to round as the GPU does, for the CPU test run
and the probes that run there.

Triton 3.6's interpreter converts float32 to bfloat16 by truncation (``cast_impl`` passes no
rounding mode), so each bf16 store errs by up to one ulp, always towards zero, where the GPU's
``cvt.rn`` errs by half an ulp either way. Sums of such roundings (a gradient's y * (dy - dot), an
attention backward's long sums over queries) then carry a bias the GPU does not have.
"""

from __future__ import annotations

import torch


def round_bf16_casts_to_nearest() -> None:
    """Route the interpreter's float32 -> bfloat16 casts through torch's (round to nearest even,
    NaN and inf kept). Idempotent; other casts are left to Triton."""
    import numpy as np  # the interpreter's own dependency
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "rounds_bf16_to_nearest", False):
        return
    truncating_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            values = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits.reshape(np.shape(src.data)), tl.bfloat16)
        return truncating_cast(self, src, dst_type)

    cast_impl.rounds_bf16_to_nearest = True
    builder.cast_impl = cast_impl
