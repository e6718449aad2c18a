"""PyTorch's own OpInfo samples for softmax, log_softmax and logsumexp (``op_db``, the
``with_dtype`` variants and 0-d tensors included), run through ours and compared with torch's,
forward and gradients. On CPU in CI the float32/float16/bfloat16 samples run the Triton kernels
through the interpreter; float64 and the other dtypes take torch's kernels, by design.

Also the samples of ``F.cross_entropy`` and (torch 2.13 and later) ``F.linear_cross_entropy`` that
name class indices, mapped to our layout (the class dim last) and names, against torch's op on the
same samples in float64.
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


# --------------------------------------------------------------------------------------------
# The losses: torch's samples (class-index and probability targets)
# --------------------------------------------------------------------------------------------

LOSSES = ("nn.functional.cross_entropy", "nn.functional.linear_cross_entropy")
LOSS_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
LOSS_CASES = [pytest.param(info, dtype, id=f"{info.name[14:]}{'-' + info.variant_test_name if info.variant_test_name else ''}"
                           f"-{str(dtype)[6:]}")
              for info in op_db if info.name in LOSSES
              for dtype in LOSS_DTYPES if dtype in info.supported_dtypes(DEVICE.type)]


def _ours_on_loss_sample(name, sample):
    """Our call for a torch loss sample, or None where the sample needs what ours does not take
    (linear_cross_entropy's probability targets and K-dimensional weights)."""
    x, (*others, target), kwargs = sample.input, sample.args, dict(sample.kwargs)
    if name.endswith("linear_cross_entropy"):
        if target.is_floating_point():
            return None
        (projection,) = others
        if projection.dim() != 2:
            return None
        kwargs.pop("options", None)  # torch's chunking; ours plans its own
        if kwargs.get("ignore_index", -100) is None:
            kwargs["ignore_index"] = -100
        renamed = {"linear_bias": "bias", "weight": "class_weight"}
        return lambda: onlinesoftmax.linear_cross_entropy(x, projection, target,
                                                          **{renamed.get(k, k): v for k, v in kwargs.items()})
    # torch's class dim is 1 for inputs of 2 dims and more; ours is the last (probability targets' too).
    logits = x.movedim(1, -1) if x.dim() > 2 else x
    if target.is_floating_point() and target.dim() > 2:
        target = target.movedim(1, -1)
    return lambda: onlinesoftmax.cross_entropy(logits, target, **kwargs)


def _in_float64(sample):
    """The sample's floating tensors in float64, leaves that require grad where they did; torch's
    chunked linear_cross_entropy takes half types only, so the reference is its plain path."""
    def up(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.detach().double().requires_grad_(t.requires_grad)
        return t
    return up(sample.input), [up(a) for a in sample.args], {k: up(v) for k, v in sample.kwargs.items()
                                                            if k != "options"}


@pytest.mark.parametrize("info, dtype", LOSS_CASES)
def test_opinfo_loss_samples_forward_and_gradients(info, dtype, gen):
    samples = list(info.sample_inputs(DEVICE.type, dtype, requires_grad=True))
    ran, ran_probabilities = 0, 0
    for sample in samples:
        ours_fn = _ours_on_loss_sample(info.name, sample)
        if ours_fn is None:
            continue
        ran += 1
        ran_probabilities += sample.args[-1].is_floating_point()
        what = (f"{info.name} {tuple(sample.input.shape)} args={[tuple(a.shape) for a in sample.args]} "
                f"kwargs={ {k: tuple(v.shape) if isinstance(v, torch.Tensor) else v for k, v in sample.kwargs.items()} }")
        ours = ours_fn()
        torch_same_dtype = info.op(sample.input, *sample.args, **sample.kwargs)
        assert ours.shape == torch_same_dtype.shape and ours.dtype == torch_same_dtype.dtype, \
            f"{what}: {ours.shape} {ours.dtype} != {torch_same_dtype.shape} {torch_same_dtype.dtype}"
        x64, args64, kwargs64 = _in_float64(sample)
        ref = info.op(x64, *args64, **kwargs64)
        # Against float64: torch's own half-precision losses round the log-probabilities first.
        rtol, atol = TOLERANCE[dtype]
        torch.testing.assert_close(ours.double(), ref.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
        leaves = [t for t in (sample.input, *sample.args, *sample.kwargs.values())
                  if isinstance(t, torch.Tensor) and t.requires_grad]
        leaves64 = [t for t in (x64, *args64, *kwargs64.values()) if isinstance(t, torch.Tensor) and t.requires_grad]
        if ours.numel() and leaves:
            cotangent = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(ref.device)
            ours_grads = torch.autograd.grad(ours, leaves, cotangent.to(ours.dtype), allow_unused=True)
            ref_grads = torch.autograd.grad(ref, leaves64, cotangent, allow_unused=True)
            for i, (mine, theirs) in enumerate(zip(ours_grads, ref_grads)):
                if theirs is None:
                    continue
                torch.testing.assert_close(mine.double(), theirs, rtol=10 * rtol, atol=10 * atol, equal_nan=True,
                                           msg=lambda m: f"{what} gradient of input {i}: {m}")
    assert ran, f"{info.name}: no sample ran"
    if info.name == "nn.functional.cross_entropy":
        assert ran_probabilities == sum(s.args[-1].is_floating_point() for s in samples) > 0, "probability targets"
