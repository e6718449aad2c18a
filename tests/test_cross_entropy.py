"""cross_entropy against torch in float64: every strategy forced and
asserted, every option, the reductions with their upstream gradients, ignored rows, odd and
misaligned rows, strided logits, the in-place gradient, determinism, torch.compile and opcheck.

Under TRITON_INTERPRET=1 the Triton kernels run on CPU tensors (one chunk a row for the on-chip
strategies: the interpreter runs programs one after another); without it, CPU tensors take the
torch path, and the Triton-only tests skip.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import onlinesoftmax

from onlinesoftmax.ops.cross_entropy import cross_entropy, plan
from onlinesoftmax.ops.cross_entropy import launch as ce_launch
from onlinesoftmax.ops.cross_entropy import op as ce_op

from conftest import (DEVICE, ON_GPU, TRITON_RUNS, assert_matches, compiled_for_sm90, gpu_only, make_logits,
                      needs_triton)
from cross_entropy_cases import (GRADIENT_IN_FORWARD_ALWAYS, OPTIONS, check_loss_and_grad, inplace_upstream,
                                 make_targets, option_ids, reference, resolve_options)

# Strategies of the forward with the gradient in place, and where each one runs.
INPLACE_STRATEGIES = ("on_chip", "split_on_chip", "two_pass", "separate") if TRITON_RUNS else ("torch",)
FORWARD_STRATEGIES = ("stream",) if TRITON_RUNS else ("torch",)
# --------------------------------------------------------------------------------------------
# Strategies, shapes, dtypes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(9, 37), (6, 300), (3, 1000)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("forced", [False, True], ids=["planned", "forced"])
def test_separate_backward_matches_torch(shape, dtype, reduction, forced, gen):
    # The one-read forward ("stream", several programs per row under the interpreter's 32-column
    # tiles) and the gradient from the saved lse; planned, or forced by ``strategy`` (which once
    # reached the eager launch in the place of its in-place flag and overwrote the logits).
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(shape[0], shape[1], gen)
    upstream = torch.randn(shape[0], generator=gen, dtype=torch.float64).to(DEVICE) if reduction == "none" else None
    forward, backward = check_loss_and_grad(x, target, dtype, upstream, reduction=reduction, what=reduction,
                                             strategy=FORWARD_STRATEGIES[0] if forced else None)
    assert (forward.op, forward.strategy) == ("forward", FORWARD_STRATEGIES[0])
    # Without Triton a planned call this small is F.cross_entropy itself, whose backward is torch's
    # (plan.CPU_TORCH_MAX_LOGITS): the last plan is then its forward's.
    routed = not TRITON_RUNS and not forced
    assert (backward.op, backward.strategy) == (("forward", "torch") if routed else
                                                ("backward", "backward" if TRITON_RUNS else "torch"))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("run_bytes", [64, 128])
@pytest.mark.parametrize("options", [OPTIONS[0], OPTIONS[-1]], ids=option_ids)
def test_separate_kernels_over_runs_wider_than_a_vector(dtype, run_bytes, options, gen):
    # The stream forward and the backward with their tiles over runs of 64 or 128 bytes (bf16 at
    # 128: wider than the interpreter's 32-column tile, so 16-byte vectors); rows of 203 columns,
    # each but the first starting inside a run: partial first and last runs, targets in them.
    shape = (7, 203)
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(*shape, gen, ignore_every=3)
    target[1], target[2] = 0, shape[1] - 1
    upstream = torch.randn(shape[0], generator=gen, dtype=torch.float64).to(DEVICE)
    with onlinesoftmax.override_plan("cross_entropy", STREAM_RUN_BYTES={4: run_bytes, 2: run_bytes}):
        forward, backward = check_loss_and_grad(x, target, dtype, upstream, reduction="none", what=f"runs {run_bytes}",
                                                 **resolve_options(options, shape[1], gen))
    widest = plan.INTERPRETER_BLOCK if not ON_GPU else 1 << 30  # the tile bounds the run
    run = run_bytes // dtype.itemsize if run_bytes // dtype.itemsize <= widest else 16 // dtype.itemsize
    assert (forward.strategy, backward.strategy) == ("stream", "backward")
    assert (forward.align, backward.align, forward.edges) == (run, run, True)


# (dtype, columns, STREAM_MAX_CHUNKS) -> the stream's and backward's tail: under the interpreter's tiles
# of 32 columns, a row's last part of 8 (fp32 72, whole vectors), of 4-11 after heads of up to 7
# (bf16 36, edges: up to a third of the row, which bf16's tolerance would not miss), one over
# several tiles a chunk (fp32 264); on the GPU's, bf16 65544 and 50257 (edges, heads of up to 63
# columns) and fp32 16392.
STREAM_TAILS = ([(torch.float32, 72, 256, 16), (torch.bfloat16, 36, 256, 16), (torch.float32, 264, 3, 16)]
                if not ON_GPU else
                [(torch.bfloat16, 65544, 256, 2048), (torch.bfloat16, 50257, 256, 2048),
                 (torch.float32, 16392, 256, 1024), (torch.float32, 16392, 3, 1024)])


@needs_triton
@pytest.mark.parametrize("dtype, cols, max_chunks, tail", STREAM_TAILS, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("options", [OPTIONS[0], OPTIONS[-1]], ids=option_ids)
@pytest.mark.parametrize("order", ["first", "last", "overlap"])
def test_separate_kernels_take_a_rows_last_part_with_its_last_tile(dtype, cols, max_chunks, tail, options, order,
                                                                   plan_override, gen):
    # The stream forward and the backward over rows a little past whole tiles: the row's last program
    # takes its last part in a narrower tile (plan.STREAM_TAIL_MAX_SHARE), the stream in each order
    # (STREAM_TAIL_ORDER); ignored rows, targets in the last part and in the first column, a
    # per-row upstream gradient.
    plan_override(op="cross_entropy", STREAM_MAX_CHUNKS=max_chunks, STREAM_TAIL_MIN_ROWS_PER_SM=0,
                  STREAM_TAIL_ORDER={4: order, 2: order})
    shape = (7, cols)
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(*shape, gen, ignore_every=3)
    target[1], target[2] = cols - 1, 0
    upstream = torch.randn(shape[0], generator=gen, dtype=torch.float64).to(DEVICE)
    forward, backward = check_loss_and_grad(x, target, dtype, upstream, reduction="none", what=f"{cols}",
                                             **resolve_options(options, cols, gen))
    assert (forward.strategy, backward.strategy, forward.tail, backward.tail) == ("stream", "backward", tail, tail)
    assert forward.tail_order == order
    whole = cols // forward.block  # the rows' whole tiles: the backward's programs a row, the stream's tiles
    assert backward.grid[1] == whole and -(-whole // forward.tiles_per_chunk) == forward.num_chunks
    assert (forward.tiles_per_chunk > 1) == (max_chunks < 256)


@pytest.mark.parametrize("strategy", INPLACE_STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_inplace_strategies_match_torch(strategy, dtype, reduction, gen):
    shape = (7, 203)  # 203 classes: rows start and end inside 16-byte vectors
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(*shape, gen)
    upstream = inplace_upstream(shape[0], gen) if reduction == "none" else None
    check_loss_and_grad(x, target, dtype, upstream, strategy=strategy, inplace=True, reduction=reduction,
                         what=strategy)
    # The plan of the forward is the one recorded before the backward's.
    x2 = x.detach().clone()
    cross_entropy(x2.requires_grad_(), target, strategy=strategy, inplace_backward=True)
    assert plan.last_plan().strategy == strategy and plan.last_plan().op == "forward_grad"
    assert plan.last_plan().edges  # 203 columns: rows start and end inside 16-byte vectors


@pytest.mark.parametrize("offset", [3000.0, -3000.0])
@pytest.mark.parametrize("strategy, inplace", [(FORWARD_STRATEGIES[0], False), ("torch", False)]
                         + [(s, True) for s in INPLACE_STRATEGIES], ids=lambda v: str(v))
def test_gradient_at_large_logits(strategy, inplace, offset, gen):
    """fp32 logits around +-3000, where the float32 lse's ulp is 2.4e-4: a probability recomputed
    from the rounded lse alone was up to 1.2e-4 off (1.2e-5 to 7e-5 in the gradient), and so was
    each row's lse - y_t (1e-5 in a summed loss); with its rounding error (lse_low) the loss and
    the gradient stay within the float32 tolerance on every path."""
    shape = (6, 203)
    x = make_logits(shape, torch.float32, gen, scale=2.0, outliers=False) + offset
    target = make_targets(*shape, gen)
    check_loss_and_grad(x, target, torch.float32, strategy=strategy, inplace=inplace, reduction="sum",
                         what=f"{strategy} at {offset}")


@pytest.mark.parametrize("strategy, inplace", [(FORWARD_STRATEGIES[0], False), ("torch", False)]
                         + [(s, True) for s in INPLACE_STRATEGIES], ids=lambda v: str(v))
def test_strided_class_weight(strategy, inplace, gen):
    """A class-weight view with a stride (every other element of a longer tensor): the kernels index
    weights by class, so they once read the wrong ones (the loss 10% off); every path gets them
    contiguous now."""
    shape = (6, 203)
    x = make_logits(shape, torch.float32, gen, outliers=False)
    target = make_targets(*shape, gen, ignore_every=4)
    weight = torch.rand(2 * shape[1], generator=gen).to(DEVICE)[::2]
    check_loss_and_grad(x, target, torch.float32, strategy=strategy, inplace=inplace, weight=weight,
                         label_smoothing=0.1, what=f"{strategy} with strided weights")


@needs_triton
@pytest.mark.parametrize("hold_l2", [False, True], ids=["plain", "hold_l2"])
@pytest.mark.parametrize("warps", [0, 4], ids=["warps_by_tile", "warps4"])
def test_two_pass_tables(hold_l2, warps, gen):
    # two_pass's own tables: eviction hints on its loads and stores, its warps; the same results.
    shape = (6, 203)
    x = make_logits(shape, torch.bfloat16, gen, outliers=False)
    target = make_targets(*shape, gen, ignore_every=4)
    table = {4: ((1 << 62, warps, 0),), 2: ((1 << 62, warps, 0),)}
    band = {4: (1 << 62, warps, 0), 2: (1 << 62, warps, 0)}
    with onlinesoftmax.override_plan("cross_entropy", TWO_PASS_HOLD_L2=hold_l2, TWO_PASS_LAUNCH=table,
                                     TWO_PASS_PLAIN_LAUNCH=table, PLAIN_EDGES_BAND_LAUNCH=band):
        check_loss_and_grad(x, target, torch.bfloat16, strategy="two_pass", inplace=True, what="two_pass")
        cross_entropy(x.detach().clone().requires_grad_(), target, strategy="two_pass", inplace_backward=True)
        chosen = plan.last_plan()
    assert (chosen.strategy, chosen.hold_l2, chosen.grid) == ("two_pass", hold_l2, (shape[0], 1))
    assert chosen.num_warps == (warps or plan._warps(chosen.block))


@gpu_only
@pytest.mark.parametrize("options", [dict(label_smoothing=0.1), dict(softcap=5.0),
                                     dict(label_smoothing=0.1, softcap=5.0), dict(label_smoothing=0.1, weight=True)],
                         ids=["smoothing", "softcap", "both", "weighted"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_two_pass_option_tables_over_several_tiles(options, dtype, gen):
    # Label smoothing's and softcap's own launches (8-16 warps over 4096-8192 columns): rows of
    # three to five tiles, against the reference.
    shape = (9, 17003)
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(*shape, gen, ignore_every=4)
    options = dict(options)  # (the parameter's dict is shared by its test ids)
    if options.pop("weight", False):
        options["weight"] = torch.rand(shape[1], generator=gen).to(DEVICE) + 0.5
    chosen, _ = check_loss_and_grad(x, target, dtype, inplace_upstream(shape[0], gen), strategy="two_pass",
                                     inplace=True, what=f"two_pass {options}", reduction="none", **options)
    assert chosen.strategy == "two_pass" and not chosen.plain and chosen.tiles_per_chunk >= 3


def plain_edges(run_bytes=16):
    """Rows of partial vectors to the kernel for plain rows at every length, tiles over runs of ``run_bytes``."""
    return onlinesoftmax.override_plan("cross_entropy", PLAIN_EDGES={4: (0, run_bytes), 2: (0, run_bytes)})


def _check_plain_rows(dtype, reduction, options, cols, run_bytes, gen):
    shape = (9, cols)
    x = make_logits(shape, dtype, gen, outliers=False)
    x[2, 5:150] = float("-inf")
    target = make_targets(*shape, gen, ignore_every=3)
    target[2] = 160
    target[4], target[5] = 1, cols - 1
    upstream = inplace_upstream(shape[0], gen) if reduction == "none" else None
    forward, _ = check_loss_and_grad(x, target, dtype, upstream, strategy="two_pass", inplace=True,
                                      reduction=reduction, what="two_pass plain", **options)
    runs = run_bytes // dtype.itemsize
    assert (forward.strategy, forward.plain, forward.edges) == ("two_pass", True, cols % runs != 0)
    assert forward.align == (runs if forward.edges else 16 // dtype.itemsize)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", [{}, {"temperature": 0.7}], ids=option_ids)
@pytest.mark.parametrize("cols,run_bytes", [(200, 16), (203, 16), (203, 128), (208, 128)],
                         ids=["whole_vectors", "edges", "edges128", "vectors_not_runs128"])
def test_two_pass_plain_rows_match_torch(dtype, reduction, options, cols, run_bytes, gen):
    # two_pass's kernel for plain rows: 200 columns are whole 16-byte vectors in every dtype, 203
    # are not (each row but the first starts inside a vector: partial first and last vectors, or
    # runs of 128 bytes), 208 are whole vectors but not whole runs of 128 bytes; in several tiles
    # with a partial last one (the interpreter's 32 columns; the GPU's one tile); ignored rows
    # (written 0), a row partly -inf, a target in a row's partial first run and one in its partial
    # last, an upstream gradient per row for "none".
    with plain_edges(run_bytes):
        _check_plain_rows(dtype, reduction, options, cols, run_bytes, gen)


def _check_two_pass_rows(dtype, cols, gen):
    """two_pass in place on 7 rows of ``cols`` against float64: ignored rows, a target in the row's last
    columns, an upstream gradient per row ("none"); the forward's plan."""
    shape = (7, cols)
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(*shape, gen, ignore_every=3)
    target[1] = cols - 3
    forward, _ = check_loss_and_grad(x, target, dtype, inplace_upstream(shape[0], gen), strategy="two_pass",
                                      inplace=True, what=f"two_pass plain {cols}", reduction="none")
    return forward


