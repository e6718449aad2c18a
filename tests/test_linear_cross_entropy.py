"""linear_cross_entropy against torch in float64: the chunk plan, chunked, one-chunk and
vocabulary-sliced runs in every reduction, options and partial gradients, the float32 accumulation
of grad W, the kernels it runs its chunks and slices through, and its argument errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from onlinesoftmax.ops.cross_entropy import linear_compile, linear_cross_entropy, linear_plan, plan

from conftest import DEVICE, ON_GPU, TOLERANCE, assert_matches, needs_triton, relative_error
from cross_entropy_cases import OPTIONS, make_targets, option_ids, reference, resolve_options


def test_linear_chunk_rows():
    # One chunk where its peak (all logits + grad W) is no higher than the chunks' (the fp32 grad-W
    # accumulator + the larger of a chunk and grad W): 3.15 GB each at 8192 x 128256, H 4096; 1.23
    # against 1.35 GB at 8192 x 50257; 3.6 against 3.15 GB at 10000 x 128256. Chunks with the
    # accumulator take as many rows as grad W's bytes (1.05 GB: 4096 rows), at no higher peak.
    assert linear_plan.linear_chunk_rows(8192, 128256, 4096, torch.bfloat16, True, "auto") == 8192
    assert linear_plan.linear_chunk_rows(8192, 50257, 4096, torch.bfloat16, True, "auto") == 8192
    assert linear_plan.linear_chunk_rows(10000, 128256, 4096, torch.bfloat16, True, "auto") == 4096
    assert linear_plan.linear_chunk_rows(16384, 128256, 4096, torch.bfloat16, True, "auto") == 4096
    assert linear_plan.linear_chunk_rows(16384, 32000, 4096, torch.bfloat16, True, "auto") == 8320  # the 512 MiB budget
    # No accumulator (no weight gradient, or an fp32 weight whose gradient accumulates in place):
    # chunks of the budget.
    assert linear_plan.linear_chunk_rows(8192, 128256, 4096, torch.bfloat16, False, "auto") == 2048
    assert linear_plan.linear_chunk_rows(8192, 32000, 4096, torch.float32, False, "auto") == 4096
    assert linear_plan.linear_chunk_rows(100, 128256, 4096, torch.bfloat16, False, "auto") == 100
    assert linear_plan.linear_chunk_rows(8192, 128256, 4096, torch.bfloat16, True, 300) == 300


def test_linear_vocab_chunk():
    # "auto": the most classes (a multiple of 64) whose logits over all the rows take 256 MiB.
    assert linear_plan.linear_vocab_chunk(8192, 128256, torch.bfloat16, "auto") == 16384
    assert linear_plan.linear_vocab_chunk(8192, 128256, torch.float32, "auto") == 8192
    assert linear_plan.linear_vocab_chunk(100, 128256, torch.bfloat16, "auto") == 128256  # one slice
    assert linear_plan.linear_vocab_chunk(10**7, 128256, torch.bfloat16, "auto") == 64  # at least one multiple
    assert linear_plan.linear_vocab_chunk(8192, 128256, torch.bfloat16, 1000) == 1000
    assert linear_plan.linear_vocab_chunk(8192, 300, torch.bfloat16, 1000) == 300


def test_linear_vocab_parts():
    # The matmuls take a vocabulary of no multiple of 64 as its aligned part and a tail (the tests'
    # V = 75 runs both: 64 + 11); the logits buffer's rows are padded to the multiple.
    assert linear_plan.linear_vocab_parts(50257) == ((0, 50240), (50240, 50257))
    assert linear_plan.linear_vocab_parts(75) == ((0, 64), (64, 75))
    assert linear_plan.linear_vocab_parts(128256) == ((0, 128256),)
    assert linear_plan.linear_vocab_parts(40) == ((0, 40),)
    assert linear_plan.linear_logits_width(50257) == 50304 and linear_plan.linear_logits_width(128256) == 128256


def _linear_case(rows, hidden, vocab, dtype, gen, bias=True):
    x = torch.randn(rows, hidden, generator=gen).to(dtype).to(DEVICE)
    w = (torch.randn(vocab, hidden, generator=gen) / math.sqrt(hidden) * 3).to(dtype).to(DEVICE)
    b = (torch.randn(vocab, generator=gen)).to(dtype).to(DEVICE) if bias else None
    return x, w, b, make_targets(rows, vocab, gen, ignore_every=5)


def _linear_reference(x, w, b, target, upstream, **options):
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, w, b)]
    logits = leaves[0] @ leaves[1].T + (leaves[2] if b is not None else 0)
    class_weight = options.pop("class_weight", None)
    loss = reference(logits, target, weight=class_weight, **options)
    (loss * upstream).sum().backward()
    return loss.detach(), [t.grad if t is not None else None for t in leaves]


# Chunks of rows with the fp32 grad-W accumulator, one chunk (one matmul), and slices of the
# vocabulary over all the rows: 75 classes as 32 + 32 + 11 (a last slice narrower than the buffer),
# or 64 + 11 in one slice (its matmuls' aligned part and tail).
PLANS = {"chunks": dict(chunk=8), "one_chunk": dict(chunk=1000), "vocab_slices": dict(vocab_chunk=32),
         "one_vocab_slice": dict(vocab_chunk="auto")}


@pytest.mark.parametrize("plan_kwargs", PLANS.values(), ids=PLANS.keys())
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_linear_matches_torch(reduction, dtype, plan_kwargs, gen):
    _check_linear(reduction, dtype, plan_kwargs, gen)


@needs_triton
@pytest.mark.parametrize("reduction", ["mean", "sum"])  # ("none" recomputes the logits in its backward)
def test_linear_chunks_through_the_separate_launches(reduction, gen, monkeypatch):
    # A chunk's in-place kernel as its "separate" launches (the forward's stream kernel, then the
    # backward kernel over the logits buffer), the plan few long rows take on the GPU.
    choose, ran = plan.choose, set()

    def separate(op, rows, cols, dtype, device, strategy=None, *args, **kwargs):
        chosen = choose(op, rows, cols, dtype, device, "separate" if op == "forward_grad" else strategy, *args, **kwargs)
        ran.update((p.op, p.strategy) for p in (chosen,) + chosen.parts)
        return chosen

    monkeypatch.setattr(plan, "choose", separate)
    _check_linear(reduction, torch.bfloat16, dict(chunk=8), gen)
    assert {("forward_grad", "separate"), ("forward", "stream"), ("backward", "backward")} <= ran, ran


def _check_linear(reduction, dtype, plan_kwargs, gen):
    """Loss and gradients of a linear_cross_entropy call (29 rows, H 16, V 75, every option) against float64."""
    x, w, b, target = _linear_case(29, 16, 75, dtype, gen)
    upstream = (torch.randn(29, generator=gen, dtype=torch.float64) if reduction == "none" else torch.tensor(0.7)).to(DEVICE)
    options = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3)
    ref, ref_grads = _linear_reference(x, w, b, target, upstream, **options)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    out = linear_cross_entropy(*leaves[:2], target, leaves[2], **plan_kwargs, **options)
    (out * upstream.to(out.dtype)).sum().backward()
    assert_matches(out.detach(), ref, dtype, "loss")
    bound = _gradient_bound(x, w, b, target, upstream, options, ref_grads)
    for name, leaf, grad in zip("xwb", leaves, ref_grads):
        assert leaf.grad.dtype == dtype
        error = relative_error(leaf.grad, grad)
        assert error <= bound, f"grad {name}: relative error {error:.3e} > {bound:.3e}"


def _gradient_bound(x, w, b, target, upstream, options, ref_grads):
    """bf16 gradients: the logits' gradient is rounded to bf16 before each matrix product, so the
    bound is flash-attention's: within twice what the same math in bf16 torch gives (or the table)."""
    bound = TOLERANCE[x.dtype]
    if x.dtype == torch.bfloat16:
        torch_leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        logits = torch_leaves[0] @ torch_leaves[1].T + torch_leaves[2]
        loss = reference(logits.float(), target, **options).to(x.dtype)
        (loss * upstream.to(x.dtype)).sum().backward()
        torch_error = max(relative_error(t.grad, g) for t, g in zip(torch_leaves, ref_grads))
        bound = max(bound, 2 * torch_error)
    return bound


