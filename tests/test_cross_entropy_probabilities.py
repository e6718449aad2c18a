"""cross_entropy of probability targets (soft targets, distillation) against torch's in float64:
every option and reduction, gradients in the logits and the targets, the kernels' tiles (rows a
program, steps along a row) and layouts forced and asserted, -inf / NaN / huge logits as torch
gives them, torch.compile, determinism, rows past 2^31 elements (GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax import _device
from onlinesoftmax.ops.cross_entropy import cross_entropy, plan
from onlinesoftmax._device import sm_count
from onlinesoftmax.ops.cross_entropy import probability

from conftest import DEVICE, ON_GPU, assert_matches, gpu_only, make_logits, needs_triton

# Long enough for several steps of a row: PROBABILITY_BLOCK columns at most on the GPU, 64 under
# the interpreter (probability._tiles); odd, so the last step is partial.
LONG_ROW = 2 * probability.PROBABILITY_BLOCK[2] + 3 if ON_GPU else 150


def _targets(shape, gen, dtype=torch.float64):
    """Probability rows (softmax of random numbers): every entry positive, rows summing to 1."""
    return torch.softmax(torch.randn(shape, generator=gen, dtype=torch.float64) * 2, -1).to(DEVICE, dtype)


def _check(x, p, dtype, what, weight=None, reduction="none", **options):
    """Loss and both gradients of ours against float64 on the same (rounded) inputs, the logits in
    x's layout (a clone would make a sliced view contiguous); the plan that ran."""
    leaf = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x).requires_grad_()
    target = p.detach().clone().requires_grad_()
    x64, p64 = x.detach().double().requires_grad_(), p.detach().double().requires_grad_()
    ref = _probability_reference(x64, p64, None if weight is None else weight.double(), reduction, **options)
    out = cross_entropy(leaf, target, weight=weight, reduction=reduction, **options)
    chosen = plan.last_plan()
    g = torch.rand(ref.shape, dtype=torch.float64).to(DEVICE) + 0.5
    (ref * g).sum().backward()
    (out * g.to(out.dtype)).sum().backward()
    assert_matches(out.detach(), ref.detach(), dtype, f"{what} loss")
    assert_matches(leaf.grad, x64.grad, dtype, f"{what} logits' gradient")
    assert_matches(target.grad, p64.grad, p.dtype if p.dtype != torch.float64 else dtype, f"{what} targets' gradient")
    return chosen


def test_torch_compile_fullgraph_probability_targets(gen):
    x = make_logits((6, 40), torch.float32, gen, outliers=False)
    p = torch.softmax(torch.randn((6, 40), generator=gen), -1).to(DEVICE)
    compiled = torch.compile(lambda x, t: cross_entropy(x * 2.0, t, z_loss=1e-3, label_smoothing=0.1), fullgraph=True,
                             backend="inductor" if ON_GPU else "aot_eager")
    leaf = x.clone().requires_grad_()
    out = compiled(leaf, p)
    out.backward()
    x64 = x.double().requires_grad_()
    ref = _probability_reference(2.0 * x64, p.double(), z_loss=1e-3, label_smoothing=0.1)
    ref.backward()
    assert_matches(out.detach().reshape(1), ref.detach().reshape(1), torch.float32, "compiled loss")
    assert_matches(leaf.grad, x64.grad, torch.float32, "compiled grad")




def _probability_reference(x64, p64, weight=None, reduction="mean", label_smoothing=0.0, z_loss=0.0, softcap=None,
                           temperature=1.0):
    """Probability-target cross-entropy in float64: torch's own (class dim 1) where torch has the
    options, with the z term, softcap and temperature applied by hand around it."""
    y = x64 if softcap is None else softcap * torch.tanh(x64 / softcap)
    y = y / temperature
    rows = F.cross_entropy(y.movedim(-1, 1) if y.dim() > 1 else y, p64.movedim(-1, 1) if p64.dim() > 1 else p64,
                           weight=weight, reduction="none", label_smoothing=label_smoothing)
    rows = rows + z_loss * torch.logsumexp(y, -1) ** 2
    return rows if reduction == "none" else rows.sum() if reduction == "sum" else rows.mean()