@gpu_only
@pytest.mark.parametrize("dtype,cols,tail", [(torch.bfloat16, 65544, 8192), (torch.bfloat16, 131080, 8192),
                                             (torch.bfloat16, 36000, 4096), (torch.float32, 16392, 2048),
                                             (torch.float32, 65544, 16384)],
                         ids=["bf16_65544", "bf16_131080", "bf16_36000", "fp32_16392", "fp32_65544_edges"])
def test_two_pass_plain_rows_with_a_narrow_tail(dtype, cols, tail, gen):
    # The GPU's tiles over rows a little past whole tiles: the last part in narrower tiles (fp32 65544
    # is not whole runs of 128 bytes: rows' whole tiles differ in number, so none); ignored rows, a
    # target in the tail.
    forward = _check_two_pass_rows(dtype, cols, gen)
    assert (forward.plain, forward.tail) == (True, tail)


@gpu_only
@pytest.mark.parametrize("dtype,cols,cap,edges", [(torch.bfloat16, 50257, 64, True), (torch.bfloat16, 65537, 32, True),
                                                  (torch.bfloat16, 98303, 32, True), (torch.bfloat16, 57344, 32, False),
                                                  (torch.bfloat16, 110001, 32, True),
                                                  (torch.bfloat16, 32768, 48, False), (torch.float32, 60001, 0, True)],
                         ids=["bf16_50257", "bf16_65537", "bf16_98303", "bf16_57344", "bf16_110001", "bf16_32768",
                              "fp32_60001"])
def test_two_pass_plain_rows_under_the_band_and_caps(dtype, cols, cap, edges, gen):
    # The GPU's plans for rows off vectors (on PLAIN_EDGES_BAND_LAUNCH's programs, and bf16's 32-warp
    # ones from 108 KB) and under PLAIN_MAX_REGISTERS (bf16 32768: the two loops, no row's rest); ignored
    # rows, a target in the row's last columns, an upstream gradient per row.
    forward = _check_two_pass_rows(dtype, cols, gen)
    assert (forward.plain, forward.edges, forward.max_registers) == (True, edges, cap)


@needs_triton
@pytest.mark.parametrize("cols", [3, 9, 17])
def test_two_pass_plain_rows_shorter_than_a_few_vectors(cols, gen):
    # bf16 rows of 3, 9 and 17 columns (8 a vector): rows inside one vector, rows of no whole
    # vector, rows of one; an ignored row among them.
    x = make_logits((7, cols), torch.bfloat16, gen, outliers=False)
    target = make_targets(7, cols, gen)
    target[3] = -100
    with plain_edges():
        forward, _ = check_loss_and_grad(x, target, torch.bfloat16, strategy="two_pass", inplace=True,
                                          what=f"two_pass plain {cols}", reduction="none")
    assert (forward.plain, forward.edges) == (True, True)


