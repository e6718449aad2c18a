"""PyTorch's own OpInfo samples for softmax, log_softmax and logsumexp (``op_db``, the
``with_dtype`` variants and 0-d tensors included), run through ours and compared with torch's,
forward and gradients. On CPU in CI the float32/float16/bfloat16 samples run the Triton kernels
through the interpreter; float64 and the other dtypes take torch's kernels, by design.
"""

from __future__ import annotations

import pytest
import torch

import onlinesoftmax

from conftest import DEVICE

pytest.importorskip("expecttest")  # op_db's module imports it
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

OURS = {"softmax": onlinesoftmax.softmax, "log_softmax": onlinesoftmax.log_softmax,
        "logsumexp": onlinesoftmax.logsumexp}
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64)
# Ours accumulates half types in float32 and rounds once, as torch's kernels do: differences are
# the last bit's rounding, of a log-softmax's terms too ((x - m) - log d near 0: atol of one ulp
# at 2). (rtol, atol) by result dtype.
TOLERANCE = {torch.float64: (1e-12, 1e-12), torch.complex64: (1e-5, 1e-6), torch.float32: (1e-5, 1e-6),
             torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}

CASES = [pytest.param(info, dtype, id=f"{info.name}{'-' + info.variant_test_name if info.variant_test_name else ''}"
                      f"-{str(dtype)[6:]}")
         for info in op_db if info.name in OURS
         for dtype in DTYPES if dtype in info.supported_dtypes(DEVICE.type)]


@pytest.mark.parametrize("info, dtype", CASES)
def test_opinfo_samples_forward_and_gradients(info, dtype, gen):
    differentiable = info.supports_autograd and dtype.is_floating_point
    samples = list(info.sample_inputs(DEVICE.type, dtype, requires_grad=differentiable))
    assert samples, f"{info.name}: no OpInfo samples"
    for sample in samples:
        what = f"{info.name} {tuple(sample.input.shape)} args={sample.args} kwargs={sample.kwargs}"
        ours = OURS[info.name](sample.input, *sample.args, **sample.kwargs)
        ref = info.op(sample.input, *sample.args, **sample.kwargs)
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, f"{what}: {ours.shape} {ours.dtype} != {ref.shape} {ref.dtype}"
        rtol, atol = TOLERANCE[ref.dtype]
        torch.testing.assert_close(ours, ref, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")
        if differentiable and ref.numel() and ref.requires_grad:
            cotangent = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(ref.dtype).to(ref.device)
            (ours_grad,) = torch.autograd.grad(ours, sample.input, cotangent)
            (ref_grad,) = torch.autograd.grad(ref, sample.input, cotangent)
            torch.testing.assert_close(ours_grad, ref_grad, rtol=10 * rtol, atol=10 * atol, equal_nan=True,
                                       msg=lambda m: f"{what} gradient: {m}")