PROBABILITY_OPTIONS = [dict(), dict(label_smoothing=0.2), dict(weight=True), dict(z_loss=1e-2),
                       dict(softcap=5.0, temperature=0.7), dict(weight=True, label_smoothing=0.1, z_loss=1e-3)]


@pytest.mark.parametrize("options", PROBABILITY_OPTIONS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["fp32", "bf16", "fp64"])
def test_probability_targets_match_torch(dtype, reduction, options, gen):
    # Soft targets (distillation): torch's probability-target loss, its gradients in the logits and
    # in the targets, against float64; leading dims flattened, the class dim last.
    x = make_logits((2, 3, 37), dtype, gen, outliers=False)
    p = torch.softmax(torch.randn((2, 3, 37), generator=gen, dtype=torch.float64), -1).to(DEVICE)
    weight = None
    if options.get("weight"):
        weight = (torch.rand(37, generator=gen, dtype=torch.float64) + 0.5).to(DEVICE, dtype)
    kwargs = {k: v for k, v in options.items() if k != "weight"}
    leaf, target = x.detach().clone().requires_grad_(), p.to(dtype).requires_grad_()
    # The reference takes what ours takes, in float64: the logits, targets and weights rounded to the dtype.
    x64 = x.detach().double().requires_grad_()
    p64 = target.detach().double().requires_grad_()
    ref = _probability_reference(x64, p64, None if weight is None else weight.double(), reduction, **kwargs)
    out = cross_entropy(leaf, target, reduction=reduction, weight=weight, **kwargs)
    assert out.dtype == dtype and out.shape == ref.shape
    g = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(DEVICE, dtype)
    (ref * g.double()).sum().backward()
    (out * g).sum().backward()
    assert_matches(out.detach(), ref.detach(), dtype, "loss")
    assert_matches(leaf.grad, x64.grad, dtype, "logits' gradient")
    assert_matches(target.grad, p64.grad, dtype, "targets' gradient")


def test_probability_targets_lse_one_row_and_empty_batch(gen):
    x = make_logits((4, 50), torch.float32, gen, outliers=False)
    p = torch.softmax(torch.randn((4, 50), generator=gen), -1).to(DEVICE)
    loss, lse = cross_entropy(x, p, return_lse=True)
    assert_matches(lse, torch.logsumexp(x.double(), -1), torch.float32, "lse")
    assert_matches(loss, F.cross_entropy(x.double(), p.double()), torch.float32, "loss")
    # A 1-d row and its 1-d target: a 0-d loss, as torch's.
    assert_matches(cross_entropy(x[0], p[0]), F.cross_entropy(x[0].double(), p[0].double()), torch.float32, "row")
    # An empty batch: "mean" is NaN, "sum" 0, as torch's.
    empty = torch.empty(0, 50, device=DEVICE)
    assert cross_entropy(empty, empty).isnan() and cross_entropy(empty, empty, reduction="sum") == 0


def test_probability_targets_refuse_what_needs_class_indices(gen):
    x = make_logits((4, 10), torch.float32, gen)
    p = torch.softmax(torch.randn((4, 10), generator=gen), -1).to(DEVICE)
    for option in (dict(ignore_index=3), dict(inplace_backward=True), dict(gradient_in_forward=True),
                   dict(strategy="stream")):
        with pytest.raises(ValueError, match="needs class-index targets"):
            cross_entropy(x, p, **option)
    with pytest.raises(ValueError, match="probability targets must have the logits' shape"):
        cross_entropy(x, p[:, :5])
    with pytest.raises(TypeError, match="cross_entropy takes them"):
        onlinesoftmax.linear_cross_entropy(x, torch.randn(7, 10, device=DEVICE), p[:, :7])