@needs_triton
def test_two_pass_plain_rows_only_where_nothing_needs_the_general_kernel(gen):
    # Class weights, label smoothing, softcap, z-loss and the lse of ignored rows take the general
    # two_pass kernel. Each against the reference.
    target = make_targets(6, 96, gen)
    weight = (torch.rand(96, generator=gen) + 0.5).to(DEVICE)
    for options, classes in (({"weight": weight}, 96), ({"label_smoothing": 0.1}, 96), ({"softcap": 5.0}, 96),
                             ({"z_loss": 1e-2}, 95)):
        x = make_logits((6, classes), torch.bfloat16, gen, outliers=False)
        forward, _ = check_loss_and_grad(x, target % classes, torch.bfloat16, strategy="two_pass", inplace=True,
                                          what=f"two_pass {options} {classes}", **options)
        assert not forward.plain, (options, classes)
    rows = make_logits((6, 96), torch.float32, gen, outliers=False)
    _, lse = cross_entropy(rows.clone().requires_grad_() * 1, target, strategy="two_pass", inplace_backward=True,
                           return_lse=True)
    assert not plan.last_plan().plain
    assert_matches(lse, torch.logsumexp(rows.double(), -1), torch.float32, "lse of every row")


@needs_triton
def test_two_pass_plain_rows_with_a_row_stride(gen):
    # Rows of 96 bf16 columns 104 apart (whole vectors, each row starting on one): the plain kernel,
    # the gradient written into the view and nowhere else.
    base = make_logits((6, 104), torch.bfloat16, gen, outliers=False)
    target = make_targets(6, 96, gen, ignore_every=4)
    leaf = base.clone().requires_grad_()
    logits = (leaf * 1)[:, :96]
    out = cross_entropy(logits, target, strategy="two_pass", inplace_backward=True)
    assert plan.last_plan().plain
    out.backward()
    x64 = base[:, :96].double().requires_grad_()
    ref = reference(x64, target)
    ref.backward()
    assert_matches(out.detach(), ref.detach(), torch.bfloat16, "loss")
    assert_matches(leaf.grad[:, :96], x64.grad, torch.bfloat16, "grad")
    assert torch.equal(leaf.grad[:, 96:], torch.zeros_like(leaf.grad[:, 96:])), "written outside the view"


