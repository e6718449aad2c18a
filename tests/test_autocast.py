"""torch.autocast: the ops that have a torch counterpart give torch's dtypes inside an autocast
region (onlinesoftmax._autocast), values against float64, gradients in the inputs' dtypes.

What torch gives is read from torch itself in the same region (on CUDA: softmax, log_softmax,
logsumexp and cross_entropy in float32, and softmax_topk as torch.topk of that softmax; on the CPU
cross_entropy alone; attention and the linear projection in the region's dtype on both), so the
tests hold whatever the device's policy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax import _autocast

from conftest import DEVICE, ON_GPU, TOLERANCE, assert_matches, make_logits, needs_triton, relative_error
from cross_entropy_cases import make_targets, reference

pytestmark = needs_triton
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)

SOFTMAX_OPS = {
    "softmax": (onlinesoftmax.softmax, torch.softmax),
    "log_softmax": (onlinesoftmax.log_softmax, torch.log_softmax),
    "logsumexp": (onlinesoftmax.logsumexp, torch.logsumexp),
}


def _region(dtype):
    return torch.autocast(DEVICE.type, dtype=dtype)


def _check_gradient(out, ref, leaf, ref_leaf, gen, what):
    """The leaf's gradient for a random upstream one: in the leaf's dtype, against float64."""
    upstream = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    (out * upstream.to(out.dtype)).sum().backward()
    (ref * upstream).sum().backward()
    assert leaf.grad.dtype == leaf.dtype
    assert_matches(leaf.grad, ref_leaf.grad, leaf.dtype, f"{what} gradient")


@pytest.mark.parametrize("route", ["kernels", pytest.param("eager_route", marks=pytest.mark.eager_torch_route)])
@pytest.mark.parametrize("autocast_dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_softmax_family_takes_torchs_dtype(op, dtype, autocast_dtype, route, gen):
    # Small rows: on the GPU the eager route gives them to torch's kernel, the other case our
    # kernels (the conftest fixture); both must give torch's dtype (they once differed).
    ours, theirs = SOFTMAX_OPS[op]
    x = make_logits((6, 37), dtype, gen).requires_grad_()
    with _region(autocast_dtype):
        expected = theirs(x.detach(), -1).dtype
        out = ours(x, -1)
    assert out.dtype == expected, f"{op} of {dtype} under autocast({autocast_dtype}): {out.dtype}, torch {expected}"
    x64 = x.detach().double().requires_grad_()
    ref = theirs(x64, -1)
    assert_matches(out.detach(), ref.detach(), out.dtype, op)
    if op == "softmax" and out.dtype in _autocast.HALF:
        # A half-precision softmax gradient comes from the stored, rounded y, and dy - <dy, y>
        # cancels: judged, as in test_softmax's gradient tests, against float64 on that same y
        # (end to end, one seed in a few thousand put a correct bf16 row 1.4e-2 off).
        dy = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(DEVICE).to(out.dtype)
        (dx,) = torch.autograd.grad(out, x, dy)
        y64, dy64 = out.detach().double(), dy.double()
        assert dx.dtype == x.dtype
        assert_matches(dx, y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True)), x.dtype, f"{op} gradient")
        return
    _check_gradient(out, ref, x, x64, gen, op)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_softmax_topk_takes_the_dtype_of_torchs_pair(dtype, gen):
    # torch.topk(torch.softmax(x, -1), k): float32 values of a half x on CUDA, x's dtype on the CPU.
    # Logits without outliers: a row that one outlier saturates (its top value 1 - 1e-6) makes the
    # gradient p (dv - <dv, p>) cancel: with seed 8034427493830015835 ours and torch's own float32
    # gradient were both 2.5e-2 off float64's. This test is about the dtypes.
    x = make_logits((5, 97), dtype, gen, outliers=False).requires_grad_()
    with _region(torch.bfloat16):
        expected = torch.topk(torch.softmax(x.detach(), -1), 6, -1).values.dtype
        values, indices = onlinesoftmax.softmax_topk(x, 6)
    assert values.dtype == expected, f"softmax_topk of {dtype}: values {values.dtype}, torch {expected}"
    x64 = x.detach().double().requires_grad_()
    ref = torch.softmax(x64, -1).gather(-1, indices)
    assert_matches(values.detach(), ref.detach(), values.dtype, "values")
    _check_gradient(values, ref, x, x64, gen, "softmax_topk")


@pytest.mark.parametrize("inplace", [False, True], ids=["keep", "inplace"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cross_entropy_takes_torchs_dtype(dtype, reduction, inplace, gen):
    logits = make_logits((9, 53), dtype, gen)
    target = make_targets(9, 53, gen, ignore_every=4)
    ref_leaf = logits.double().requires_grad_()
    ref = reference(ref_leaf, target, reduction=reduction)
    leaf = logits.clone().requires_grad_()
    x = leaf.clone() if inplace else leaf  # the in-place gradient overwrites a copy, not the leaf
    with _region(torch.bfloat16):
        expected = F.cross_entropy(logits, target, reduction=reduction).dtype
        loss = onlinesoftmax.cross_entropy(x, target, reduction=reduction, inplace_backward=inplace)
    assert loss.dtype == expected, f"cross_entropy of {dtype}: loss {loss.dtype}, torch {expected}"
    assert_matches(loss.detach(), ref.detach(), loss.dtype, "loss")
    _check_gradient(loss, ref, leaf, ref_leaf, gen, "cross_entropy")


def _within_twice_torchs_error(ours, torchs, ref, what):
    """flash-attention's criterion: within twice the error of torch's own result (or the bf16 bound)."""
    bound = max(TOLERANCE[torch.bfloat16], 2 * relative_error(torchs, ref))
    error = relative_error(ours, ref)
    assert error <= bound, f"{what}: relative error {error:.3e} > {bound:.3e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_takes_the_regions_dtype(causal, gen):
    # float32 q, k, v (a model kept in float32): refused outside a region, taken in bf16 inside one.
    q, k, v = (torch.randn(1, 2, 19, 32, generator=gen).to(DEVICE) for _ in range(3))
    with pytest.raises(TypeError):
        onlinesoftmax.attention(q, k, v)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with _region(torch.bfloat16):
        out = onlinesoftmax.attention(*leaves, causal=causal)
        torch_out = F.scaled_dot_product_attention(*torch_leaves, is_causal=causal)
    assert out.dtype == torch_out.dtype == torch.bfloat16
    ref_leaves = [t.to(torch.bfloat16).double().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_leaves, is_causal=causal)
    _within_twice_torchs_error(out.detach(), torch_out.detach(), ref.detach(), "out")
    upstream = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    for o, ls in ((out, leaves), (torch_out, torch_leaves), (ref, ref_leaves)):
        (o * upstream.to(o.dtype)).sum().backward()
    for name, ours, theirs, r in zip("qkv", leaves, torch_leaves, ref_leaves):
        assert ours.grad.dtype == torch.float32
        _within_twice_torchs_error(ours.grad, theirs.grad, r.grad, f"grad {name}")


def test_attention_with_kvcache_takes_the_regions_dtype(gen):
    # A float32 q (the float32 layer before it) over a bf16 cache: refused outside a region, taken
    # in bf16 inside one, as scaled_dot_product_attention takes it over the same keys; the cache is
    # read as it is, so the result is the call's with q cast first.
    q = torch.randn(2, 1, 4, 32, generator=gen).to(DEVICE)
    k_cache, v_cache = (torch.randn(2, 40, 2, 32, generator=gen).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    lens = torch.tensor([40, 17], dtype=torch.int32).to(DEVICE)
    with pytest.raises(TypeError):
        onlinesoftmax.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)
    expected = onlinesoftmax.attention_with_kvcache(q.to(torch.bfloat16), k_cache, v_cache, cache_seqlens=lens)
    with _region(torch.bfloat16):
        out = onlinesoftmax.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)
        keys, values = (c[:1].transpose(1, 2) for c in (k_cache, v_cache))
        torch_out = F.scaled_dot_product_attention(q[:1].transpose(1, 2), keys, values, enable_gqa=True)
    assert out.dtype == torch_out.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    _within_twice_torchs_error(out[:1].transpose(1, 2), torch_out, F.scaled_dot_product_attention(
        q[:1].transpose(1, 2).to(torch.bfloat16).double(), keys.double(), values.double(), enable_gqa=True), "out")


@pytest.mark.parametrize("plan_kwargs", [dict(chunk=8), dict(vocab_chunk=32)], ids=["chunks", "vocab_slices"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_as_torchs_linear_then_loss(reduction, plan_kwargs, gen):
    # float32 x, weight and bias (refused as mixed dtypes nowhere: all float32), inside a bf16
    # region: torch's F.linear runs in bf16, its cross_entropy in float32.
    x, w = torch.randn(21, 16, generator=gen).to(DEVICE), (torch.randn(75, 16, generator=gen) / 2).to(DEVICE)
    b = torch.randn(75, generator=gen).to(DEVICE)
    target = make_targets(21, 75, gen, ignore_every=5)
    leaves, torch_leaves = ([t.clone().requires_grad_() for t in (x, w, b)] for _ in range(2))
    with _region(torch.bfloat16):
        loss = onlinesoftmax.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], reduction=reduction,
                                                  **plan_kwargs)
        torch_loss = F.cross_entropy(F.linear(*torch_leaves), target, reduction=reduction)
    assert loss.dtype == torch_loss.dtype == torch.float32
    ref_leaves = [t.to(torch.bfloat16).double().requires_grad_() for t in (x, w, b)]
    ref = reference(F.linear(*ref_leaves), target, reduction=reduction)
    _within_twice_torchs_error(loss.detach(), torch_loss.detach(), ref.detach(), "loss")
    upstream = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    for out in (loss, torch_loss, ref):
        (out * upstream.to(out.dtype)).sum().backward()
    for name, ours, theirs, r in zip("xwb", leaves, torch_leaves, ref_leaves):
        assert ours.grad.dtype == torch.float32
        # Computed in bf16 and cast back, as through torch's casts (a float32 run would not round).
        assert torch.equal(ours.grad, ours.grad.to(torch.bfloat16).float()), f"grad {name} is not bf16's"
        _within_twice_torchs_error(ours.grad, theirs.grad, r.grad, f"grad {name}")


def test_compiled_calls_take_the_same_dtypes(gen):
    # Under torch.compile(fullgraph=True) the policy is read while tracing: the same dtypes as eager.
    torch._dynamo.reset()
    logits = make_logits((8, 40), torch.bfloat16, gen)
    target = make_targets(8, 40, gen)
    q = torch.randn(1, 2, 8, 16, generator=gen).to(DEVICE)  # float32: attention takes it in bf16
    h, w = torch.randn(8, 16, generator=gen).to(DEVICE), torch.randn(40, 16, generator=gen).to(DEVICE)

    def step(x, t, q, h, w):
        return (onlinesoftmax.softmax(x, -1), onlinesoftmax.cross_entropy(x, t), onlinesoftmax.attention(q, q, q),
                onlinesoftmax.linear_cross_entropy(h, w, t))

    compiled = torch.compile(step, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    with _region(torch.bfloat16):
        eager = step(logits, target, q, h, w)
        traced = compiled(logits, target, q, h, w)
    for e, c in zip(eager, traced):
        assert c.dtype == e.dtype
        assert_matches(c, e.double(), e.dtype)


def test_policy_is_off_outside_a_region(gen):
    x = make_logits((4, 30), torch.bfloat16, gen)
    assert not _autocast.float32_result("softmax", x)
    assert onlinesoftmax.softmax(x).dtype == torch.bfloat16
    with _region(torch.bfloat16):
        with torch.autocast(DEVICE.type, enabled=False):
            assert onlinesoftmax.log_softmax(x).dtype == torch.bfloat16