def _forward_vectors(rows, classes, element_size):
    """(on vectors, with edges) of the forward's plan: rows of one GPU tile with partial vectors
    (601, 1021) keep tiles from their first column; 1000 is whole vectors, no multiple of 16."""
    if (rows, classes) == (2, 1000):
        return True, False
    if (rows, classes) == (3, LONG_ROW) and ON_GPU:
        tiles = -(-classes // probability.PROBABILITY_BLOCK[element_size])
        vectors = tiles >= probability.FORWARD_EDGE_TILES[element_size]
        return vectors, vectors
    return False, False


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("rows, classes", [(1, 5), (7, 37), (3, LONG_ROW), (33, 129), (17, 601), (2, 1000), (5, 1021)])
def test_probability_kernels_tiles(dtype, rows, classes, gen, forward_edges=False):
    # Rows a program (short rows share a tile, the last tile partial), several steps along a long
    # row, few rows cut into chunks and merged, odd class counts; rows held one a program (over 512
    # classes) on 16-byte vectors, their partial first and last vectors element-wise where rows
    # start or end inside one (the backward's at 601 whole rows and 1021 cut into chunks under the
    # interpreter; the forward's at LONG_ROW on the GPU, or forward_edges), whole vectors (1000);
    # every option at once, the forward's plan asserted.
    x = make_logits((rows, classes), dtype, gen, outliers=False)
    weight = (torch.rand(classes, generator=gen, dtype=torch.float64) + 0.5).to(DEVICE, dtype)
    chosen = _check(x, _targets((rows, classes), gen, dtype), dtype, f"{rows}x{classes}", weight=weight,
                    label_smoothing=0.1, z_loss=1e-2, softcap=6.0, temperature=0.8)
    assert chosen.strategy == "probability_rows" and (chosen.rows, chosen.cols) == (rows, classes)
    if (rows, classes) == (3, LONG_ROW):
        assert chosen.num_chunks > 1, "three long rows are cut into chunks, whose stats a kernel merges"
    if (rows, classes) == (7, 37):
        assert chosen.num_chunks == 1
    edges = forward_edges or _forward_vectors(rows, classes, x.element_size())[1]
    assert (chosen.align > 1, chosen.edges) == (edges or (rows, classes) == (2, 1000), edges)
    if (rows, classes) in ((5, 1021), (17, 601)):
        assert (chosen.num_chunks > 1) == (classes == 1021 and not ON_GPU)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows, classes", [(17, 601), (5, 1021)])
def test_probability_forward_edges_on_short_rows(dtype, rows, classes, gen, monkeypatch):
    # The forward's partial first and last vectors, which the plan gives rows of at least
    # FORWARD_EDGE_TILES tiles (2-4 GPU tiles: thousands of columns, slow under the interpreter),
    # forced on rows of one: whole rows (601), and under the interpreter rows cut into chunks
    # (1021), whose first chunk takes the edges.
    monkeypatch.setattr(probability, "FORWARD_EDGE_TILES", {2: 1, 4: 1})
    monkeypatch.setattr(probability, "_FORWARD_CALLS", {})  # (calls prepared under the plan's rule)
    test_probability_kernels_tiles(dtype, rows, classes, gen, forward_edges=True)


@needs_triton
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("rows, classes", [(33, 37), (300 if ON_GPU else 3, LONG_ROW)], ids=["programs", "chunks"])
def test_probability_kernels_reduce_rows(rows, classes, reduction, gen):
    # "mean" and "sum" come from a launch of their own, in the loss's dtype, after the rows' losses
    # of several programs (the forward's, or the merge's where rows are cut into chunks; the
    # buffers are NaN-poisoned in the tests) over rows of several reduce steps under the
    # interpreter (33 rows). Only the targets asking for a gradient: the logits' is not written (the
    # kernel's pointer for it is then the logits' own, which must come out unchanged).
    x = make_logits((rows, classes), torch.bfloat16, gen, outliers=False)
    logits = x.clone()
    p = _targets((rows, classes), gen, torch.bfloat16).requires_grad_()
    layout = probability.layout(rows, classes, 2, sm_count(x.device), contiguous=True, forward=True)
    assert (classes == LONG_ROW) == (layout.chunks > 1)
    writing = layout.rows if layout.chunks == 1 else probability.MERGE_ROWS  # rows a program of the rows' losses
    assert (rows + writing - 1) // writing > 1 or not ON_GPU
    x64, p64 = x.double(), p.detach().double().requires_grad_()
    ref = _probability_reference(x64, p64, reduction=reduction, z_loss=1e-2)
    out = cross_entropy(x, p, reduction=reduction, z_loss=1e-2)
    assert out.dtype == torch.bfloat16 and out.shape == ()
    out.backward(torch.tensor(1.5, dtype=torch.bfloat16, device=DEVICE))
    ref.backward(torch.tensor(1.5, dtype=torch.float64, device=DEVICE))
    assert_matches(out.detach(), ref.detach(), torch.bfloat16, "reduced loss")
    assert_matches(p.grad, p64.grad, torch.bfloat16, "targets' gradient")
    assert plan.last_plan().strategy == "probability_rows" and torch.equal(x, logits)


@needs_triton
def test_probability_kernels_layouts_and_mixed_dtypes(gen):
    # Rows of a wider tensor (row stride past the class count), a transposed view (copied to unit
    # column stride), leading dims merged, float32 targets of bf16 logits (a float32 loss, as torch's
    # promotion gives).
    wide = make_logits((6, LONG_ROW + 9), torch.float32, gen, outliers=False)
    p = _targets((6, LONG_ROW), gen, torch.float32)
    assert wide[:, 3:LONG_ROW + 3].stride(0) == LONG_ROW + 9
    assert _check(wide[:, 3:LONG_ROW + 3], p, torch.float32, "row-strided").strategy == "probability_rows"
    columns = make_logits((40, 5), torch.float32, gen, outliers=False)
    assert _check(columns.t(), _targets((5, 40), gen, torch.float32).t().contiguous().t(), torch.float32,
                  "column-strided").strategy == "probability_rows"
    # Contiguous rows from a pointer off 16 bytes: tiles on the vectors the offsets give (correct
    # whatever the pointer; 16-byte loads where it is aligned).
    flat = make_logits((3 * 4099 + 1,), torch.bfloat16, gen, outliers=False)
    assert _check(flat[1:].view(3, 4099), _targets((3, 4099), gen, torch.bfloat16), torch.bfloat16,
                  "pointer off 16 bytes").align == 8
    x = make_logits((2, 3, 4, 37), torch.bfloat16, gen, outliers=False)
    out = cross_entropy(x, _targets((2, 3, 4, 37), gen, torch.float32), reduction="none")
    assert out.dtype == torch.float32 and out.shape == (2, 3, 4)
    _check(x, _targets((2, 3, 4, 37), gen, torch.float32), torch.bfloat16, "bf16 logits, fp32 targets",
           reduction="mean")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_probability_targets_edge_values(dtype, gen):
    # torch's values where the log-probabilities are not finite: a -inf logit with a positive
    # target gives +inf, with a zero target NaN (0 * -inf); an all -inf row NaN; a NaN or +inf logit
    # NaN. Rows of +-3000 (float32 only): the rows' sums kept relative to the running max keep
    # their precision where the logits' magnitude dwarfs the loss.
    classes = LONG_ROW
    x = make_logits((7, classes), dtype, gen, outliers=False)
    p = _targets((7, classes), gen, dtype)
    x[0, 5] = float("-inf")
    x[1, 5], p[1, 5] = float("-inf"), 0.0
    x[2] = float("-inf")
    x[3, classes - 1] = float("nan")
    x[4, 1] = float("inf")
    if dtype == torch.float32:
        x[5] += 3000.0
        x[6, : classes // 2] -= 3000.0
    ref = F.cross_entropy(x.double(), p.double(), reduction="none")
    out = cross_entropy(x, p, reduction="none")
    assert_matches(out, ref, dtype, "loss")
    assert out[0] == float("inf") and out[1:5].isnan().all()


@needs_triton
def test_probability_kernels_deterministic(gen):
    x = make_logits((9, LONG_ROW), torch.bfloat16, gen, outliers=False)
    p = _targets((9, LONG_ROW), gen, torch.bfloat16)
    runs = []
    for _ in range(2):
        leaf, target = x.clone().requires_grad_(), p.clone().requires_grad_()
        loss = cross_entropy(leaf, target, z_loss=1e-3)
        loss.backward()
        runs.append((loss, leaf.grad, target.grad))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@gpu_only
@pytest.mark.slow
def test_probability_targets_more_than_2_to_the_31_elements():
    # 2049 x (2^20 + 3) bf16 = 2^31 + 2^21 + ... elements; int32 offsets would wrap in the last rows,
    # which are checked against float64 (loss and logits' gradient).
    rows, classes = 2049, 2 ** 20 + 3
    if torch.cuda.get_device_properties(0).total_memory < 4 * rows * classes * 2:
        pytest.skip("needs ~18 GB of GPU memory")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, classes, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    p = torch.rand(rows, classes, device="cuda", dtype=torch.bfloat16, generator=gen) * (2.0 / classes)
    loss = cross_entropy(x, p, reduction="sum")
    loss.backward()
    tail = x.detach()[-2:].double().requires_grad_()
    ref = F.cross_entropy(tail, p[-2:].double(), reduction="none")
    ref.sum().backward()
    rows_loss = cross_entropy(x.detach()[-2:], p[-2:], reduction="none")
    assert_matches(rows_loss, ref.detach(), torch.bfloat16, "loss")
    assert_matches(x.grad[-2:], tail.grad, torch.bfloat16, "gradient")


@needs_triton
def test_probability_opcheck(gen):
    # The custom ops torch.compile sees: schemas, fake implementations, no aliasing.
    x = make_logits((5, 30), torch.float32, gen, outliers=False)
    p = _targets((5, 30), gen, torch.bfloat16)
    weight = torch.rand(30, generator=gen).to(DEVICE)
    for reduction, loss_dtype in (("none", torch.float32), ("mean", torch.float32), ("sum", torch.bfloat16)):
        torch.library.opcheck(probability._forward_op, (x, p, weight, 0.1, 1e-3, 5.0, 0.7, reduction, loss_dtype))
    stats, _ = probability._forward_op(x, p, None, 0.0, 0.0, 0.0, 1.0, "none", torch.float32)
    upstream = torch.rand(5, generator=gen).to(DEVICE)
    for logit_grad, target_grad in ((True, False), (True, True), (False, True)):
        torch.library.opcheck(probability._backward_op, (x, p, None, stats, upstream, 1.0, 0.0, 0.0, 0.0, 1.0,
                                                         logit_grad, target_grad))


@gpu_only
def test_probability_cuda_graph_capture_and_replay(gen):
    # The prepared launches (merged chunks included: 4 rows of 50257) replayed from a CUDA graph on
    # new inputs copied into the captured ones. On Hopper the merge and the reduction are launched
    # programmatically dependent, scheduled while the kernel before them runs: replayed, they come
    # soonest, and without their waits this test fails (eager calls of long rows did not show it).
    assert _device.programmatic_launch(torch.device(DEVICE)) == (torch.cuda.get_device_capability()[0] >= 9)
    x = make_logits((4, 50257), torch.bfloat16, gen, outliers=False).requires_grad_()
    p = _targets((4, 50257), gen, torch.bfloat16)
    for _ in range(2):  # warm-up: compile and prepare outside the capture
        torch.autograd.grad(cross_entropy(x, p), x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = cross_entropy(x, p)
        (grad,) = torch.autograd.grad(loss, x)
    with torch.no_grad():
        x.copy_(make_logits((4, 50257), torch.bfloat16, gen, outliers=False))
        p.copy_(_targets((4, 50257), gen, torch.bfloat16))
    graph.replay()
    x64 = x.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, p.double())
    ref.backward()
    assert_matches(loss.detach(), ref.detach(), torch.bfloat16, "replayed loss")
    assert_matches(grad, x64.grad, torch.bfloat16, "replayed gradient")
    assert plan.last_plan().num_chunks > 1