@pytest.mark.parametrize("options", OPTIONS, ids=option_ids)
@pytest.mark.parametrize("inplace", [False, True], ids=["separate", "inplace"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_options_match_torch(options, inplace, dtype, gen):
    # float64 logits (which torch's F.cross_entropy takes) run torch's own kernels in float64: the
    # plan's "torch" strategy, to float64's tolerance.
    shape = (8, 131)
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(*shape, gen, ignore_every=3)
    for reduction in ("mean", "none"):
        upstream = torch.randn(shape[0], generator=gen, dtype=torch.float64).to(DEVICE) if reduction == "none" else None
        forward, backward = check_loss_and_grad(x, target, dtype, upstream, inplace=inplace, reduction=reduction,
                                                 what=f"{options} {reduction}", **resolve_options(options, shape[1], gen))
        if dtype == torch.float64:
            assert forward.strategy == "torch" and (inplace or backward.strategy == "torch")


def test_float64_lse_and_forced_kernels(gen):
    x = make_logits((4, 37), torch.float64, gen)
    target = make_targets(4, 37, gen)
    _, lse = cross_entropy(x, target, return_lse=True)
    assert lse.dtype == torch.float64
    assert_matches(lse, torch.logsumexp(x, -1), torch.float64, "lse")
    if TRITON_RUNS:  # the Triton kernels do not take float64: forcing one says so
        with pytest.raises(ValueError, match="float64"):
            cross_entropy(x, target, strategy="stream")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_all_options_in_half_precision(dtype, gen):
    shape = (5, 96)
    options = resolve_options(OPTIONS[-1], shape[1], gen)
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(*shape, gen)
    for inplace in (False, True):
        check_loss_and_grad(x, target, dtype, inplace=inplace, what=f"inplace={inplace}", **options)


def test_ignore_index_other_than_default(gen):
    x = make_logits((6, 50), torch.float32, gen, outliers=False)
    target = make_targets(6, 50, gen, ignore_every=2, ignore_index=3)
    for inplace in (False, True):
        check_loss_and_grad(x, target, torch.float32, ignore_index=3, inplace=inplace, label_smoothing=0.1)


def test_outliers_in_the_forward(gen):
    # Entries x20 (make_logits' outliers): a wrong normalizer cannot hide behind a near-uniform row.
    x = make_logits((12, 257), torch.float32, gen)
    target = make_targets(12, 257, gen)
    for reduction in ("none", "mean"):
        assert_matches(cross_entropy(x, target, reduction=reduction), reference(x, target, reduction=reduction),
                       torch.float32, reduction)


# --------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inplace", [False, True], ids=["separate", "inplace"])
def test_all_rows_ignored_gives_torchs_answer(inplace, gen):
    # torch 2.13: "mean" over zero rows is NaN (0/0) with or without weights and label smoothing;
    # "sum" is 0; the gradient is 0 everywhere.
    x = make_logits((4, 20), torch.float32, gen, outliers=False)
    target = torch.full((4,), -100, device=DEVICE)
    for options in ({}, {"label_smoothing": 0.1}, {"weight": True}, {"z_loss": 1e-3}):
        options = resolve_options(options, 20, gen)
        for reduction in ("mean", "sum"):
            leaf = x.clone().requires_grad_()
            out = cross_entropy(leaf * 1, target, reduction=reduction, inplace_backward=inplace, **options)
            ref = reference(x, target, reduction=reduction, **options)
            assert torch.isnan(out) == torch.isnan(ref) and (torch.isnan(ref) or out == ref), (options, reduction)
            out.backward()
            assert torch.equal(leaf.grad, torch.zeros_like(leaf)), (options, reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_empty_batch(reduction):
    x = torch.randn(0, 11, device=DEVICE, requires_grad=True)
    target = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    out = cross_entropy(x, target, reduction=reduction)
    ref = F.cross_entropy(x.detach().double(), target, reduction=reduction)
    assert out.shape == ref.shape and torch.equal(torch.isnan(out), torch.isnan(ref))
    out.sum().backward()
    assert x.grad.shape == (0, 11)


def test_one_class(gen):
    # C = 1: the loss is 0 (or -inf target logit: NaN), the gradient 0.
    x = make_logits((5, 1), torch.float32, gen, outliers=False)
    target = torch.zeros(5, dtype=torch.int64, device=DEVICE)
    for inplace in (False, True):
        check_loss_and_grad(x, target, torch.float32, inplace=inplace, reduction="none")


def test_vector_logits_with_scalar_target(gen):
    x = make_logits((33,), torch.float32, gen, outliers=False)
    target = torch.tensor(7, device=DEVICE)
    out, lse = cross_entropy(x, target, reduction="none", return_lse=True)
    assert out.shape == () and lse.shape == ()
    assert_matches(out, reference(x, target, reduction="none"), torch.float32)
    assert_matches(lse, torch.logsumexp(x.double(), -1), torch.float32)


def test_leading_dims_are_flattened_and_the_class_dim_is_last(gen):
    x = make_logits((2, 3, 40), torch.float32, gen, outliers=False)
    target = torch.randint(0, 40, (2, 3), generator=gen).to(DEVICE)
    target[0, 1] = -100
    check_loss_and_grad(x, target, torch.float32, reduction="none",
                         upstream=torch.randn(2, 3, generator=gen, dtype=torch.float64).to(DEVICE))
    # torch's F.cross_entropy takes dim 1 as the class dim: the same numbers after a movedim.
    ref = F.cross_entropy(x.double().movedim(-1, 1), target)
    assert_matches(cross_entropy(x, target), ref, torch.float32)


def test_negative_infinity_logits(gen):
    # Rows 4-7 are ordinary: a lone small loss (lse - y_t in fp32) is no norm to judge by.
    x = make_logits((8, 30), torch.float32, gen, outliers=False)
    target = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7], device=DEVICE)
    x[0, 5:] = float("-inf")  # masked vocabulary: finite loss, zero gradient there
    x[1] = float("-inf")  # every class masked: NaN, as torch
    x[2, 2] = float("-inf")  # the target masked: +inf loss
    x[3, 10] = float("nan")
    for inplace in (False, True):
        leaf = x.clone().requires_grad_()
        out = cross_entropy(leaf * 1, target, reduction="none", inplace_backward=inplace)
        ref = reference(x, target, reduction="none")
        assert_matches(out.detach(), ref, torch.float32, "loss")
        out[0].backward()
        assert torch.equal(leaf.grad[0, 5:], torch.zeros(25, device=DEVICE))
        ref_grad = torch.softmax(x[0].double(), -1)
        ref_grad[0] -= 1
        assert_matches(leaf.grad[0], ref_grad, torch.float32, "grad")


# (base shape, the (6, 70) view of it): rows that start anywhere, columns 2 bytes or a row apart.
LAYOUTS = {
    "wider_row_stride": ((6, 79), lambda t: t[:, :70]),
    "odd_row_stride": ((6 * 73,), lambda t: t.view(6, 73)[:, 1:71]),
    "transposed": ((70, 6), lambda t: t.t()),
    "every_other_row": ((12, 72), lambda t: t[::2, 2:]),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("inplace", [False, True], ids=["separate", "inplace"])
def test_strided_logits(layout, inplace, gen):
    base_shape, view_of = LAYOUTS[layout]
    base = make_logits(base_shape, torch.bfloat16, gen, outliers=False)
    target = make_targets(6, 70, gen, ignore_every=5)
    leaf = base.clone().requires_grad_()
    logits = view_of(leaf * 1)  # strided, and not a leaf: in place, the gradient goes into it
    out = cross_entropy(logits, target, label_smoothing=0.1, inplace_backward=inplace)
    out.backward()
    x64 = view_of(base).double().requires_grad_()
    ref = reference(x64, target, label_smoothing=0.1)
    ref.backward()
    assert_matches(out.detach(), ref.detach(), torch.bfloat16, f"{layout} loss")
    assert_matches(view_of(leaf.grad), x64.grad, torch.bfloat16, f"{layout} grad")
    outside = torch.ones_like(base, dtype=torch.bool)
    view_of(outside).fill_(False)
    assert torch.equal(leaf.grad[outside], torch.zeros_like(leaf.grad[outside])), "written outside the view"


@needs_triton
def test_misaligned_rows_take_the_edge_path(gen):
    # Rows whose starts and ends fall inside 16-byte vectors: the plan marks them, and every
    # element of the gradient is written (the outputs start as NaN).
    x = make_logits((5, 53), torch.bfloat16, gen, outliers=False)
    target = make_targets(5, 53, gen)
    for strategy in INPLACE_STRATEGIES:
        check_loss_and_grad(x, target, torch.bfloat16, strategy=strategy, inplace=True, what=strategy)
    cross_entropy(x, target)
    # The forward's tiles cover 16-byte vectors, or runs of STREAM_RUN_BYTES where its tile is as wide.
    runs = plan.STREAM_RUN_BYTES[2] // 2 if ON_GPU else 8
    assert plan.last_plan().edges and plan.last_plan().align == runs
    aligned = make_logits((5, 64), torch.bfloat16, gen, outliers=False)
    cross_entropy(aligned, target % 64)
    assert not plan.last_plan().edges


def test_out_of_range_targets_raise_on_cpu(gen):
    x = torch.randn(3, 10)
    for bad in (10, -1, -7):
        with pytest.raises(ValueError, match="out of range"):
            cross_entropy(x, torch.tensor([0, bad, 2]))
    cross_entropy(x, torch.tensor([0, -100, 2]))  # ignore_index is fine


@needs_triton
@pytest.mark.parametrize("cols", [40, 43], ids=["whole_vectors", "edges"])
def test_out_of_range_targets_in_the_kernels_give_nan_rows(cols, gen):
    # What CUDA tensors get (no host check there): a NaN loss and gradient for the row, no read
    # outside it; the other rows are untouched. Rows of 43 fp32 columns start inside a vector.
    x = make_logits((4, cols), torch.float32, gen, outliers=False)
    target = torch.tensor([1, cols, -5, 2], device=DEVICE)
    loss, _, _, _ = ce_launch.launch_forward(x, target, None, -100, "none", 0.0, 0.0, 0.0, 1.0, False)
    assert torch.isnan(loss[1:3]).all() and torch.isfinite(loss[[0, 3]]).all()
    for strategy in INPLACE_STRATEGIES:  # two_pass: its kernel for plain rows
        grad = x.clone()
        with plain_edges():
            loss, _, _, _ = ce_launch.launch_forward(grad, target, None, -100, "none", 0.0, 0.0, 0.0, 1.0, False,
                                                     strategy, inplace=True)
        assert torch.isnan(grad[1:3]).all() and torch.isfinite(grad[[0, 3]]).all(), strategy
        assert torch.isnan(loss[1:3]).all() and torch.isfinite(loss[[0, 3]]).all(), strategy
        assert plan.last_plan().plain == (strategy == "two_pass")


# --------------------------------------------------------------------------------------------
# In place, upstream gradients, lse, determinism
# --------------------------------------------------------------------------------------------


def test_separate_backward_for_each_upstream_layout(gen):
    # An eager forward's prepared call finds its backward by the upstream gradient alone (the rest of
    # the backward's signature is the forward's): per-row upstream gradients of other strides,
    # one after another on one forward signature, each get theirs.
    x = make_logits((6, 70), torch.float32, gen)
    target = make_targets(6, 70, gen, ignore_every=3)
    upstreams = [torch.randn(6, generator=gen), torch.randn(12, generator=gen)[::2],
                 torch.randn(1, generator=gen).expand(6), torch.randn(6, generator=gen)]
    for i, upstream in enumerate(upstreams):
        upstream = upstream.to(DEVICE)
        x64 = x.detach().double().requires_grad_()
        reference(x64, target, reduction="none").backward(upstream.double())
        leaf = x.clone().requires_grad_()
        cross_entropy(leaf, target, reduction="none").backward(upstream)
        assert_matches(leaf.grad, x64.grad, torch.float32, f"upstream {i}, strides {upstream.stride()}")


@pytest.mark.parametrize("upstream", [1.0, 0.25, -3.0])
def test_inplace_gradient_overwrites_the_logits_and_scales_by_the_upstream_gradient(upstream, gen):
    x = make_logits((8, 90), torch.float32, gen, outliers=False)
    target = make_targets(8, 90, gen)
    leaf = x.clone().requires_grad_()
    logits = leaf * 1
    before = logits.detach().clone()
    loss = cross_entropy(logits, target, inplace_backward=True)
    x64 = x.double().requires_grad_()
    F.cross_entropy(x64, target).backward()
    assert not torch.equal(logits.detach(), before)
    assert_matches(logits.detach(), x64.grad, torch.float32, "gradient stored by the forward")
    (loss * upstream).backward()
    assert_matches(leaf.grad, x64.grad * upstream, torch.float32, "scaled gradient")


def test_inplace_detects_an_op_that_saved_the_logits(gen):
    # tanh saves its output for its backward: overwriting it must fail loudly, not silently.
    x = make_logits((4, 30), torch.float32, gen, outliers=False).requires_grad_()
    logits = torch.tanh(x) * 1
    logits = torch.tanh(logits)
    loss = cross_entropy(logits, make_targets(4, 30, gen), inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_inplace_without_grad_leaves_the_logits_alone(gen):
    x = make_logits((4, 30), torch.float32, gen)
    before = x.clone()
    cross_entropy(x, make_targets(4, 30, gen), inplace_backward=True)
    assert torch.equal(x, before)


@needs_triton
@pytest.mark.parametrize("shape, strategy", [
    ((7, 203), "on_chip"),
    pytest.param((140, 20011), "two_pass", marks=gpu_only),  # at least a row an SM
    pytest.param((7, 20011), "split_on_chip", marks=gpu_only),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("upstream", [1.0, 0.7, -4.0])
@pytest.mark.parametrize("options", [OPTIONS[0], OPTIONS[-1]], ids=option_ids)
def test_kept_logits_gradient_written_by_the_forward(shape, strategy, dtype, reduction, upstream, options, gen):
    # The forward writes the gradient for an upstream gradient of 1 into a new tensor (the logits
    # untouched: _check_loss_and_grad); the backward hands it on for 1 and writes it again from the
    # logits for any other (0.7 scaled after a first rounding would be two roundings of a bf16
    # gradient). Ignored rows included (make_targets).
    x = make_logits(shape, dtype, gen, outliers=False)
    target = make_targets(*shape, gen)
    options = resolve_options(options, shape[1], gen)
    with onlinesoftmax.override_plan("cross_entropy", **GRADIENT_IN_FORWARD_ALWAYS):
        forward, _ = check_loss_and_grad(x, target, dtype, torch.tensor(upstream, device=DEVICE),
                                          reduction=reduction, what=f"{strategy} x {upstream}", in_forward=True,
                                          **options)
    assert (forward.op, forward.strategy) == ("forward_grad", strategy if TRITON_RUNS and ON_GPU else "on_chip")


@needs_triton
@pytest.mark.parametrize("upstream", [1.0, 0.7])
def test_kept_logits_gradient_of_a_second_backward(upstream, gen):
    # A kept graph's second backward cannot take the forward's gradient again (the first handed it
    # on, and autograd may have added to it): it takes the backward kernel, from the saved lse.
    x = make_logits((6, 300), torch.bfloat16, gen, outliers=False)
    target = make_targets(6, 300, gen)
    leaf = x.clone().requires_grad_()
    with onlinesoftmax.override_plan("cross_entropy", **GRADIENT_IN_FORWARD_ALWAYS):
        loss = cross_entropy(leaf * 1, target, label_smoothing=0.1, gradient_in_forward=True)
        assert plan.last_plan().op == "forward_grad"
        (loss * upstream).backward(retain_graph=True)
        first = leaf.grad.clone()
        (loss * upstream).backward()
    x64 = x.double().requires_grad_()
    (reference(x64, target, label_smoothing=0.1) * upstream).backward()
    assert_matches(first, x64.grad, torch.bfloat16, "first backward")
    assert_matches(leaf.grad - first, x64.grad, torch.bfloat16, "second backward")
    if upstream != 1.0:  # both from the backward kernel's arithmetic on the same lse
        assert torch.equal(leaf.grad - first, first)


@needs_triton
@pytest.mark.parametrize("case", ["default", "none", "strategy", "no_grad"])
def test_kept_logits_gradient_left_to_the_backward(case, gen):
    # Not asked for, "none" (a gradient a row to scale would be another pass), a forced strategy and
    # a call without autograd keep the stream forward.
    x = make_logits((6, 300), torch.float32, gen, outliers=False)
    target = make_targets(6, 300, gen)
    options = dict(gradient_in_forward=case != "default")
    options.update(dict(reduction="none") if case == "none" else dict(strategy="stream") if case == "strategy" else {})
    with onlinesoftmax.override_plan("cross_entropy", **GRADIENT_IN_FORWARD_ALWAYS):
        cross_entropy(x.clone().requires_grad_(case != "no_grad"), target, **options)
    assert plan.last_plan().op == "forward"


@gpu_only
@pytest.mark.parametrize("shape", [(64, 151937), (100, 128256)], ids=lambda v: "x".join(map(str, v)))
def test_kept_logits_gradient_in_forward_where_the_plan_refuses_it(shape, gen):
    # Rows fewer than one an SM over 4 MiB take 'separate' in place (the stream, then the backward
    # kernel over the logits), which writes no gradient into a new tensor: asked for it, the step
    # keeps the stream forward and the backward kernel (it had raised an AssertionError).
    x = make_logits(shape, torch.bfloat16, gen, outliers=False)
    with onlinesoftmax.override_plan("cross_entropy", **GRADIENT_IN_FORWARD_ALWAYS):
        forward, backward = check_loss_and_grad(x, make_targets(*shape, gen), torch.bfloat16, in_forward=True,
                                                 what="refused", label_smoothing=0.1)
    assert (forward.op, backward.op) == ("forward", "backward")


def test_return_lse_covers_every_row(gen):
    x = make_logits((7, 45), torch.float32, gen)
    target = make_targets(7, 45, gen)
    for inplace, strategy in [(False, None)] + [(True, s) for s in INPLACE_STRATEGIES]:
        logits = x.clone().requires_grad_() * 1
        loss, lse = cross_entropy(logits, target, return_lse=True, inplace_backward=inplace, strategy=strategy,
                                  temperature=2.0)
        assert lse.dtype == torch.float32 and not lse.requires_grad
        assert_matches(lse, torch.logsumexp(x.double() / 2.0, -1), torch.float32, f"lse {strategy}")


def test_ignored_rows_read_for_their_lse_get_a_zero_gradient(gen):
    # return_lse reads ignored rows for their lse; their gradient is still exactly 0, even where
    # their logits are large or +inf (the gradient's pass must not take those logits: exp(200) and
    # an +inf row's NaN lse times a zero coefficient are NaN).
    x = make_logits((5, 37), torch.float32, gen, outliers=False)
    x[1, 3], x[3, 5] = 200.0, float("inf")
    target = make_targets(5, 37, gen)
    target[1] = target[3] = -100
    for inplace, strategy in [(False, None)] + [(True, s) for s in INPLACE_STRATEGIES]:
        leaf = x.clone().requires_grad_()
        loss, lse = cross_entropy(leaf * 1, target, return_lse=True, inplace_backward=inplace, strategy=strategy,
                                  label_smoothing=0.1)
        loss.backward()
        assert torch.equal(leaf.grad[[1, 3]], torch.zeros_like(leaf.grad[[1, 3]])), strategy
        assert torch.isfinite(leaf.grad).all() and torch.isfinite(loss), strategy
        assert lse[1] == 200.0 and torch.isnan(lse[3]), strategy


@pytest.mark.parametrize("inplace", [False, True], ids=["separate", "inplace"])
def test_deterministic(inplace, gen):
    x = make_logits((16, 517), torch.bfloat16, gen)
    target = make_targets(16, 517, gen)
    results = []
    for _ in range(2):
        leaf = x.clone().requires_grad_()
        loss = cross_entropy(leaf * 1, target, label_smoothing=0.1, inplace_backward=inplace)
        loss.backward()
        results.append((loss.detach(), leaf.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@needs_triton
def test_stream_chunks_loop_over_tiles(plan_override, gen):
    # Rows of more tiles than STREAM_MAX_CHUNKS give each program several tiles.
    plan_override(op="cross_entropy", STREAM_MAX_CHUNKS=2)
    # Several tiles a row: the interpreter's 32 columns a tile, or the GPU's STREAM_BLOCK.
    cols = 200 if not ON_GPU else 5 * plan.STREAM_BLOCK[4] + 3
    x = make_logits((5, cols), torch.float32, gen, outliers=False)
    target = make_targets(5, cols, gen)
    assert_matches(cross_entropy(x, target, reduction="none", label_smoothing=0.1),
                   reference(x, target, reduction="none", label_smoothing=0.1), torch.float32)
    assert plan.last_plan().num_chunks == 2 and plan.last_plan().tiles_per_chunk > 1


@needs_triton
def test_scale_kernel_per_row_and_skipped_ones(gen):
    x = make_logits((6, 77), torch.bfloat16, gen)
    g = torch.tensor([1.0, 2.0, 1.0, -0.5, 0.0, 1.0], device=DEVICE)
    ref = (x.float() * g[:, None]).to(torch.bfloat16)
    assert torch.equal(ce_launch.launch_scale(x.clone(), g), ref)
    out = torch.full((6, 77), float("nan"), dtype=torch.float32, device=DEVICE)
    assert torch.equal(ce_launch.launch_scale(x, torch.tensor(1.0, device=DEVICE), out), x.float())


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------


def test_plans_for_the_gpu():
    gpu = torch.device("cuda")
    choose = lambda op, rows, cols, dtype, **kw: plan.choose(op, rows, cols, dtype, gpu, sms=132,  # noqa: E731
                                                                interpreting=False, **kw)
    # Rows enough for TWO_PASS_MIN_ROWS_PER_SM programs an SM read their row twice; fewer hold it
    # across programs.
    big = choose("forward_grad", 8192, 128256, torch.bfloat16)
    assert (big.strategy, big.block, big.num_warps, big.reads, big.plain) == ("two_pass", 16384, 32, 2, False)
    assert not big.edges and big.bytes_moved() == 2 * 8192 * 128256 * 2 + 8192 * 8
    # Plain rows (no per-class options) take their own kernel, over 64 KB tiles; rows of partial vectors too.
    plain = choose("forward_grad", 8192, 128256, torch.bfloat16, plain=True)
    assert (plain.strategy, plain.block, plain.num_warps, plain.plain) == ("two_pass", 32768, 32, True)
    assert "plain rows" in plain.describe()
    odd = choose("forward_grad", 8192, 128257, torch.bfloat16, plain=True)
    assert (odd.block, odd.num_warps, odd.plain, odd.edges, odd.align) == (32768, 32, True, True, 8)
    # Rows of partial vectors take it at every length: on the programs of PLAIN_EDGES_BAND_LAUNCH up
    # to its bytes (bf16 8 warps to 108 KB, fp32 16 to 256 KB, over 16 KB and 32 KB tiles), then the
    # table's; bf16's 8-warp programs under a register cap (PLAIN_MAX_REGISTERS: 64 with edges, 48
    # without, up to 100 KB rows), its 32-warp programs over 32 KB tiles at 32.
    gpt2_rows = choose("forward_grad", 8192, 50257, torch.bfloat16, plain=True)
    assert (gpt2_rows.plain, gpt2_rows.edges, gpt2_rows.align, gpt2_rows.num_warps, gpt2_rows.max_registers,
            gpt2_rows.tail) == (True, True, 8, 8, 64, 2048)
    assert gpt2_rows.compile_options == {"maxnreg": 64} and "64 registers" in gpt2_rows.describe()
    band = choose("forward_grad", 8192, 53003, torch.bfloat16, plain=True)
    assert (band.plain, band.edges, band.num_warps, band.block, band.max_registers) == (True, True, 8, 8192, 64)
    for cols, edges in ((57347, True), (57344, False), (98303, True), (120000, False), (110001, True)):
        wide = choose("forward_grad", 8192, cols, torch.bfloat16, plain=True)
        assert (wide.plain, wide.edges, wide.num_warps, wide.block, wide.max_registers) == (
            True, edges, 32, 16384, 32), cols
    assert choose("forward_grad", 8192, 128257, torch.bfloat16, plain=True).max_registers == 0
    assert choose("forward_grad", 8192, 50304, torch.bfloat16, plain=True).compile_options == {"maxnreg": 48}
    assert choose("forward_grad", 8192, 128256, torch.bfloat16, plain=True).compile_options == {}
    # Under a cap, a loop over whole tiles and one over half tiles for the rest (the one masked loop had spilled).
    for cols, tail in ((32768, 4096), (32000, 4096), (50304, 2048)):
        assert choose("forward_grad", 8192, cols, torch.bfloat16, plain=True).tail == tail, cols
    fp32_rows = choose("forward_grad", 8192, 50257, torch.float32, plain=True)
    assert (fp32_rows.plain, fp32_rows.edges, fp32_rows.align, fp32_rows.num_warps, fp32_rows.max_registers) == (
        True, True, 32, 16, 0)
    wide = choose("forward_grad", 8192, 51201, torch.float32, plain=True)
    assert (wide.plain, wide.edges, wide.num_warps, wide.block, wide.max_registers) == (True, True, 16, 8192, 0)
    assert choose("forward_grad", 8192, 128257, torch.float32, plain=True).align == 32  # runs of 128 bytes
    # A row's short last part in narrower tiles, no narrower than a vector a thread; none where rows'
    # whole tiles differ in number (edges straddling a tile) or the last part is over half a tile.
    tails = {(torch.bfloat16, 65544): (16384, 8192), (torch.bfloat16, 50304): (8192, 2048),
             (torch.bfloat16, 128256): (32768, 32768), (torch.bfloat16, 262147): (32768, 32768),
             (torch.float32, 262200): (16384, 4096), (torch.float32, 65544): (16384, 16384),
             (torch.bfloat16, 100352): (16384, 8192)}  # (rows of up to 240 KB on 32 KB tiles)
    for (dtype, cols), (block, tail) in tails.items():
        chosen = choose("forward_grad", 8192, cols, dtype, plain=True)
        assert (chosen.block, chosen.tail) == (block, tail), (dtype, cols)
    # fp32 plain rows over 32 KB tiles: 16 warps up to 112 KB (three programs an SM), 32 warps to 200 KB
    # (two); longer: 32 over 64 KB.
    for cols, warps in ((28000, 16), (30000, 32), (32000, 32), (51200, 32)):
        mid = choose("forward_grad", 8192, cols, torch.float32, plain=True)
        assert (mid.block, mid.num_warps, mid.plain) == (8192, warps, True), cols
    assert choose("forward_grad", 8192, 65536, torch.float32, plain=True).block == 16384
    # fp32 rows of whole vectors but not of whole 128-byte runs: the edges path too, from 256 KB
    # (below, whole vectors: as aligned rows).
    assert choose("forward_grad", 8192, 128260, torch.float32, plain=True).align == 32
    assert not choose("forward_grad", 8192, 50260, torch.float32, plain=True).edges
    assert not choose("forward_grad", 8192, 128264, torch.bfloat16, plain=True).edges
    # From one row an SM two_pass; fewer rows take the separate launches (stream, then backward)
    # from 4 MiB of logits, split_on_chip below.
    assert choose("forward_grad", 132, 128256, torch.bfloat16).strategy == "two_pass"
    assert choose("forward_grad", 132, 128256, torch.float32).strategy == "two_pass"
    few = choose("forward_grad", 131, 128256, torch.bfloat16)
    stream = choose("forward", 131, 128256, torch.bfloat16)
    assert (few.strategy, few.reads, few.op) == ("separate", 2, "forward_grad")
    assert (few.grid, few.block, few.num_warps) == (stream.grid, stream.block, stream.num_warps)
    assert few.parts == (stream, choose("backward", 131, 128256, torch.bfloat16))
    assert "the backward kernel" in few.describe()
    assert choose("forward_grad", 64, 2_000_000, torch.bfloat16).strategy == "separate"
    held = choose("forward_grad", 16, 128256, torch.bfloat16)  # 3.9 MiB
    assert (held.strategy, held.block, held.num_chunks, held.num_warps) == ("split_on_chip", 8192, 16, 16)
    gpt2 = choose("forward_grad", 16, 50257, torch.bfloat16)
    assert gpt2.strategy == "split_on_chip" and gpt2.edges and gpt2.num_chunks == 7  # + 7 head columns, 8192 a tile
    assert choose("forward_grad", 64, 4000, torch.float32).strategy == "on_chip"
    # two_pass keeps each row in L2 between its reads; its warps by element size and row length.
    assert big.hold_l2 and "L2" in big.describe()
    fp32 = choose("forward_grad", 8192, 128256, torch.float32)
    assert (fp32.strategy, fp32.num_warps, fp32.hold_l2) == ("two_pass", 32, True)
    # The general kernel's fp32 tiles by row length: 16 KB up to 96 KB rows, 32 KB up to 128 KB, 64 KB above.
    for cols, block in [(24001, 4096), (32001, 8192), (50257, 16384), (128257, 16384)]:
        general = choose("forward_grad", 8192, cols, torch.float32)
        assert (general.strategy, general.plain, general.block, general.num_warps) == ("two_pass", False, block, 32)
    short = choose("forward_grad", 8192, 32000, torch.bfloat16)
    assert (short.strategy, short.block, short.num_warps) == ("two_pass", 8192, 8)
    middle = choose("forward_grad", 8192, 50257, torch.bfloat16)
    assert (middle.strategy, middle.block, middle.num_warps) == ("two_pass", 8192, 16)
    # Label smoothing and softcap (more registers a thread) take smaller programs over long rows.
    for kw, dtype, cols, block, warps in [(dict(smoothing=True), torch.bfloat16, 128256, 4096, 8),
                                          (dict(smoothing=True), torch.bfloat16, 50257, 8192, 16),
                                          (dict(smoothing=True), torch.float32, 128256, 8192, 16),
                                          (dict(smoothing=True, weighted=True), torch.bfloat16, 50257, 2048, 4),
                                          (dict(smoothing=True, weighted=True), torch.float32, 32000, 8192, 16),
                                          (dict(smoothing=True, weighted=True), torch.float32, 50257, 4096, 16),
                                          (dict(weighted=True), torch.bfloat16, 128256, 16384, 32),
                                          (dict(softcap=True), torch.bfloat16, 50257, 4096, 8),
                                          (dict(softcap=True, smoothing=True), torch.float32, 128256, 4096, 16)]:
        options = choose("forward_grad", 8192, cols, dtype, **kw)
        assert (options.strategy, options.block, options.num_warps) == ("two_pass", block, warps), (kw, dtype, cols)
    assert choose("forward_grad", 8, 128256, torch.float32).strategy == "split_on_chip"
    fwd = choose("forward", 8192, 128256, torch.bfloat16)
    assert (fwd.strategy, fwd.num_chunks, fwd.tiles_per_chunk, fwd.num_warps) == ("stream", 1, 16, 8)
    # The stream's programs in waves (plan.STREAM_BALANCE_*): bf16 333 rows at 2 chunks would be 666
    # programs where 660 fit at once, 6 of them left to run alone; fp32 1100 rows at 1, 1100 of 1056.
    # A second wave over half full (1000 rows at 1 chunk), or whole (1320), or a third, stays.
    for dtype, rows, cols, chunks in [(torch.bfloat16, 333, 256003, 11), (torch.float32, 1100, 128256, 8),
                                      (torch.bfloat16, 700, 128256, 4), (torch.bfloat16, 1000, 50257, 1),
                                      (torch.bfloat16, 1320, 128256, 1), (torch.bfloat16, 1539, 65550, 1),
                                      (torch.float32, 333, 256003, 2)]:
        chosen = choose("forward", rows, cols, dtype)
        assert chosen.num_chunks == chunks and chosen.grid == (rows, chunks), (dtype, rows, cols)
        assert chosen.num_chunks * chosen.tiles_per_chunk >= choose("backward", rows, cols, dtype).grid[1]
    # In place, two_pass's programs of 32 warps run one an SM: rows just past a wave of them take
    # separate (plan.TWO_PASS_SEPARATE_*), unless two_pass is asked for.
    for rows, kw, strategy in [(132, {}, "two_pass"), (133, {}, "separate"), (180, dict(plain=True), "separate"),
                               (190, {}, "two_pass"), (265, {}, "two_pass"), (133, dict(strategy="two_pass"), "two_pass"),
                               (133, dict(weighted=True), "separate")]:
        for dtype in (torch.bfloat16, torch.float32):
            assert choose("forward_grad", rows, 128256, dtype, **kw).strategy == strategy, (rows, kw, dtype)
    assert choose("forward_grad", 133, 50257, torch.bfloat16).strategy == "two_pass"  # 8 warps a program
    # The stream's and the backward's last program a row takes the row's last part where it is at most
    # 0.4 of a tile, in a tile no narrower than a vector a thread: fp32 128256 = 31 x 4096 + 1312; not
    # fp32 256000 = 62 x 4096 + 2048.
    assert (choose("backward", 8192, 128256, torch.float32).grid, fwd.tail) == ((8192, 31), fwd.block)
    for dtype, cols, tiles, tail in [(torch.float32, 128256, 31, 2048), (torch.bfloat16, 65544, 8, 2048),
                                     (torch.bfloat16, 50257, 6, 2048), (torch.bfloat16, 151936, 19, 8192),
                                     (torch.float32, 4100, 1, 1024), (torch.bfloat16, 4100, 1, 8192),
                                     (torch.float32, 256000, 63, 4096)]:
        for op in ("forward", "backward"):
            chosen = choose(op, 8192, cols, dtype)
            per_program = chosen.tiles_per_chunk if op == "forward" else 1  # (8192 rows: one chunk a row)
            assert (chosen.grid[1] * per_program, chosen.tail) == (tiles, tail), (op, dtype, cols)
            # The stream reduces the part before its tiles in fp32, with its first tile's load in flight
            # in bf16 (STREAM_TAIL_ORDER).
            order = "" if op == "backward" or tail == chosen.block else "first" if dtype == torch.float32 else "overlap"
            assert chosen.tail_order == order, (op, dtype, cols)
            assert ("by its last program" in chosen.describe()) == (tail < chosen.block)
            # Fewer rows than two an SM (132 here) keep a program for the last part (STREAM_TAIL_MIN_ROWS_PER_SM).
            few, enough = choose(op, 263, cols, dtype), choose(op, 264, cols, dtype)
            assert (few.tail, enough.tail) == (few.block, tail), (op, cols)
            if op == "backward":  # (the stream's chunks of several tiles hide the count)
                assert few.grid[1] == tiles + (tail < few.block), (op, cols)
    assert "split_on_chip" in held.describe(3000.0) and "floor" in held.describe(3000.0)
    with pytest.raises(ValueError, match="does not compute"):
        choose("forward", 4, 100, torch.float32, strategy="on_chip")
    with pytest.raises(ValueError, match="split_on_chip"):
        choose("forward_grad", 4, 10_000_000, torch.float32, strategy="split_on_chip")
    assert plan.choose("forward", 4, 100, torch.float32, torch.device("cpu"), interpreting=False).strategy == "torch"


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def test_checks_run_once_a_signature_but_not_only_once(gen):
    # A signature's checks are remembered; what a signature does not hold is checked every call:
    # a flag of another type, CPU targets' values, a weight's layout.
    x = make_logits((4, 30), torch.float32, gen, outliers=False)
    target = make_targets(4, 30, gen)
    weight = torch.rand(60, generator=gen).to(DEVICE)
    cross_entropy(x, target, return_lse=True, weight=weight[:30])
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        cross_entropy(x, target, return_lse=1, weight=weight[:30])
    cross_entropy(x, target, gradient_in_forward=False)
    with pytest.raises(TypeError, match="gradient_in_forward must be a bool"):
        cross_entropy(x, target, gradient_in_forward=0)
    ref = reference(x.double(), target, weight=weight[::2])
    assert_matches(cross_entropy(x, target, return_lse=True, weight=weight[::2])[0], ref, torch.float32, "loss")
    if target.device.type == "cpu":
        with pytest.raises(ValueError, match="out of range"):
            cross_entropy(x, torch.full_like(target, 30), return_lse=True, weight=weight[:30])


def test_argument_errors():
    x, t = torch.randn(4, 10), torch.tensor([1, 2, 3, 4])
    cases = [
        (TypeError, dict(logits=x.to(torch.int32))),  # float64 runs torch's kernels
        (ValueError, dict(target=t.float())),  # floating targets are probabilities, of the logits' shape
        (ValueError, dict(target=t[:3])),
        (ValueError, dict(reduction="avg")),
        (ValueError, dict(label_smoothing=1.5)),
        (ValueError, dict(z_loss=-1.0)),
        (ValueError, dict(softcap=0.0)),
        (ValueError, dict(temperature=0.0)),
        (ValueError, dict(weight=torch.ones(9))),
        (TypeError, dict(ignore_index=1.5)),
        (TypeError, dict(inplace_backward=1)),
        (ValueError, dict(logits=torch.randn(4, 0))),
        (ValueError, dict(logits=torch.tensor(1.0), target=torch.tensor(0))),
    ]
    for error, kwargs in cases:
        args = {"logits": x, "target": t, **kwargs}
        with pytest.raises(error):
            cross_entropy(args.pop("logits"), args.pop("target"), **args)


# --------------------------------------------------------------------------------------------
# torch.compile and the custom ops
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inplace", [False, True], ids=["separate", "inplace"])
def test_torch_compile_fullgraph(inplace, gen):
    x = make_logits((8, 40), torch.float32, gen, outliers=False)
    target = make_targets(8, 40, gen)

    def f(x, t):
        return cross_entropy(x * 2.0, t, z_loss=1e-3, label_smoothing=0.1, inplace_backward=inplace)

    compiled = torch.compile(f, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    leaf = x.clone().requires_grad_()
    out = compiled(leaf, target)
    out.backward()
    x64 = x.double().requires_grad_()
    ref = reference(2.0 * x64, target, z_loss=1e-3, label_smoothing=0.1)
    ref.backward()
    assert_matches(out.detach().reshape(1), ref.detach().reshape(1), torch.float32, "compiled loss")
    assert_matches(leaf.grad, x64.grad, torch.float32, "compiled grad")


def test_opcheck(gen):
    x = make_logits((5, 30), torch.float32, gen, outliers=False)
    target = make_targets(5, 30, gen)
    weight = torch.rand(30, generator=gen).to(DEVICE)
    forward_args = (x, target, weight, -100, "mean", 0.1, 1e-3, 0.0, 1.0, False, None)
    torch.library.opcheck(ce_op._forward_op, forward_args)
    torch.library.opcheck(ce_op._forward_inplace_op, (x.clone(), target, None, -100, "sum", 0.0, 0.0, 5.0, 2.0,
                                                      True, None))
    _, lse, lse_low, denom = ce_op._forward_op(*forward_args)
    torch.library.opcheck(ce_op._backward_op, (x, target, weight, lse, lse_low, denom, torch.tensor(1.5, device=DEVICE),
                                               -100, "mean", 0.1, 1e-3, 0.0, 1.0, None))
    # float64 logits (torch's ops): the fake outputs' dtypes follow the real ones'.
    torch.library.opcheck(ce_op._forward_op, (x.double(), target, weight.double(), *forward_args[3:]))
    torch.library.opcheck(ce_op._scale_op, (x.clone(), torch.randn(5, generator=gen).to(DEVICE)))


# --------------------------------------------------------------------------------------------
# GPU only
# --------------------------------------------------------------------------------------------


@gpu_only
@pytest.mark.parametrize("inplace, rows, options", [(False, 64, dict(label_smoothing=0.1)),
                                                    (True, 64, dict(label_smoothing=0.1)), (True, 512, {})],
                         ids=["separate", "inplace", "inplace_plain"])
def test_cuda_graph_capture_and_replay(inplace, rows, options, gen):
    # Replayed on new logits and targets with another count of ignored rows each time: a captured
    # launch that read the denominators before the replay's own were written (in place they are
    # counted first, then the rows' gradient is scaled by them) would scale by an earlier replay's.
    # Plans: keeping the logits ("separate"), a backward of its own; in place, 64 rows the rows'
    # launch and then one for the gradient, 512 plain rows two passes in one launch and then the
    # reduction.
    x = make_logits((rows, 50257), torch.bfloat16, gen, outliers=False)
    target = make_targets(rows, 50257, gen)
    static = x.clone().requires_grad_()

    def step():
        static.grad = None
        cross_entropy(static * 1, target, inplace_backward=inplace, **options).backward()

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for ignore_every in (3, 5):
        with torch.no_grad():
            static.copy_(make_logits((rows, 50257), torch.bfloat16, gen, outliers=False))
            target.copy_(make_targets(rows, 50257, gen, ignore_every=ignore_every))
        graph.replay()
        expected = static.detach().clone().requires_grad_()  # eager, the same mode: deterministic, bitwise equal
        cross_entropy(expected * 1, target, inplace_backward=inplace, **options).backward()
        assert torch.equal(static.grad, expected.grad)


@gpu_only
@pytest.mark.slow
def test_more_than_2_to_the_31_elements():
    # 16400 x 131072 fp16 = 2^31 + 2^27 elements (4.3 GB, with the in-place gradient: no more);
    # int32 offsets would wrap in the last rows. The last rows are checked against float64.
    rows, classes = 16400, 131072
    if torch.cuda.get_device_properties(0).total_memory < 3 * rows * classes * 2:
        pytest.skip("needs ~13 GB of GPU memory")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, classes, device="cuda", dtype=torch.float16, generator=gen)
    target = torch.randint(0, classes, (rows,), device="cuda", generator=gen)
    tail = x[-4:].double()
    loss = cross_entropy(x, target, reduction="none")
    assert_matches(loss[-4:], F.cross_entropy(tail, target[-4:], reduction="none"), torch.float16, "loss")
    logits = x.requires_grad_() * 1
    cross_entropy(logits, target, reduction="sum", inplace_backward=True)
    ref = torch.softmax(tail, -1)
    ref[torch.arange(4), target[-4:]] -= 1
    assert_matches(logits.detach()[-4:], ref, torch.float16, "gradient")


# Compiles the plans' kernels for sm_90 without a GPU and prints, per kernel, its stack and its
# 2-byte global accesses (scripts/probes/kernel_resources.py).
_ACCESS_PROBE = """
import json, sys, torch
sys.path.insert(0, "scripts/probes")
import kernel_resources as kr
out = []
for case, run in kr.cross_entropy_cases(torch.bfloat16, [(8192, 32008), (2048, 65544), (8192, 128256)]):
    with kr.recorded_launches(132) as calls:
        run()
    for fn, args, meta in calls:
        usage = kr.resource_usage(fn, args, meta, 90)
        narrow = sum(n for (op, width), n in usage["accesses"].items() if width == 2)
        out.append((case, fn.__name__, usage["STACK"], narrow))
print(json.dumps(out))
"""


def test_kernels_move_whole_vectors_on_rows_of_whole_vectors():
    """bf16 rows of whole 16-byte vectors whose length is no multiple of 16 elements ("vocabulary +
    a few": 32008, 65544) were read and written 2 bytes at a time by every kernel, as Triton could not
    prove their masks constant over a vector (8192 x 32008 in place 3.7x slower than 32000 on the
    H100). Compiled for sm_90 on this machine: no kernel of the plans spills, and a kernel's only
    2-byte accesses are the target's logit and, in the stream kernel that reduces the loss too, the
    loss's store, and in the kernel for plain rows the target's gradient, written after its loops."""
    kernels = compiled_for_sm90(_ACCESS_PROBE, timeout=900)
    assert {name for _, name, _, _ in kernels} >= {"cross_entropy_stream_kernel", "cross_entropy_backward_kernel",
                                                  "cross_entropy_two_pass_plain_kernel"}
    for case, name, stack, narrow in kernels:
        assert stack == 0, f"{case}: {name} spills ({stack} bytes of stack)"
        assert narrow <= (2 if name in ("cross_entropy_stream_kernel", "cross_entropy_two_pass_plain_kernel") else 1), \
            f"{case}: {name} has {narrow} 2-byte global accesses"


def test_bench_cases_check_against_their_reference():
    # The bench suites' correctness path (references, checks, in-place groups) on small CPU inputs.
    from onlinesoftmax.bench import cross_entropy_suite as suite
    from onlinesoftmax.bench import harness

    ours = ("torch", "onlinesoftmax", "onlinesoftmax inplace", "onlinesoftmax gradient_in_forward")
    for dtype in (torch.float32, torch.bfloat16):
        impls = [i for group in suite.implementation_groups() for i in group if i.name in ours]
        rows = harness.run_case(suite.case((40, 300), dtype, "cpu"), impls, torch.Generator().manual_seed(0),
                                timed=False)
        linear = [i for i in suite.linear_implementations() if i.name in ours]
        rows += harness.run_case(suite.linear_case((37, 16, 90), dtype, "cpu"), linear,
                                 torch.Generator().manual_seed(0), timed=False)
        assert [r.status for r in rows] == ["ok"] * len(rows), [(r.impl, r.status, r.rel_error) for r in rows]


@gpu_only
@pytest.mark.parametrize("strategy,cols", [("on_chip", 3001), ("two_pass", 20011)])
def test_inplace_loss_reads_the_target_logit_before_it_is_overwritten(strategy, cols):
    # In place, one lane's thread reads the target's logit for the loss and another overwrites it
    # with the gradient; without a barrier between them the loss sometimes read the gradient (bf16
    # on_chip 37 x 3001 on the H100: 8 wrong values in 300 calls before, 0 after). Every call must
    # give torch's loss rounded to bf16.
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(37, cols, generator=gen)).to(torch.bfloat16).to(DEVICE)
    target = torch.randint(0, cols, (37,), generator=gen)
    target[::5] = -100
    target = target.to(DEVICE)
    want = float(F.cross_entropy(x.float(), target).to(torch.bfloat16))
    losses = set()
    for _ in range(200):
        leaf = x.clone().requires_grad_()
        losses.add(float(cross_entropy(leaf, target, strategy=strategy, inplace_backward=True).detach()))
    assert losses == {want}, f"{strategy}: {sorted(losses)} against {want}"


@pytest.mark.parametrize("inplace", [False, True], ids=["separate", "inplace"])
def test_torch_path_in_row_chunks_equals_one_chunk(inplace, gen, monkeypatch):
    # The torch path takes a CPU tensor's rows a few at a time (cpu.row_chunks, against page faults
    # on large temporaries): the same numbers, bit for bit, as all the rows at once.
    x = make_logits((11, 37), torch.float32, gen).cpu()
    target = torch.randint(0, 37, (11,), generator=gen)
    target[4] = -100
    weight = torch.rand(37, generator=gen) + 0.5
    upstream = torch.randn(11, generator=gen)
    results = []
    for rows_at_once in (None, 3):
        if rows_at_once:
            monkeypatch.setattr(onlinesoftmax.cpu, "ROW_CHUNK_ELEMENTS", rows_at_once * 37)
            assert len(onlinesoftmax.cpu.row_chunks(x)) == 4
        leaf = x.clone().requires_grad_()
        loss, lse = cross_entropy(leaf * 1, target, reduction="none", label_smoothing=0.1, z_loss=1e-3, weight=weight,
                                  return_lse=True, inplace_backward=inplace, strategy="torch")
        (loss * upstream).sum().backward()
        results.append((loss.detach(), lse, leaf.grad))
    for name, one, chunked in zip(("loss", "lse", "grad"), *results):
        assert torch.equal(one, chunked), name


def test_small_cpu_calls_run_torchs_own_loss(gen, monkeypatch):
    # CPU logits of at most plan.CPU_TORCH_MAX_LOGITS with torch's options only run F.cross_entropy
    # itself (half precision upcast to float32, the loss and gradient rounded once); other options
    # or more logits take the torch path. Under the interpreter (CI) CPU tensors run the kernels,
    # so the route is checked with it off.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    real = F.cross_entropy
    calls = []
    monkeypatch.setattr(F, "cross_entropy", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    x = make_logits((3, 4, 37), torch.float64, gen, outliers=False, device="cpu")
    target = torch.randint(0, 37, (3, 4), generator=gen)
    target[0, 1] = -100
    weight = torch.rand(37, generator=gen, dtype=torch.float64) + 0.5
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        for options in (dict(), dict(reduction="none", label_smoothing=0.1, weight=weight),
                        dict(reduction="sum", ignore_index=5)):
            leaf, want_leaf = (x.to(dtype).clone().requires_grad_() for _ in range(2))  # two leaves
            rows_target = target.masked_fill(target == -100, options.get("ignore_index", -100))
            before = len(calls)
            loss = cross_entropy(leaf, rows_target.int(), **options)
            assert len(calls) == before + 1 and plan.last_plan().strategy == "torch", (dtype, options)
            torch_options = {k: (v.to(compute) if k == "weight" else v) for k, v in options.items()}
            want = real(want_leaf.to(compute).reshape(12, 37), rows_target.reshape(-1), **torch_options).to(dtype)
            want = want.reshape(3, 4) if options.get("reduction") == "none" else want
            assert loss.dtype == dtype and torch.equal(loss.detach(), want.detach()), (dtype, options)
            upstream = torch.randn(want.shape, generator=gen).to(dtype)
            (loss * upstream).sum().backward()
            (want * upstream).sum().backward()
            assert torch.equal(leaf.grad, want_leaf.grad), (dtype, options)
    # Options torch lacks, or more logits than the line: the torch path, against float64 (whose
    # reference calls F.cross_entropy itself: the count is of our calls alone).
    before = len(calls)
    cross_entropy(x.float(), target, z_loss=1e-3)
    with onlinesoftmax.override_plan("cross_entropy", CPU_TORCH_MAX_LOGITS=dict.fromkeys((2, 4, 8), 3 * 4 * 37 - 1)):
        cross_entropy(x.float(), target, label_smoothing=0.2)
        assert len(calls) == before
        check_loss_and_grad(x.float(), target, torch.float32, label_smoothing=0.2)
    check_loss_and_grad(x.float(), target, torch.float32, z_loss=1e-3)
    # A target out of range: our ValueError, which names it, not torch's IndexError.
    with pytest.raises(ValueError, match="target 37 is out of range for 37 classes"):
        cross_entropy(x.float(), torch.full((3, 4), 37))
    # Traced whole, as the other calls are.
    compiled = torch.compile(lambda x, t: cross_entropy(x, t, label_smoothing=0.1), fullgraph=True,
                             backend="aot_eager")
    want = real(x.float().reshape(12, 37), target.reshape(-1), label_smoothing=0.1)
    assert torch.equal(compiled(x.float(), target), want)