# (dtype, grads): bf16 for its float32 grad-W accumulator and its gradients' rounding.
@pytest.mark.parametrize("dtype,grads", [(torch.float32, "all"), (torch.float32, "weight"), (torch.bfloat16, "all")],
                         ids=["fp32-all", "fp32-weight", "bf16-all"])
@pytest.mark.parametrize("plan_kwargs", [dict(chunk=8), {}, dict(vocab_chunk=32)],
                         ids=["chunks", "one_chunk", "vocab_slices"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_compile_fullgraph(reduction, plan_kwargs, dtype, grads, gen):
    # The compiled call is two custom ops ("mean" over row chunks: the forward op computes the
    # gradients; otherwise the backward op recomputes the logits): loss, lse and the gradients
    # asked for against float64, as the eager call's.
    torch._dynamo.reset()
    x, w, b, target = _linear_case(29, 16, 75, dtype, gen)
    upstream = (torch.randn(29, generator=gen, dtype=torch.float64) if reduction == "none"
                else torch.tensor(0.7)).to(DEVICE)
    options = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3)
    ref, ref_grads = _linear_reference(x, w, b, target, upstream, **options)
    compiled = torch.compile(lambda x, w, b, t: linear_cross_entropy(x, w, t, b, return_lse=True, **plan_kwargs,
                                                                     **options),
                             fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    leaves = [t.clone().requires_grad_(grads == "all" or name == "w") for name, t in zip("xwb", (x, w, b))]
    out, lse = compiled(*leaves, target)
    (out * upstream.to(out.dtype)).sum().backward()
    assert_matches(out.detach(), ref, dtype, "loss")
    assert_matches(lse, torch.logsumexp(x.double() @ w.double().T + b.double(), -1), dtype, "lse")
    bound = _gradient_bound(x, w, b, target, upstream, options, ref_grads)
    for name, leaf, grad in zip("xwb", leaves, ref_grads):
        if leaf.requires_grad:
            assert leaf.grad.dtype == dtype
            error = relative_error(leaf.grad, grad)
            assert error <= bound, f"grad {name}: relative error {error:.3e} > {bound:.3e}"
        else:
            assert leaf.grad is None


def test_linear_custom_ops_pass_opcheck(gen):
    x, w, b, target = _linear_case(9, 8, 20, torch.bfloat16, gen)
    # Chunks of 4 rows (the gradients in the forward op, or not asked for); vocabulary slices of 8 classes.
    for plan_codes, wanted in (((4, -1), (True, True, True)), ((4, -1), (False,) * 3), ((0, 8), (True, False, True))):
        options = (-100, "mean", 0.1, 0.0, 0.0, 1.0, False, *plan_codes, None)
        torch.library.opcheck(linear_compile._traced_forward_op, (x, w, b, target, None, *options, *wanted, True))
        _, lse_parts, denom, *_ = linear_compile._traced_forward_op(x, w, b, target, None, *options, *wanted, False)
        upstream = torch.tensor(0.5, device=DEVICE)
        torch.library.opcheck(linear_compile._traced_backward_op,
                              (x, w, b, target, None, lse_parts, denom, upstream, *options, *wanted))


@pytest.mark.parametrize("plan_kwargs", [dict(chunk=6), dict(vocab_chunk=16)], ids=["chunks", "vocab_slices"])
@pytest.mark.parametrize("options", [OPTIONS[3], OPTIONS[-1]], ids=option_ids)
def test_linear_options_and_partial_grads(options, plan_kwargs, gen):
    x, w, _, target = _linear_case(20, 8, 40, torch.float32, gen, bias=False)
    options = resolve_options(options, 40, gen)
    options["class_weight"] = options.pop("weight", None)
    ref, (gx, gw, _) = _linear_reference(x, w, None, target, torch.tensor(1.0), **dict(options))
    w_leaf = w.clone().requires_grad_()  # x needs no gradient: only grad W is computed
    out = linear_cross_entropy(x, w_leaf, target, **plan_kwargs, **options)
    out.backward()
    assert_matches(out.detach(), ref, torch.float32, "loss")
    assert_matches(w_leaf.grad, gw, torch.float32, "grad w")


@pytest.mark.parametrize("plan_kwargs", [{}, dict(vocab_chunk=16)], ids=["auto", "vocab_slices"])
def test_linear_leading_dims_return_lse_and_no_grad(plan_kwargs, gen):
    # The lse of every row, ignored ones included.
    x, w, b, target = _linear_case(12, 8, 30, torch.float32, gen)
    x3, t2 = x.reshape(3, 4, 8), target.reshape(3, 4)
    loss, lse = linear_cross_entropy(x3, w, t2, b, reduction="none", return_lse=True, **plan_kwargs)
    assert loss.shape == (3, 4) and lse.shape == (3, 4)
    logits = x.double() @ w.double().T + b.double()
    assert_matches(loss.reshape(-1), reference(logits, target, reduction="none"), torch.float32, "loss")
    assert_matches(lse.reshape(-1), torch.logsumexp(logits, -1), torch.float32, "lse")


@pytest.mark.parametrize("plan_kwargs", [{}, dict(vocab_chunk=4)], ids=["auto", "vocab_slices"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_empty_batch(reduction, plan_kwargs):
    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(10, 8, device=DEVICE, requires_grad=True)
    out = linear_cross_entropy(x, w, torch.zeros(0, dtype=torch.int64, device=DEVICE), reduction=reduction,
                               **plan_kwargs)
    ref = F.cross_entropy(torch.zeros(0, 10, dtype=torch.float64), torch.zeros(0, dtype=torch.int64),
                          reduction=reduction)
    assert out.shape == ref.shape and torch.equal(torch.isnan(out).cpu(), torch.isnan(ref))
    out.sum().backward()
    assert x.grad.shape == (0, 8) and torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize("plan_kwargs", [dict(chunk=1), dict(vocab_chunk=16)], ids=["chunks", "vocab_slices"])
def test_linear_grad_weight_accumulates_in_float32(plan_kwargs, gen):
    # 512 chunks of one row, every row of one class and positive hidden states: each entry of grad W
    # sums 512 contributions of one sign, so a bfloat16 running sum loses the later ones (each
    # addition rounds to 8 bits). Ours adds them in float32 and rounds once. The test computes the
    # bfloat16 accumulation's error itself, so it is known to fail an implementation doing that:
    # 2.7e-2 to 6.0e-2 over 200 seeds (above the table's 1e-2; 1024 rows in chunks of two, as the
    # test had them, 3.7e-2 to 9.7e-2 at twice the interpreter's time), against ours at 3.9e-3 to
    # 4.5e-3 under the interpreter (vocabulary slices 2.5e-3 to 3.0e-3). Vocabulary slices take grad
    # W as one matrix product over all the rows, accumulated in float32 inside it.
    rows, hidden, vocab, chunk = 512, 16, 32, 1
    x = (torch.rand(rows, hidden, generator=gen) + 0.5).to(torch.bfloat16)
    w = (torch.randn(vocab, hidden, generator=gen) / 4).to(torch.bfloat16)
    target = torch.zeros(rows, dtype=torch.int64)
    w64 = w.double().requires_grad_()
    F.cross_entropy(x.double() @ w64.T, target, reduction="sum").backward()
    w_leaf = w.to(DEVICE).requires_grad_()
    linear_cross_entropy(x.to(DEVICE), w_leaf, target.to(DEVICE), reduction="sum", **plan_kwargs).backward()
    ours = ((w_leaf.grad.cpu().double() - w64.grad).norm() / w64.grad.norm()).item()
    # A bfloat16 accumulator, fed each chunk's contribution from its bfloat16 logit gradients.
    acc = torch.zeros(vocab, hidden, dtype=torch.bfloat16)
    for start in range(0, rows, chunk):
        x_chunk = x[start:start + chunk].float()
        dlogits = torch.softmax((x_chunk @ w.float().T).to(torch.bfloat16).float(), -1)
        dlogits[:, 0] -= 1
        acc = (acc.float() + dlogits.to(torch.bfloat16).float().T @ x_chunk).to(torch.bfloat16)
    bf16_accumulation = ((acc.double() - w64.grad).norm() / w64.grad.norm()).item()
    assert bf16_accumulation > TOLERANCE[torch.bfloat16], f"the test cannot fail: {bf16_accumulation:.2e}"
    assert ours < min(bf16_accumulation / 4, TOLERANCE[torch.bfloat16]), \
        f"grad W error {ours:.2e} vs bf16 accumulation {bf16_accumulation:.2e}"


@needs_triton
def test_linear_chunks_use_the_in_place_kernel(gen, monkeypatch):
    # V = 203: the logits buffer's rows are padded to 256 elements (the matmuls' leading dimension),
    # and each chunk's kernel is planned for the strides it runs on.
    x, w, b, target = _linear_case(10, 8, 203, torch.bfloat16, gen)
    assert linear_plan.linear_logits_width(203) == 256 and linear_plan.linear_logits_width(256) == 256
    strides = []
    choose = plan.choose

    def spy(op, rows, cols, dtype, device, strategy=None, row_stride=None, col_stride=1, **kwargs):
        strides.append((op, cols, row_stride, col_stride))
        return choose(op, rows, cols, dtype, device, strategy, row_stride, col_stride, **kwargs)

    monkeypatch.setattr(plan, "choose", spy)
    linear_cross_entropy(x, w.requires_grad_(), target, b, chunk=4)
    assert plan.last_plan().op == "forward_grad"
    with torch.no_grad():
        linear_cross_entropy(x, w, target, b, chunk=4)
    assert plan.last_plan().op == "forward"
    assert set(strides) == {("forward_grad", 203, 256, 1), ("forward", 203, 256, 1)}, strides


@needs_triton
def test_linear_vocab_slices_run_the_shard_kernels_and_are_deterministic(gen, monkeypatch):
    # V = 203 in slices of 64: the last (11 classes) is narrower than the buffer; each slice's
    # statistics and gradient take the kernels with the slice's class offset. Two runs agree bit
    # for bit.
    x, w, b, target = _linear_case(10, 8, 203, torch.bfloat16, gen)
    ops = []
    choose = plan.choose

    def spy(op, rows, cols, dtype, device, strategy=None, row_stride=None, col_stride=1, **kwargs):
        ops.append((op, cols, row_stride))
        return choose(op, rows, cols, dtype, device, strategy, row_stride, col_stride, **kwargs)

    monkeypatch.setattr(plan, "choose", spy)
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        loss = linear_cross_entropy(*leaves[:2], target, leaves[2], vocab_chunk=64, label_smoothing=0.1)
        loss.backward()
        runs.append([loss.detach()] + [t.grad for t in leaves])
    assert set(ops) == {("stats", 64, 64), ("stats", 11, 64), ("backward", 64, 64), ("backward", 11, 64)}, ops
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@needs_triton
@pytest.mark.parametrize("plan_kwargs", [dict(chunk=4), dict(vocab_chunk=64)], ids=["chunks", "vocab_slices"])
def test_linear_torch_strategy_reaches_the_backward(plan_kwargs, gen, monkeypatch):
    # strategy="torch" runs torch's ops for the loss and, where the backward recomputes the logits
    # ("none" with chunks, every reduction with slices), for their gradient too.
    x, w, b, target = _linear_case(10, 8, 203, torch.float32, gen)
    strategies = []
    choose = plan.choose

    def spy(op, rows, cols, dtype, device, strategy=None, *args, **kwargs):
        strategies.append((op, strategy))
        return choose(op, rows, cols, dtype, device, strategy, *args, **kwargs)

    monkeypatch.setattr(plan, "choose", spy)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    loss = linear_cross_entropy(*leaves[:2], target, leaves[2], reduction="none", strategy="torch", **plan_kwargs)
    loss.sum().backward()
    assert ("backward", "torch") in strategies and ("backward", None) not in strategies, strategies
    ref, ref_grads = _linear_reference(x, w, b, target, torch.ones(10, dtype=torch.float64, device=DEVICE),
                                       reduction="none")
    assert_matches(loss.detach(), ref, torch.float32, "loss")
    for name, leaf, grad in zip("xwb", leaves, ref_grads):
        assert_matches(leaf.grad, grad, torch.float32, f"grad {name}")


def test_linear_strided_class_weight(gen):
    # class_weight as a view with a stride: taken contiguous, as cross_entropy's weight.
    x, w, b, target = _linear_case(12, 8, 75, torch.float32, gen)
    class_weight = torch.rand(150, generator=gen).to(DEVICE)[::2]
    out = linear_cross_entropy(x, w, target, b, class_weight=class_weight, label_smoothing=0.1, chunk=5)
    ref = reference((x.double() @ w.double().T + b.double()), target, weight=class_weight, label_smoothing=0.1)
    assert_matches(out, ref, torch.float32, "loss")


def test_linear_argument_errors():
    x, w, t = torch.randn(4, 8), torch.randn(10, 8), torch.tensor([1, 2, 3, 4])
    with pytest.raises(ValueError, match="same H"):
        linear_cross_entropy(x, torch.randn(10, 7), t)
    with pytest.raises(TypeError, match="dtype"):
        linear_cross_entropy(x, w.half(), t)
    with pytest.raises(ValueError, match="chunk"):
        linear_cross_entropy(x, w, t, chunk=0)
    with pytest.raises(ValueError, match="vocab_chunk"):
        linear_cross_entropy(x, w, t, vocab_chunk=0)
    with pytest.raises(TypeError, match="vocab_chunk"):
        linear_cross_entropy(x, w, t, vocab_chunk="all")
    with pytest.raises(ValueError, match="exclude each other"):
        linear_cross_entropy(x, w, t, chunk=2, vocab_chunk=4)
    with pytest.raises(ValueError, match="bias"):
        linear_cross_entropy(x, w, t, torch.randn(9))
    with pytest.raises(ValueError, match="out of range"):
        linear_cross_entropy(x, w, torch.tensor([1, 2, 3, 10]))
