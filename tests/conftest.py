"""Shared test machinery: the one tolerance table, fresh seeded inputs, poisoned outputs, devices.

CI runs this suite with TRITON_INTERPRET=1 on CPU tensors, so the Triton kernels themselves run;
on a GPU machine the same tests run the compiled kernels on CUDA tensors.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import secrets
import subprocess
import sys

import pytest
import torch

import contextlib

import onlinesoftmax
from onlinesoftmax._interpreter import round_bf16_casts_to_nearest
from onlinesoftmax.ops.softmax import plan


# The interpreter's bf16 casts round to nearest even, as the GPU's (they truncate otherwise, and
# cancelling bf16 gradients such as y * (dy - dot) turned that bias into flaky 1e-2 failures).
if os.environ.get("TRITON_INTERPRET") == "1":
    round_bf16_casts_to_nearest()

# The one tolerance table: bound on ||out - ref|| / ||ref|| against a float64 reference, by the
# dtype the result is stored in. float32 accumulates and stores in fp32 (a few ulps per element);
# half types are limited by rounding the output (2^-11 for fp16, 2^-8 for bf16).
TOLERANCE = {
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1e-2,
    torch.float64: 1e-12,  # what runs torch's own kernels (float64 cross-entropy)
}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the Triton kernels' dtypes

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda") if ON_GPU else torch.device("cpu")
TRITON_RUNS = ON_GPU or os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_triton = pytest.mark.skipif(not TRITON_RUNS, reason="Triton kernels need CUDA or TRITON_INTERPRET=1")
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")


def strategies_here():
    """Every softmax strategy that can run on this machine: the Triton ones only with Triton."""
    return plan.STRATEGIES if TRITON_RUNS else ("torch", "vectorized")


@pytest.fixture(autouse=True)
def kernels_at_every_size(request):
    """Small eager CUDA calls run torch's own kernel (plan.EAGER_HOST_US); the GPU runs the tests on
    our kernels at every size, except those marked ``eager_torch_route``."""
    if not ON_GPU or request.node.get_closest_marker("eager_torch_route"):
        yield
        return
    with onlinesoftmax.override_plan("softmax", EAGER_HOST_US=plan.EAGER_ROUTE_OFF):
        yield


@pytest.fixture
def plan_override():
    """``plan_override(op="softmax", **tables)``: run the rest of the test under other plan tables
    (onlinesoftmax.override_plan); every override is undone, and the plan caches cleared, after it."""
    with contextlib.ExitStack() as stack:
        def override(op="softmax", **tables):
            return stack.enter_context(onlinesoftmax.override_plan(op, **tables))
        yield override


@pytest.fixture
def gen():
    """A generator with a fresh seed per test; the seed is printed so a failure can be replayed."""
    seed = int(os.environ.get("ONLINESOFTMAX_TEST_SEED", secrets.randbits(63)))
    print(f"seed: {seed} (replay with ONLINESOFTMAX_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


def make_logits(shape, dtype=torch.float32, gen=None, scale=3.0, device=DEVICE, outliers=True):
    """Random logits with outliers (a few entries x20), so near-uniform wrong answers fail.

    Gradient tests turn the outliers off: a softmax saturated on one entry makes dx = y (dy - <dy, y>)
    a difference of nearly equal numbers, whose fp32 rounding no implementation can avoid.
    """
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    if outliers and x.numel():
        flat = x.view(-1)
        idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=gen)
        flat[idx] *= 20
    return x.to(dtype).to(device)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    finite = torch.isfinite(ref)
    diff = (out[finite] - ref[finite]).norm()
    return (diff / ref[finite].norm().clamp_min(1e-300)).item()


def flush_below_float32_normal(t: torch.Tensor) -> torch.Tensor:
    t = t.double().cpu()
    return torch.where(t.abs() < torch.finfo(torch.float32).tiny, torch.zeros_like(t), t)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = ""):
    """Same shape, same NaN and +-inf placement, and relative error within the dtype's tolerance.

    The placement is that of the reference rounded to the output dtype: a float16 log-softmax of
    -65504 - 65504 is -inf in any correct float16 implementation.

    Magnitudes below float32's smallest normal (1.2e-38) count as zero on both sides. The GPU's
    exp flushes them (ex2.approx.ftz), and Triton 3.6's interpreter rounds float32 subnormals to
    bfloat16 wrongly (1.5e-41 becomes 3.6e-39, 3e-39 becomes 1.8e-40); a shard whose reference is
    all such values would otherwise be judged on relative error against a zero norm.
    """
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out_c, ref_c = flush_below_float32_normal(out), flush_below_float32_normal(ref.to(out.dtype))
    nan_out, nan_ref = torch.isnan(out_c), torch.isnan(ref_c)
    if not torch.equal(nan_out, nan_ref):
        bad = (nan_out != nan_ref).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: NaN placement differs at {bad} (out NaN: {nan_out.sum()}, ref NaN: {nan_ref.sum()})")
    inf_ref = torch.isinf(ref_c)
    assert torch.equal(torch.isinf(out_c), inf_ref), f"{what}: inf placement differs"
    assert torch.equal(out_c[inf_ref], ref_c[inf_ref]), f"{what}: inf signs differ"
    err = relative_error(out_c, ref_c)
    assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.3e} > {TOLERANCE[dtype]:.0e} ({dtype})"


def compiled_for_sm90(probe: str, timeout: int = 600):
    """Runs ``probe`` (Python source that compiles kernels for sm_90 through
    scripts/probes/kernel_resources.py, no GPU needed, and prints one JSON line last) in a process
    of its own without TRITON_INTERPRET (the compiler, not the interpreter), and returns that JSON."""
    repo = pathlib.Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every buffer the launchers of every op allocate (onlinesoftmax._buffers.empty) starts as NaN,
    so an element no kernel wrote fails."""
    buffers = importlib.import_module("onlinesoftmax._buffers")

    def nan_filled(shape, dtype, device):
        # Integer buffers (softmax_topk's indices) get their most negative value: never a valid index.
        poison = float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min
        return torch.full(shape, poison, dtype=dtype, device=device)

    monkeypatch.setattr(buffers, "empty", nan_filled)
    monkeypatch.setattr(buffers, "empty_like", lambda t: nan_filled(t.shape, t.dtype, t.device))
    # Scratch kept between launches (row_exchange) is made again from the NaN-filled buffers.
    monkeypatch.setattr(buffers, "_EXCHANGE", {})
