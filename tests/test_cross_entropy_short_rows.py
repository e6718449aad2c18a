"""cross_entropy's short rows (plan strategy "rows": several whole rows a program) against torch in
float64: forward, backward and in place over the options grid, rows that do not fill the last
program, torch's class dim 1 through a view (rows of unit stride), strided classes, edge values,
linear_cross_entropy's chunks and vocabulary slices over few classes, and the plan that takes them
on the GPU."""

from __future__ import annotations

import pytest
import torch

import onlinesoftmax
from onlinesoftmax.ops.cross_entropy import cross_entropy, plan
from onlinesoftmax.ops.cross_entropy import launch as ce_launch

from conftest import TRITON_RUNS, assert_matches, make_logits
from cross_entropy_cases import (OPTIONS, check_loss_and_grad, inplace_upstream, make_targets, option_ids, reference,
                                 resolve_options)

pytestmark = pytest.mark.skipif(not TRITON_RUNS, reason="the Triton kernels need a GPU or TRITON_INTERPRET=1")


@pytest.fixture
def short_rows_plan():
    """Rows of the test sizes on the rows kernel: under the interpreter it is taken only where asked,
    and the GPU's plan takes it from 4 rows an SM."""
    with onlinesoftmax.override_plan("cross_entropy", ROWS_INTERPRETED=True, ROWS_MIN_ROWS_PER_SM=0):
        yield


# 70 rows of 37: tiles of 64 columns in groups, 16 rows a program, the fifth program three eighths
# full; of 3 and of 2: tiles of 4 and 2 columns, 16 and 32 rows a program.
@pytest.mark.parametrize("options", OPTIONS, ids=option_ids)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cols", [37, 3, 2])
def test_short_rows_match_torch(cols, dtype, reduction, options, gen, short_rows_plan):
    print(f"seed {gen.initial_seed()}")
    x = make_logits((70, cols), dtype, gen)
    target = make_targets(70, cols, gen)
    opts = resolve_options(options, cols, gen)
    upstream = inplace_upstream(70, gen) if reduction == "none" else None
    with onlinesoftmax.override_plan("cross_entropy", ROWS_TILE_ELEMENTS={**plan.ROWS_TILE_ELEMENTS, 4: 64, 2: 64}):
        forward, backward = check_loss_and_grad(x, target, dtype, upstream, reduction=reduction, what="kept",
                                                **opts)
    assert (forward.strategy, backward.strategy) == ("rows", "rows")
    block = {37: 64, 3: 4, 2: 2}[cols]
    assert (forward.block, forward.rows_per_program, forward.column_groups) == (
        block, 1024 // block if cols == 37 else 64 // block, plan.ROWS_COLUMN_GROUPS.get(block, 1))
    forward, _ = check_loss_and_grad(x, target, dtype, upstream, inplace=True, reduction=reduction, what="in place",
                                     **opts)
    assert (forward.op, forward.strategy) == ("forward_grad", "rows")


def test_short_rows_return_lse_reads_ignored_rows(gen, short_rows_plan):
    x = make_logits((40, 19), torch.float32, gen)
    target = make_targets(40, 19, gen, ignore_every=3)
    loss, lse = cross_entropy(x, target, reduction="none", return_lse=True)
    assert plan.last_plan().strategy == "rows"
    assert_matches(lse, torch.logsumexp(x.double(), -1), torch.float32, "lse of every row, ignored ones too")
    assert_matches(loss, reference(x, target, reduction="none"), torch.float32, "loss")


@pytest.mark.parametrize("batch", [1, 3], ids=["rows-of-unit-stride", "copied"])
def test_class_dim_1_through_the_module(batch, gen, short_rows_plan):
    # torch's (N, C, d1, d2): N = 1 is a view whose rows (pixels) have unit stride and whose classes
    # stride d1 * d2 (the kernel's loads along the rows: ROWS_UNIT); N = 3 is copied by the reshape.
    # Rows of unit stride at 4 a program: several programs, the last one part full.
    x = make_logits((batch, 11, 6, 7), torch.float32, gen).requires_grad_()
    target = make_targets(batch * 42, 11, gen).reshape(batch, 6, 7)
    with onlinesoftmax.override_plan("cross_entropy", ROWS_UNIT_TILE_ELEMENTS={4: {16: 64}},
                                     ROWS_UNIT_MIN_PROGRAMS_PER_SM=0):
        got = onlinesoftmax.CrossEntropyLoss(label_smoothing=0.1)(x, target)
        forward = plan.last_plan()
        assert (forward.strategy, forward.rows_unit) == ("rows", batch == 1)
        assert forward.rows_per_program == (4 if batch == 1 else 1024 // 16)
        got.backward()
    x64 = x.detach().double().requires_grad_()
    want = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(x64, target)
    assert_matches(got, want, torch.float32, "loss")
    want.backward()
    assert_matches(x.grad, x64.grad, torch.float32, "gradient")


def test_strided_classes(gen, short_rows_plan):
    base = make_logits((30, 2 * 23), torch.bfloat16, gen).requires_grad_()
    target = make_targets(30, 23, gen)
    loss = cross_entropy(base[:, ::2], target, label_smoothing=0.1)
    forward = plan.last_plan()
    loss.backward()
    assert (forward.strategy, forward.contiguous, plan.last_plan().strategy) == ("rows", False, "rows")
    assert forward.column_groups == 1  # (strided classes: the tile's columns in one group)
    x64 = base.detach()[:, ::2].double().requires_grad_()
    want = reference(x64, target, label_smoothing=0.1)
    want.backward()
    assert_matches(loss, want, torch.bfloat16, "loss")
    assert_matches(base.grad[:, ::2], x64.grad, torch.bfloat16, "gradient")
    assert not base.grad[:, 1::2].any()


def test_short_rows_edge_values(gen, short_rows_plan):
    # -inf logits, a row of -inf but its target, an all -inf row (NaN loss, as torch), a NaN, huge
    # magnitudes, and a target out of range (its row NaN, the others untouched).
    x = make_logits((24, 13), torch.float32, gen)
    x[0, 3] = float("-inf")
    x[1] = float("-inf")
    x[2] = float("-inf")
    x[4, 5] = float("nan")
    x[6] *= 1e4
    target = make_targets(24, 13, gen, ignore_every=7)
    target[1], target[2], target[6] = 4, 4, 2
    x[1, 4] = 0.0
    loss = cross_entropy(x, target, reduction="none")
    assert plan.last_plan().strategy == "rows"
    want = reference(x, target, reduction="none")
    assert torch.equal(loss.isnan(), want.isnan()) and torch.equal(loss.isinf(), want.isinf())
    finite = want.isfinite()
    assert_matches(loss[finite], want[finite], torch.float32, "finite rows")
    # A target out of range, as the kernels see it (CPU calls raise first): its row's loss and
    # gradient NaN, the other rows untouched.
    bad = target.clone()
    bad[8] = 13
    grad = x.clone()
    loss, _, _, _ = ce_launch.launch_forward(grad, bad, None, -100, "none", 0.0, 0.0, 0.0, 1.0, False, "rows",
                                             inplace=True)
    assert loss[8].isnan() and grad[8].isnan().all()
    assert torch.equal(loss[9:].isnan(), want[9:].isnan()) and not grad[9:].isnan().any()


def test_short_rows_plans_for_the_gpu():
    def choose(op, rows, cols, strategy=None):
        return plan.choose(op, rows, cols, torch.bfloat16, "cuda", strategy, sms=132, interpreting=False)

    # segmentation's 19 classes: tiles of 32 columns in groups, 32 rows a program, for every op
    for op in ("forward", "forward_grad", "backward"):
        chosen = choose(op, 524288, 19)
        assert (chosen.strategy, chosen.block, chosen.column_groups, chosen.rows_per_program, chosen.grid) == (
            "rows", 32, plan.ROWS_COLUMN_GROUPS[32], 32, (16384,))
    two = choose("forward", 1048576, 2)  # tiles as narrow as the rows
    assert (two.block, two.column_groups, two.rows_per_program) == (2, plan.ROWS_COLUMN_GROUPS.get(2, 1), 512)
    assert choose("forward", 528, 512).strategy == "rows"  # the longest rows at 4 an SM
    assert choose("forward", 527, 512).strategy == "stream"  # fewer rows: a program a row
    assert choose("forward", 4096, 513).strategy == "stream"
    assert choose("stats", 524288, 19).strategy == "stream"  # the shards' statistics keep their kernel
    # torch's class dim 1 at N = 1 (rows of unit stride): tiles of their own, fewer rows where few programs
    for dtype in (torch.bfloat16, torch.float32):
        table = plan.ROWS_UNIT_TILE_ELEMENTS[dtype.itemsize]
        for rows, cols in ((524288, 19), (1048576, 2), (16384, 150), (4096, 19)):
            unit = plan.choose("forward", rows, cols, dtype, "cuda", None, 1, rows, sms=132, interpreting=False)
            block = max(2, 1 << (cols - 1).bit_length())
            assert (unit.strategy, unit.rows_unit, unit.num_warps) == ("rows", True, plan.ROWS_UNIT_WARPS)
            assert unit.rows_per_program == min(table[block] // block, 1 << (rows // 264).bit_length() - 1)
    with pytest.raises(ValueError, match="at most 512 columns"):
        choose("forward", 8, 600, "rows")


@pytest.mark.parametrize("options", [{}, {"reduction": "none"}, {"vocab_chunk": 32},
                                     {"label_smoothing": 0.1, "class_weight": True}],
                         ids=["chunks", "none", "vocabulary-slices", "options"])
def test_linear_cross_entropy_on_short_rows(options, gen, short_rows_plan, monkeypatch):
    # A classifier head's few classes: linear_cross_entropy's chunks (and, by vocabulary slices, their
    # backward at a class offset) take the rows kernel too.
    seen, choose = [], plan.choose
    monkeypatch.setattr(plan, "choose", lambda *args, **kwargs: seen.append(choose(*args, **kwargs)) or seen[-1])
    x = make_logits((40, 16), torch.float32, gen, scale=1.0).requires_grad_()
    w = (make_logits((75, 16), torch.float32, gen, scale=1.0) * 0.75).requires_grad_()
    b = make_logits((75,), torch.float32, gen, scale=1.0).requires_grad_()
    target = make_targets(40, 75, gen, ignore_every=5)
    opts = dict(options)
    class_weight = (torch.rand(75, generator=gen) + 0.5).to(x.device) if opts.pop("class_weight", False) else None
    loss = onlinesoftmax.linear_cross_entropy(x, w, target, b, class_weight=class_weight, **opts)
    upstream = inplace_upstream(40, gen).to(loss.dtype) if loss.dim() else torch.ones(())
    (loss * upstream).sum().backward()
    assert "rows" in {chosen.strategy for chosen in seen}, [chosen.strategy for chosen in seen]
    if "vocab_chunk" in options:
        assert any(c.strategy == "rows" and c.op == "backward" and c.cols == 32 for c in seen)
    params64 = [p.detach().double().requires_grad_() for p in (x, w, b)]
    ref_options = {k: v for k, v in opts.items() if k != "vocab_chunk"}
    want = reference(params64[0] @ params64[1].T + params64[2], target,
                     weight=None if class_weight is None else class_weight.double(), **ref_options)
    (want * upstream.double()).sum().backward()
    assert_matches(loss, want, torch.float32, "loss")
    for name, got, ref in zip(("x", "w", "b"), (x, w, b), params64):
        assert_matches(got.grad, ref.grad, torch.float32, f"grad {name}")


@pytest.mark.parametrize("rows, max_programs", [(20, 1024), (300, 1024), (300, 4)],
                         ids=["one-program", "a-step-a-program", "steps-a-program"])
@pytest.mark.parametrize("options", [{}, {"weight": True, "label_smoothing": 0.1, "z_loss": 1e-2}],
                         ids=["plain", "weights-smoothing-z"])
def test_count_and_reduce_launches_over_programs(rows, max_programs, options, gen):
    # The denominators and the loss over many rows: programs of a chunk of rows each, which the last to
    # arrive sums (a step of 16 rows, as the interpreter's; one program up to two steps). Each launch
    # runs twice: its programs' meeting counter must be left at zero for the next.
    classes = 37
    target = make_targets(rows, classes, gen, ignore_every=4)
    weight = (torch.rand(classes, generator=gen) + 0.5).to(target.device) if options.get("weight") else None
    smoothing, z_loss = options.get("label_smoothing", 0.0), options.get("z_loss", 0.0)
    loss_rows = torch.rand(rows, generator=gen).to(target.device)
    lse = torch.randn(rows, generator=gen).to(target.device) * 3
    valid = target != -100
    w_t = weight[target[valid]].double() if weight is not None else valid[valid].double()
    want_denom = [valid.sum().item(), w_t.sum().item(), weight.double().sum().item() if weight is not None else classes]
    want_loss = loss_rows.double().sum() / want_denom[1] + z_loss * (lse.double()[valid] ** 2).sum() / want_denom[0]
    with onlinesoftmax.override_plan("cross_entropy", REDUCE_LAUNCH_BLOCK=16, REDUCE_LAUNCH_MAX_PROGRAMS=max_programs):
        assert ce_launch.count_recipe(target, target, weight is not None, classes, -100, True).grid[0] == (
            1 if rows == 20 else -(-rows // (16 if max_programs > 100 else 16 * 5)))
        for _ in range(2):
            denom = torch.full((3,), float("nan"), device=target.device)
            ce_launch.count(target, weight, denom, classes, -100, smoothing)
            assert denom.tolist() == pytest.approx(want_denom, rel=1e-6)
            for count_too in (False, True):
                out = torch.full((), float("nan"), device=target.device)
                counted = torch.full((3,), float("nan"), device=target.device) if count_too else denom
                ce_launch.reduce(loss_rows, lse, target, weight, counted, out, classes, -100, "mean", z_loss,
                                 count_too, smoothing)
                assert out.item() == pytest.approx(want_loss.item(), rel=1e-6)
                assert counted[:2].tolist() == pytest.approx(want_denom[:2], rel=1e-6)
