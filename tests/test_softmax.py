"""softmax / log_softmax / logsumexp against float64 torch, every strategy forced and asserted."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onlinesoftmax
from onlinesoftmax import _buffers, _device, _launch
from onlinesoftmax.ops.softmax import eager_route, launch as softmax_launch, op as softmax_op, plan

from conftest import (DEVICE, DTYPES, ON_GPU, TOLERANCE, TRITON_RUNS, assert_matches, compiled_for_sm90, gpu_only,
                      make_logits, needs_triton, strategies_here)

OPS = {
    "softmax": (onlinesoftmax.softmax, torch.softmax),
    "log_softmax": (onlinesoftmax.log_softmax, torch.log_softmax),
}
# (strategy, algorithm) pairs: the on-chip strategies are one pass by construction, the streaming
# ones take both.
STRATEGY_ALGORITHMS = [("row_on_chip", "auto"), ("split_row_on_chip", "auto"), ("looped", "online"), ("looped", "safe"),
                       ("split_row", "online"), ("split_row", "safe"), ("vectorized", "online"), ("vectorized", "safe"),
                       ("torch", "auto")]


def runnable(strategy):
    return strategy in strategies_here()


def grad64(op: str, out: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The float64 gradient of softmax or log_softmax over the last dim, from our output ``out``."""
    y64, dy64 = out.detach().double(), dy.double()
    if op == "log_softmax":
        return dy64 - y64.exp() * dy64.sum(-1, keepdim=True)
    return y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))


def edge_row_logits(shape, dtype, gen) -> torch.Tensor:
    """Logits (rows >= 5) with rows of -inf, a NaN, a lone -inf and huge magnitudes, needing grad."""
    x = make_logits(shape, dtype, gen, scale=2.0, outliers=False)
    x[1] = float("-inf")
    x[2, 7] = float("nan")
    x[3, 0] = float("-inf")
    x[4] = x[4] * 2000
    return x.requires_grad_()


def strategy_params():
    return [pytest.param(s, a, id=f"{s}-{a}",
                         marks=[] if s in ("torch", "vectorized") else [needs_triton]) for s, a in STRATEGY_ALGORITHMS]


def test_the_comparison_ignores_only_what_float32_cannot_hold_as_a_normal():
    """assert_matches counts magnitudes below 1.2e-38 as zero; anything above still fails."""
    zeros = torch.zeros(4, dtype=torch.float64)
    assert_matches(torch.full((4,), 3.6e-39).to(torch.bfloat16), zeros, torch.bfloat16)
    with pytest.raises(AssertionError, match="relative error"):
        assert_matches(torch.full((4,), 1e-37).to(torch.bfloat16), zeros, torch.bfloat16)
    with pytest.raises(AssertionError, match="relative error"):
        assert_matches(torch.tensor([1.0, 3e-38]), torch.tensor([1.0, 0.5], dtype=torch.float64), torch.float32)


def layout(x: torch.Tensor, kind: str, dim: int) -> torch.Tensor:
    """The same logical values as ``x`` in three memory layouts."""
    if kind == "contiguous":
        return x
    if kind == "transposed":
        # Stored with the first and last dims swapped, viewed back: strides are not row-major.
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    # sliced: a view into a larger buffer, every dim strided (the softmax dim by 1 when it is last)
    big = torch.empty([s * 2 if i != x.dim() - 1 else s + 3 for i, s in enumerate(x.shape)], dtype=x.dtype,
                      device=x.device).normal_()
    view = big[tuple(slice(None, None, 2) if i != x.dim() - 1 else slice(1, s + 1) for i, s in enumerate(x.shape))]
    view.copy_(x)
    return view


# Three dims so that last, first and middle dims each have rows on both sides; 5, 3 and 19 are not
# powers of two, so every tile has a masked tail, and rows of 19 start off 16-byte boundaries in
# every dtype. (37 took twice the interpreter's time in CI for the same paths.)
SHAPE = (5, 3, 19)


# Each dim in each layout, by both ops on the GPU; in the interpreter by one op (they alternate, so
# that each op meets every dim and every layout): the two share the kernels' row handling and differ
# in the value they write, and both at every cell took a fifth of CI's budget there.
LAYOUT_CASES = [(op, dim, kind) for i, (dim, kind) in enumerate(
    (dim, kind) for dim in (-1, 0, 1) for kind in ("contiguous", "transposed", "sliced"))
    for op in (OPS if ON_GPU else [list(OPS)[i % 2]])]


@pytest.mark.parametrize("strategy, algorithm", strategy_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("op, dim, kind", LAYOUT_CASES,
                         ids=[f"{op}-{ {-1: 'last', 0: 'first', 1: 'middle'}[dim]}-{kind}" for op, dim, kind in LAYOUT_CASES])
def test_matches_float64(op, dim, kind, dtype, strategy, algorithm, gen):
    ours, ref = OPS[op]
    x = layout(make_logits(SHAPE, dtype, gen), kind, dim)
    out = ours(x, dim, algorithm=algorithm, strategy=strategy)
    assert plan.last_plan().strategy == strategy
    assert out.dtype == dtype and out.shape == x.shape
    assert_matches(out, ref(x.double(), dim), dtype, f"{op} {strategy}/{algorithm} {kind} dim={dim}")


@pytest.mark.parametrize("strategy, algorithm", strategy_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_long_rows_span_many_blocks_and_chunks(strategy, algorithm, dtype, gen):
    # Long enough for several loop iterations and several split chunks with a ragged last one.
    if strategy == "row_on_chip":
        cols = plan.ROW_ON_CHIP_MAX_COLS[dtype.itemsize] - 5
    else:
        cols = 3 * plan.STREAM_BLOCK[dtype.itemsize] + 17
    x = make_logits((2, cols), dtype, gen)
    for op, (ours, ref) in OPS.items():
        out = ours(x, -1, algorithm=algorithm, strategy=strategy)
        chosen = plan.last_plan()
        assert chosen.strategy == strategy
        if strategy == "split_row":
            assert chosen.num_chunks > 1 and cols % chosen.chunk_size != 0
        assert_matches(out, ref(x.double(), -1), dtype, f"{op} {strategy}")
    lse = onlinesoftmax.logsumexp(x, -1, strategy=strategy)
    assert_matches(lse, torch.logsumexp(x.double(), -1), dtype, f"logsumexp {strategy}")


@needs_triton
def test_row_on_chip_packs_short_rows(gen):
    # Short rows: several per program, one program per block of rows, the last block ragged, in
    # both directions (the forward may take fewer rows a program: ROW_TILE_SPREAD_OVER_SMS).
    x = make_logits((4 * 1024 + 3, 24), torch.float32, gen)
    out = onlinesoftmax.softmax(x, strategy="row_on_chip")
    chosen = plan.last_plan()
    assert chosen.rows_per_program > 1 and x.shape[0] % chosen.rows_per_program
    assert chosen.grid[0] == -(-x.shape[0] // chosen.rows_per_program)
    assert_matches(out, torch.softmax(x.double(), -1), torch.float32)
    dy = make_logits(x.shape, torch.float32, gen, scale=1.0)
    dx = softmax_launch.launch_backward(out, dy, 1, False, strategy="row_on_chip")
    backward = plan.last_plan()
    assert backward.rows_per_program > 1 and backward.grid[0] == -(-x.shape[0] // backward.rows_per_program)
    y64 = out.double()
    assert_matches(dx, y64 * (dy.double() - (y64 * dy.double()).sum(-1, keepdim=True)), torch.float32, "backward")


def test_row_on_chip_spreads_few_rows_over_the_sms():
    # The forward packs no more rows a program than leave every SM one (a power of two at most
    # rows / SMs): 10 rows of 221 are ten programs on the H100, not one of 16 rows; many rows fill
    # its tile (ROW_TILE_ELEMENTS: 512 elements, 4096 in the backward, which keeps its tiles); rows
    # of 257-512 elements go two a program from 32 rows an SM (ROW_TILE_MANY_ROWS_*).
    cuda = torch.device("cuda")
    for rows, cols, packed, spread in [(10, 221, 16, 1), (193, 1069, 2, 1), (1024, 256, 16, 2),
                                       (32768, 1024, 4, 1), (65536, 256, 16, 2), (65536, 64, 64, 8),
                                       (8583, 288, 8, 2), (4224, 288, 8, 2), (4223, 288, 8, 1), (600, 400, 8, 1)]:
        forward = plan.choose("softmax", rows, cols, torch.bfloat16, cuda, sms=132, interpreting=False)
        backward = plan.choose("softmax_backward", rows, cols, torch.bfloat16, cuda, sms=132, interpreting=False)
        assert forward.strategy == backward.strategy == "row_on_chip", (rows, cols)
        assert (forward.rows_per_program, backward.rows_per_program) == (spread, packed), (rows, cols)
        assert forward.grid == (-(-rows // spread),)
    with onlinesoftmax.override_plan("softmax", ROW_TILE_SPREAD_OVER_SMS=False):
        assert plan.choose("softmax", 10, 221, torch.bfloat16, cuda, sms=132, interpreting=False).rows_per_program == 2


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_row_on_chip_holding_the_input_dtype(op, dtype, plan_override, gen):
    # The plan holds only long bf16 rows (and fp16 log_softmax's) in their own dtype; forced here at
    # every width and dtype, on a strided view with special values in some rows, so that the held
    # path is judged as the other one is.
    plan_override(ROW_ON_CHIP_HOLD_INPUT_MIN_COLS={d: 1 for d in DTYPES}, ROW_ON_CHIP_HOLD_INPUT_MIN_ROWS_PER_SM={},
                  ROW_ON_CHIP_HOLD_INPUT_GRANULE_ROWS={})
    x = layout(make_logits((6, 2, 37), dtype, gen), "sliced", -1)
    x[0, 0, 3] = float("-inf")
    x[1, 1] = float("-inf")
    x[2, 0, 5] = float("nan")
    x[3, 1, 36] = float("inf")
    if op == "logsumexp":
        out, ref = onlinesoftmax.logsumexp(x, -1, strategy="row_on_chip"), torch.logsumexp(x.double(), -1)
    else:
        out = OPS[op][0](x, -1, strategy="row_on_chip", temperature=0.7)
        ref = OPS[op][1](x.double() / 0.7, -1)
    assert plan.last_plan().hold_input
    assert_matches(out, ref, dtype, f"{op} held in {dtype}")


def test_row_on_chip_holds_only_long_bf16_rows_and_fp16_log_softmax():
    # ... bf16 rows of 32768 (every forward op), fp16's log_softmax from a row an SM on rows of whole
    # 16-byte granules; a held row takes at most ROW_ON_CHIP_HOLD_INPUT_MAX_WARPS (16), the others 32.
    cuda = torch.device("cuda")
    keys = [(op, dtype, rows, cols) for op in ("softmax", "log_softmax") for dtype in DTYPES for rows in (64, 132)
            for cols in (4096, 32768)]
    chosen = {key: plan._choose(key[0], key[2], key[3], key[1], cuda, "auto", None, 132, False) for key in keys}
    held = {key: key[3] == 32768 and (key[1] == torch.bfloat16 or (key[1] == torch.float16 and key[0] == "log_softmax"
                                                                    and key[2] >= 132)) for key in keys}
    assert {key: c.hold_input for key, c in chosen.items()} == held
    assert {key: c.num_warps for key, c in chosen.items() if key[3] == 32768} == {
        key: 16 if held[key] else 32 for key in keys if key[3] == 32768}
    assert not plan._choose("softmax_backward", 64, 32768, torch.bfloat16, cuda, "auto", None, 132, False).hold_input
    granules = {dtype: plan._choose("log_softmax", 262, 32076, dtype, cuda, "auto", None, 132, False, True, True, 4)
                for dtype in (torch.float16, torch.bfloat16)}
    assert {dtype: (c.strategy, c.hold_input) for dtype, c in granules.items()} == {
        torch.float16: ("row_on_chip", False), torch.bfloat16: ("row_on_chip", True)}


@pytest.mark.parametrize("strategy", strategies_here())
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_special_values_match_torch(op, strategy):
    ninf, inf, nan = float("-inf"), float("inf"), float("nan")
    rows = [
        [1.0, ninf, 3.0, ninf, -2.0],  # some -inf
        [ninf] * 5,  # all -inf: softmax NaN, logsumexp -inf
        [1.0, nan, 0.0, 2.0, 1.0],  # NaN poisons the row
        [1.0, inf, 0.0, 2.0, 1.0],  # +inf: softmax NaN, logsumexp +inf
        [inf, nan, ninf, 0.0, 1.0],  # NaN beats +inf in logsumexp
        [ninf, ninf, 7.0, ninf, ninf],  # one finite entry
        [1e4, -1e4, 1e4 - 1, 0.0, -3.0],  # huge magnitudes
    ]
    x = torch.tensor(rows, dtype=torch.float32, device=DEVICE)
    if op == "logsumexp":
        out = onlinesoftmax.logsumexp(x, -1, strategy=strategy)
        ref = torch.logsumexp(x.double(), -1)
    else:
        one_pass = strategy.endswith("on_chip")
        out = OPS[op][0](x, -1, strategy=strategy, algorithm="auto" if one_pass else "online")
        ref = OPS[op][1](x.double(), -1)
    assert plan.last_plan().strategy == strategy
    assert_matches(out, ref, torch.float32, f"{op} {strategy}")


@pytest.mark.parametrize("strategy", strategies_here())
def test_half_precision_extremes(strategy):
    big = torch.finfo(torch.float16).max
    x = torch.tensor([[big, -big, 0.0, big], [-big, -big, -big, 1.0], [6e-8, -6e-8, 0.0, 1e-4]],
                     dtype=torch.float16, device=DEVICE)
    for op, (ours, ref) in OPS.items():
        assert_matches(ours(x, strategy=strategy), ref(x.double(), -1), torch.float16, f"{op} {strategy}")


@pytest.mark.parametrize("strategy", strategies_here())
@pytest.mark.parametrize("shape, dim", [((0, 5), -1), ((4, 0), -1), ((4, 0), 0), ((0,), 0), ((2, 0, 3), 1)])
def test_empty_tensors(shape, dim, strategy):
    x = torch.randn(shape, device=DEVICE)
    for op, (ours, ref) in OPS.items():
        out = ours(x, dim, strategy=strategy)
        assert out.shape == x.shape and out.dtype == x.dtype
    lse = onlinesoftmax.logsumexp(x, dim, strategy=strategy)
    assert_matches(lse, torch.logsumexp(x.double(), dim), torch.float32, "logsumexp of empty")


@pytest.mark.parametrize("strategy", strategies_here())
def test_size_one_dims_and_scalars(strategy, gen):
    for shape, dim in [((7, 1), -1), ((1, 7), -1), ((1, 1, 1), 1), ((5, 1, 9), 1), ((1,), 0)]:
        x = make_logits(shape, torch.float32, gen)
        for op, (ours, ref) in OPS.items():
            assert_matches(ours(x, dim, strategy=strategy), ref(x.double(), dim), torch.float32, f"{op} {shape}")
    scalar = torch.tensor(2.5, device=DEVICE)
    assert onlinesoftmax.softmax(scalar, strategy=strategy).item() == 1.0
    assert onlinesoftmax.log_softmax(scalar, 0, strategy=strategy).item() == 0.0
    assert onlinesoftmax.logsumexp(scalar, strategy=strategy).item() == 2.5


@pytest.mark.parametrize("strategy", strategies_here())
@pytest.mark.parametrize("temperature", [0.25, 3.0])
def test_temperature(temperature, strategy, gen):
    x = make_logits((6, 50), torch.float32, gen)
    for op, (ours, ref) in OPS.items():
        assert_matches(ours(x, temperature=temperature, strategy=strategy),
                       ref(x.double() / temperature, -1), torch.float32, op)


@pytest.mark.parametrize("strategy", strategies_here())
def test_output_dtype(strategy, gen):
    x16 = make_logits((4, 70), torch.bfloat16, gen)
    up = onlinesoftmax.softmax(x16, dtype=torch.float32, strategy=strategy)
    assert up.dtype == torch.float32
    assert_matches(up, torch.softmax(x16.double(), -1), torch.float32, "bf16 -> fp32")
    x32 = make_logits((4, 70), torch.float32, gen)
    down = onlinesoftmax.log_softmax(x32, dtype=torch.bfloat16, strategy=strategy)
    assert down.dtype == torch.bfloat16
    # torch rounds the input to the output dtype first; so do we.
    assert_matches(down, torch.log_softmax(x32.to(torch.bfloat16).double(), -1), torch.bfloat16, "fp32 -> bf16")
    ints = torch.randint(-5, 5, (3, 9), device=DEVICE)
    assert_matches(onlinesoftmax.softmax(ints, dtype=torch.float32, strategy=strategy),
                   torch.softmax(ints.double(), -1), torch.float32, "int with dtype")


@needs_triton
@pytest.mark.parametrize("kind, dim", [("sliced", -1), ("transposed", -1), ("transposed", 0), ("sliced", 1)])
def test_strided_views_are_read_in_place(kind, dim, gen):
    x = layout(make_logits(SHAPE, torch.float32, gen), kind, dim)
    viewed = softmax_launch._row_layout(x, dim % x.dim())[0]
    assert viewed.data_ptr() == x.data_ptr(), "a hidden .contiguous() copy was made"
    assert_matches(onlinesoftmax.softmax(x, dim), torch.softmax(x.double(), dim), torch.float32)


@needs_triton
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape, dim", [((3, 7, 32, 4), 1), ((5, 600), 0)], ids=["channels", "dim-0"])
def test_rows_of_unit_stride_read_along_the_rows(op, dtype, shape, dim, gen, plan_override):
    # A dim that is not the last: consecutive rows are consecutive elements, 128 of them in each
    # channel slice of (3, 7, 32, 4) (two programs of 64 a slice), 600 in (5, 600) over dim 0 (the last
    # program part full), read as a program's run of rows (plan.unit_rows), forward and backward, with
    # a dy of another layout (its rows not of unit stride: the backward reads them as before) and a
    # contiguous one.
    print(f"seed {gen.initial_seed()}")
    plan_override(ROW_UNIT_MIN_PROGRAMS_PER_SM=0, ROW_UNIT_TILE_ELEMENTS={4: {8: 64 * 8}, 2: {8: 64 * 8}},
                  ROW_UNIT_FORWARD_MIN_WIDTH=0, EAGER_HOST_US=plan.EAGER_ROUTE_OFF)
    x = make_logits(shape, dtype, gen).requires_grad_()
    fn = getattr(onlinesoftmax, op)
    y = fn(x, dim)
    forward = plan.last_plan()
    assert (forward.strategy, forward.unit_rows) == ("row_on_chip", True)
    assert forward.rows_per_program == 64
    x64 = x.detach().double().requires_grad_()
    want = getattr(torch, op)(x64, dim)
    assert_matches(y, want, dtype, "forward")
    dy = make_logits(shape[::-1], dtype, gen).permute(*reversed(range(len(shape))))  # strides of another order
    (dx,) = torch.autograd.grad(y, x, dy)
    (want_dx,) = torch.autograd.grad(want, x64, dy.double(), retain_graph=True)
    assert_matches(dx, want_dx, dtype, "gradient")
    dy = make_logits(shape, dtype, gen)
    (dx,) = torch.autograd.grad(fn(x, dim), x, dy)
    assert plan.last_plan().unit_rows
    (want_dx,) = torch.autograd.grad(want, x64, dy.double())
    assert_matches(dx, want_dx, dtype, "gradient, dy contiguous")


@needs_triton
def test_rows_of_unit_stride_over_random_layouts(gen, plan_override):
    # Random shapes, dims and layouts (contiguous, a transposed copy viewed back, every other column),
    # dy contiguous or of the reversed order, with the unit-rows path at every width from 2 to 128:
    # wherever a program's rows are consecutive elements it reads them along the rows, elsewhere as before.
    tiles = {width: 64 * width for width in (2, 4, 8, 16, 32, 64, 128)}
    plan_override(ROW_UNIT_MIN_PROGRAMS_PER_SM=0, ROW_UNIT_FORWARD_MIN_WIDTH=0,
                  ROW_UNIT_TILE_ELEMENTS={4: tiles, 2: tiles}, EAGER_HOST_US=plan.EAGER_ROUTE_OFF)
    pick = lambda choices: choices[int(torch.randint(len(choices), (), generator=gen))]  # noqa: E731
    unit_plans = 0
    for case in range(12):  # the first case's channels are rows of unit stride whatever the seed
        shape = [3, 5, 48] if case == 0 else [pick((1, 3, 5, 16, 32, 48, 96)) for _ in range(pick((2, 3, 4)))]
        dim = 1 if case == 0 else pick(range(len(shape)))
        dtype, op = pick((torch.float32, torch.bfloat16)), pick(("softmax", "log_softmax"))
        layout_kind = "contiguous" if case == 0 else pick(("contiguous", "transposed", "sliced"))
        x = make_logits(shape[:-1] + [2 * shape[-1]] if layout_kind == "sliced" else shape, dtype, gen)
        if layout_kind == "sliced":
            x = x[..., ::2]
        elif layout_kind == "transposed" and len(shape) > 1:
            x = x.transpose(0, -1).contiguous().transpose(0, -1)
        x.requires_grad_()
        what = f"{op} {tuple(x.shape)} strides {x.stride()} dim {dim} {dtype}"
        y = getattr(onlinesoftmax, op)(x, dim)
        unit_plans += plan.last_plan().unit_rows
        dy = make_logits(shape[::-1], dtype, gen).permute(*reversed(range(len(shape)))) if pick((0, 1)) else \
            make_logits(shape, dtype, gen)
        (dx,) = torch.autograd.grad(y, x, dy)
        unit_plans += plan.last_plan().unit_rows
        x64 = x.detach().double().requires_grad_()
        want = getattr(torch, op)(x64, dim)
        (want_dx,) = torch.autograd.grad(want, x64, dy.double())
        assert_matches(y, want, dtype, what)
        assert_matches(dx, want_dx, dtype, what + " gradient")
    print(f"{unit_plans} of 24 launches read rows of unit stride")
    assert unit_plans >= 1


def test_rows_of_unit_stride_plans_for_the_gpu():
    # Rows of unit stride take their tiles at the widths measured ahead: the backward at 32 columns,
    # both directions at 128 (bf16 (64, 128, 32, 32) over dim 1: 64 rows a program), not the
    # forward at 32 nor either at 4 (unmeasured).
    def choose(op, shape, dtype=torch.bfloat16):
        layout = torch.empty(shape, dtype=dtype, device="meta")
        return softmax_launch._make_recipe(layout, 1, op, "auto", None, torch.device("cuda"), sms=132,
                                           interpreting=False).plan

    assert not choose("softmax", (8, 21, 256, 256)).unit_rows
    assert choose("softmax_backward", (8, 21, 256, 256)).rows_per_program == 512
    assert choose("softmax", (64, 128, 32, 32)).rows_per_program == choose("log_softmax_backward",
                                                                           (64, 128, 32, 32)).rows_per_program == 64
    assert choose("softmax", (16, 1024, 1024)).unit_rows
    assert not choose("softmax", (16, 1024, 1024), torch.float32).unit_rows
    assert not choose("softmax_backward", (4, 3, 1000, 1000)).unit_rows
    assert not choose("softmax", (64, 128)).unit_rows  # the last dim: rows of cols elements


def test_uncollapsible_view_is_copied_and_correct(gen):
    # Rows that need three strides (a permuted 4-d tensor) fall back to one documented copy.
    x = make_logits((4, 5, 6, 7), torch.float32, gen).permute(2, 0, 3, 1)
    viewed = softmax_launch._row_layout(x, 1)[0]
    assert viewed.data_ptr() != x.data_ptr()
    assert_matches(onlinesoftmax.softmax(x, 1), torch.softmax(x.double(), 1), torch.float32)


@pytest.mark.parametrize("strategy, algorithm", strategy_params())
def test_bitwise_deterministic(strategy, algorithm, gen):
    x = make_logits((3, 3 * plan.STREAM_BLOCK[4] + 1), torch.float32, gen)
    first = onlinesoftmax.softmax(x, algorithm=algorithm, strategy=strategy)
    second = onlinesoftmax.softmax(x, algorithm=algorithm, strategy=strategy)
    assert torch.equal(first, second)


# ----------------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", strategies_here())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dim, kind", [(-1, "contiguous"), (0, "transposed"), (1, "sliced")])
def test_gradients_match_float64_autograd(op, dtype, strategy, dim, kind, gen):
    ours, ref = OPS[op]
    x = layout(make_logits(SHAPE, dtype, gen, scale=2.0, outliers=False), kind, dim).requires_grad_()
    dy = make_logits(SHAPE, dtype, gen, scale=1.0)
    out = ours(x, dim, temperature=1.5, strategy=strategy)
    (dx,) = torch.autograd.grad(out, x, dy)
    # The "torch" strategy's backward is torch's own autograd: no plan of ours runs for it.
    assert plan.last_plan().strategy == strategy
    assert plan.last_plan().op == (op if strategy == "torch" else f"{op}_backward")
    if dtype == torch.float32:
        # End to end: the gradient of the float64 function of the same input.
        x64 = x.detach().double().requires_grad_()
        (dx64,) = torch.autograd.grad(ref(x64 / 1.5, dim), x64, dy.double())
    else:
        # A half-precision gradient is computed from the stored, rounded y (as torch's is), and
        # dy - <dy, y> cancels: the end-to-end error of a correct kernel sits at the tolerance. The
        # float64 reference here takes the same y, so the kernel's own arithmetic is what is judged.
        y64, dy64 = out.detach().double(), dy.double()
        if op == "softmax":
            dx64 = y64 * (dy64 - (y64 * dy64).sum(dim, keepdim=True)) / 1.5
        else:
            dx64 = (dy64 - y64.exp() * dy64.sum(dim, keepdim=True)) / 1.5
    assert dx.dtype == dtype
    assert_matches(dx, dx64, dtype, f"d{op} {strategy}")


@needs_triton
@pytest.mark.parametrize("op", list(OPS))
def test_eager_backward_found_by_upstream_layout(op, gen):
    # An eager differentiated call passes its prepared forward to autograd, which finds the
    # backward by dy's layout alone (op._EagerSoftmaxFunction): one forward signature met by
    # upstream gradients of three layouts, and a float32 output of bfloat16 input (dx in bfloat16),
    # each against float64 from our y.
    ours, _ = OPS[op]
    x = make_logits((6, 40), torch.bfloat16, gen, scale=2.0, outliers=False).requires_grad_()
    for out_dtype in (None, torch.float32):
        out = ours(x, -1, dtype=out_dtype, strategy="row_on_chip")
        for kind in ("contiguous", "transposed", "broadcast"):
            dy = make_logits(out.shape, out.dtype, gen, scale=1.0)
            dy = dy.t().contiguous().t() if kind == "transposed" else dy[:1].expand_as(out) if kind == "broadcast" else dy
            (dx,) = torch.autograd.grad(out, x, dy, retain_graph=True)
            assert plan.last_plan().op == f"{op}_backward" and dx.dtype == torch.bfloat16
            assert_matches(dx, grad64(op, out, dy), torch.bfloat16, f"d{op} {kind} dy, out {out_dtype}")


@needs_triton
@pytest.mark.parametrize("strategy", ["looped", "split_row", "split_row_on_chip"])
def test_gradients_of_long_rows(strategy, gen):
    cols = 3 * plan.STREAM_BLOCK[4] + 17
    x = make_logits((2, cols), torch.float32, gen, outliers=False).requires_grad_()
    dy = make_logits((2, cols), torch.float32, gen, scale=1.0)
    for op, (ours, ref) in OPS.items():
        (dx,) = torch.autograd.grad(ours(x, strategy=strategy), x, dy)
        chosen = plan.last_plan()
        assert chosen.strategy == strategy and (strategy != "split_row" or chosen.num_chunks > 1)
        x64 = x.detach().double().requires_grad_()
        (dx64,) = torch.autograd.grad(ref(x64, -1), x64, dy.double())
        assert_matches(dx, dx64, torch.float32, f"d{op} {strategy}")


def test_logsumexp_gradient_is_softmax(gen):
    x = make_logits((5, 33), torch.float32, gen, outliers=False).requires_grad_()
    dy = make_logits((5,), torch.float32, gen, scale=1.0)
    (dx,) = torch.autograd.grad(onlinesoftmax.logsumexp(x, -1), x, dy)
    x64 = x.detach().double().requires_grad_()
    (dx64,) = torch.autograd.grad(torch.logsumexp(x64, -1), x64, dy.double())
    assert_matches(dx, dx64, torch.float32, "dlogsumexp")


def test_torch_compile_fullgraph_forward_and_backward(gen):
    # aot_eager runs dynamo and AOT autograd (the fake implementations, the autograd.Function)
    # without compiling C++; the GPU suite runs the same test under the default inductor.
    backend = "inductor" if ON_GPU else "aot_eager"
    torch._dynamo.reset()

    def f(x):
        return (onlinesoftmax.softmax(x * 2.0, -1) * onlinesoftmax.log_softmax(x, 0)).sum() \
            + onlinesoftmax.logsumexp(x, 1).sum()

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    x = make_logits((8, 40), torch.float32, gen, outliers=False).requires_grad_()
    out = compiled(x)
    (dx,) = torch.autograd.grad(out, x)
    x64 = x.detach().double().requires_grad_()
    ref = (torch.softmax(x64 * 2.0, -1) * torch.log_softmax(x64, 0)).sum() + torch.logsumexp(x64, 1).sum()
    (dx64,) = torch.autograd.grad(ref, x64)
    assert_matches(out.detach().reshape(1), ref.detach().reshape(1), torch.float32, "compiled forward")
    assert_matches(dx, dx64, torch.float32, "compiled backward")


def test_custom_ops_pass_opcheck(gen):
    x = make_logits((4, 20), torch.float32, gen)
    torch.library.opcheck(softmax_op._forward_op, (x, 1, "softmax", 1.0, None, "auto", None))
    torch.library.opcheck(softmax_op._forward_op, (x, 0, "logsumexp", 1.0, None, "auto", None))
    y = torch.softmax(x, 1)
    torch.library.opcheck(softmax_op._backward_op, (y, torch.randn_like(y), 1, False, 1.0, None, None))


# ----------------------------------------------------------------------------------------------
# Property test
# ----------------------------------------------------------------------------------------------


@settings(max_examples=30 if TRITON_RUNS else 60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3), data=st.data(),
       dtype=st.sampled_from(DTYPES), log_scale=st.floats(-3, 3), op=st.sampled_from(sorted(OPS)))
def test_property_random_shapes_dims_dtypes_scales(shape, data, dtype, log_scale, op):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    x = make_logits(shape, dtype, torch.Generator().manual_seed(seed), scale=10.0 ** log_scale)
    ours, ref = OPS[op]
    assert_matches(ours(x, dim), ref(x.double(), dim), dtype, f"{op} {shape} dim={dim}")


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [onlinesoftmax.softmax, onlinesoftmax.log_softmax, onlinesoftmax.logsumexp])
def test_bad_input_raises_clear_errors(fn):
    x = torch.randn(3, 4)
    if fn is not onlinesoftmax.logsumexp:  # torch.logsumexp takes integers (in the default float dtype)
        with pytest.raises(TypeError, match="floating-point"):
            fn(torch.ones(3, 4, dtype=torch.int64))
        with pytest.raises(TypeError, match="floating-point"):
            fn(torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="Tensor"):
        fn([1.0, 2.0])
    with pytest.raises(ValueError, match="out of range"):
        fn(x, 2)
    with pytest.raises(IndexError):
        fn(x, -3)
    with pytest.raises(ValueError, match="CUDA and CPU"):
        fn(torch.randn(3, 4, device="meta"))
    with pytest.raises(ValueError, match="strategy"):
        fn(x, strategy="fastest")
    with pytest.raises(ValueError, match="Triton kernels"):
        fn(x.double(), strategy="looped")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("fn, ref", [(onlinesoftmax.softmax, torch.softmax), (onlinesoftmax.log_softmax, torch.log_softmax)],
                         ids=["softmax", "log_softmax"])
def test_torchs_kernel_with_a_temperature_keeps_the_dtype(fn, ref, dtype, gen):
    # The torch strategy (CPU tensors, small eager CUDA calls) divides in float32 and rounds once to x's dtype.
    x = make_logits((5, 300), dtype, gen)
    out = fn(x, -1, temperature=2.5, strategy="torch")
    assert out.dtype == dtype
    assert_matches(out, ref(x.double() / 2.5, -1), dtype, "temperature 2.5")
    assert fn(x, -1, torch.float32, temperature=2.5, strategy="torch").dtype == torch.float32


@pytest.mark.parametrize("fn, ref", [(onlinesoftmax.softmax, torch.softmax), (onlinesoftmax.log_softmax, torch.log_softmax),
                                     (onlinesoftmax.logsumexp, torch.logsumexp)])
def test_dtypes_the_kernels_do_not_take_give_torchs_answer(fn, ref, gen):
    # float64 (and integer logsumexp) as torch computes them: the plan hands them to torch's kernels.
    x = make_logits((3, 70), torch.float64, gen)
    assert torch.equal(fn(x, 1), ref(x, 1)) and fn(x, 1).dtype == torch.float64
    assert plan.last_plan().strategy == "torch"
    ints = torch.randint(-5, 5, (4, 9), generator=gen).to(DEVICE)
    if fn is onlinesoftmax.logsumexp:
        assert_matches(fn(ints, 1), ref(ints.double(), 1), torch.float32)
        assert fn(ints, 1).dtype == torch.get_default_dtype()
    else:
        out = fn(ints, 1, torch.float64)  # dtype positional, as torch allows
        assert out.dtype == torch.float64 and torch.allclose(out, ref(ints, 1, dtype=torch.float64))


def test_logsumexp_takes_several_dims_and_keepdim(gen):
    x = make_logits((4, 5, 6), torch.float32, gen)
    for dim, keepdim in (((0, 2), False), ((2, 0), True), (1, True), ((-1, -2, -3), False)):
        assert_matches(onlinesoftmax.logsumexp(x, dim, keepdim), torch.logsumexp(x.double(), dim, keepdim),
                       torch.float32, f"dim={dim} keepdim={keepdim}")
    assert onlinesoftmax.logsumexp(torch.tensor(2.0, device=DEVICE), 0, True).shape == ()


@pytest.mark.parametrize("fn", [onlinesoftmax.softmax, onlinesoftmax.log_softmax])
def test_bad_options_raise(fn):
    x = torch.randn(3, 4)
    for temperature in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            fn(x, temperature=temperature)
    with pytest.raises(TypeError, match="temperature"):
        fn(x, temperature="hot")
    with pytest.raises(ValueError, match="algorithm"):
        fn(x, algorithm="two-pass")
    with pytest.raises(TypeError, match="dtype"):
        fn(x, dtype=torch.int32)
    with pytest.raises(TypeError, match="dtype"):
        fn(x, -1, "float32")


@needs_triton
@pytest.mark.parametrize("strategy", ["row_on_chip", "split_row_on_chip"])
def test_on_chip_strategies_refuse_multi_pass_algorithms(strategy):
    with pytest.raises(ValueError, match="reads the row once"):
        onlinesoftmax.softmax(torch.randn(3, 4, device=DEVICE), algorithm="safe", strategy=strategy)


def test_split_row_on_chip_tiles_by_direction_and_element_size(plan_override):
    # Table values are bytes, or {element size: bytes}; tiles are powers of two in elements, one warp
    # per WARP_BYTES of a tile.
    plan_override(SPLIT_ON_CHIP_TILE_BYTES={"forward": 8192, "backward": {4: 32768, 2: 16384}})
    plan_override(SPLIT_ON_CHIP_WARP_BYTES={"forward": 2048, "backward": {4: 8192, 2: 1024}})
    cuda = torch.device("cuda")
    chosen = {(op, dtype): plan._choose(op, 64, 128256, dtype, cuda, "auto", None, 132, False)
              for op in ("softmax", "softmax_backward") for dtype in (torch.float32, torch.bfloat16)}
    assert all(c.strategy == "split_row_on_chip" for c in chosen.values())
    tiles = {key: (c.block_cols, c.num_warps) for key, c in chosen.items()}
    # fp32's forward runs uncapped, past one wave on a warp per SPLIT_ON_CHIP_UNCAPPED_WARP_BYTES.
    assert tiles == {("softmax", torch.float32): (2048, 2), ("softmax", torch.bfloat16): (4096, 4),
                     ("softmax_backward", torch.float32): (8192, 4),
                     ("softmax_backward", torch.bfloat16): (8192, 16)}
    # Rows that start off 16-byte boundaries: the 2-byte backward takes fewer warps a tile.
    plan_override(SPLIT_ON_CHIP_MISALIGNED_BACKWARD_WARP_BYTES={4: 8192, 2: 4096})
    odd = {dtype: plan._choose("softmax_backward", 2048, 50257, dtype, cuda, "auto", None, 132, False, True)
           for dtype in (torch.float32, torch.bfloat16)}
    assert {dtype: (c.strategy, c.block_cols, c.num_warps) for dtype, c in odd.items()} == {
        torch.float32: ("split_row_on_chip", 8192, 4), torch.bfloat16: ("split_row_on_chip", 8192, 4)}
    # So do rows on 16-byte boundaries read in granules (a length of 8 mod 16), and only those (below
    # four rows an SM, where the softmax backward's other rows keep 16).
    for cols, granules, warps in ((95704, True, 4), (95712, False, 16)):
        chosen = plan._choose("softmax_backward", 500, cols, torch.bfloat16, cuda, "auto", None, 132, False, False,
                              granules)
        assert (chosen.strategy, chosen.block_cols, chosen.num_warps) == ("split_row_on_chip", 8192, warps), cols
    # The 2-byte softmax backward (not log_softmax's) of other rows takes 8 warps a tile in bf16 and 4 in
    # fp16 from four rows an SM (SPLIT_ON_CHIP_SOFTMAX_BACKWARD_*).
    many_rows_warps = [("softmax_backward", torch.bfloat16, 528, 8), ("softmax_backward", torch.float16, 8192, 4),
                       ("softmax_backward", torch.float16, 527, 16),
                       ("softmax_backward", torch.bfloat16, 527, 16), ("softmax_backward", torch.float32, 8192, 4),
                       ("log_softmax_backward", torch.bfloat16, 8192, 16)]
    for op, dtype, rows, warps in many_rows_warps:
        chosen = plan._choose(op, rows, 65536, dtype, cuda, "auto", None, 132, False)
        assert (chosen.strategy, chosen.num_warps) == ("split_row_on_chip", warps), (op, dtype, rows)


def test_misaligned_rows_of_a_large_tile_split(plan_override):
    # Rows off 16-byte boundaries (misaligned_rows) whose row_on_chip tile is above
    # ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS and at least ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_FILL full take
    # split_row_on_chip, forward and backward, but rows of ROW_ON_CHIP_WHOLE_MIN_ROW_BYTES vectors
    # below ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_ROWS_PER_SM rows an SM (by op and dtype; None: any
    # count) are held whole; aligned rows, emptier tiles, logsumexp and fp32 stay.
    limits = {"softmax": 2, "log_softmax": 3, "softmax_backward": 8, "log_softmax_backward": 5}
    plan_override(ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_FILL={4: None, 2: 0.7}, ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS=16384,
                  ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_ROWS_PER_SM={
                      op: {torch.bfloat16: limit, torch.float16: None} for op, limit in limits.items()},
                  ROW_ON_CHIP_WHOLE_MIN_ROW_BYTES=8)
    cuda = torch.device("cuda")

    def strategy(op, cols, dtype=torch.bfloat16, misaligned=True, rows=262, row_multiple=None):
        row_multiple = row_multiple or cols & -cols  # a contiguous tensor's (lowest set bit of its length)
        return plan._choose(op, rows, cols, dtype, cuda, "auto", None, 132, False, misaligned, misaligned,
                            row_multiple).strategy

    for op, limit in limits.items():
        few = limit * 132
        assert strategy(op, 32001) == strategy(op, 23612, rows=few) == strategy(op, 32076, rows=few) \
            == "split_row_on_chip", op
        assert strategy(op, 26020, rows=few - 1) == strategy(op, 32076, torch.float16, rows=8) == "row_on_chip", op
        assert strategy(op, 26020, torch.float16, rows=64 * 132) == "row_on_chip", op  # None: any count
        # Rows of 2- or 4-byte vectors split however few.
        assert strategy(op, 32001, rows=8) == strategy(op, 26022, rows=8) == "split_row_on_chip", op
        assert strategy(op, 32001, torch.float16, rows=8) == "split_row_on_chip", op
        assert strategy(op, 32076, misaligned=False) == "row_on_chip", op
        assert strategy(op, 32076, torch.float32) == "row_on_chip", op
        assert strategy(op, 22000) != "split_row_on_chip", op  # 67% of the tile
        assert strategy(op, 16001) != "split_row_on_chip", op  # a tile of 16384
    assert strategy("logsumexp", 32076) == "row_on_chip"


def test_misaligned_one_chunk_rows_of_vectors_held_whole(plan_override):
    # ROW_ON_CHIP_VECTOR_ROWS_WHOLE_TILES: rows off 16-byte boundaries that MISALIGNED_ONE_CHUNK_* take
    # as one chunk are held whole where they are rows of ROW_ON_CHIP_WHOLE_MIN_ROW_BYTES vectors and
    # the table names their tile for the op and dtype; odd lengths, other tiles, ops and dtypes stay.
    plan_override(MISALIGNED_MIN_ROWS_PER_SM={4: 8, 2: 4}, ROW_ON_CHIP_WHOLE_MIN_ROW_BYTES=8,
                  MISALIGNED_ONE_CHUNK_TILES={"forward": {4: (16384,), 2: (8192, 16384)},
                                              "backward": {4: (16384,), 2: (8192, 16384)}},
                  MISALIGNED_ONE_CHUNK_MIN_FILL={"forward": 0.0, "backward": 0.6},
                  ROW_ON_CHIP_VECTOR_ROWS_WHOLE_TILES={"softmax": {torch.bfloat16: (8192,)},
                                                       "softmax_backward": {torch.float16: (8192,)}})
    cuda = torch.device("cuda")

    def choose(op, cols, dtype, rows=1056):
        chosen = plan._choose(op, rows, cols, dtype, cuda, "auto", None, 132, False, True, True, cols & -cols)
        return chosen.strategy, chosen.num_chunks

    bf16, fp16 = torch.bfloat16, torch.float16
    assert choose("softmax", 6004, bf16) == choose("softmax_backward", 6004, fp16) == ("row_on_chip", 1)
    for op, cols, dtype in (("softmax", 6001, bf16), ("softmax", 6004, fp16), ("softmax", 12004, bf16),
                            ("log_softmax", 6004, bf16), ("softmax_backward", 6004, bf16),
                            ("softmax_backward", 6001, fp16), ("log_softmax_backward", 6004, fp16)):
        assert choose(op, cols, dtype) == ("split_row_on_chip", 1), (op, cols, dtype)


def test_misaligned_backward_rows_of_large_tiles_loop(plan_override):
    # BACKWARD_MISALIGNED_LOOPED_MIN_TILE: backward rows off 16-byte boundaries whose row_on_chip tile
    # is at least that size take looped, however full, but for the full large tiles that split;
    # aligned rows, the forward, smaller tiles, fp32 and few rows stay.
    plan_override(BACKWARD_MISALIGNED_LOOPED_MIN_TILE={4: None, 2: 8192}, BACKWARD_MISALIGNED_LOOPED_MIN_ELEMENTS_PER_SM=32768,
                  ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_FILL={4: None, 2: 0.7}, ROW_ON_CHIP_PADDED_SPLIT_MAX_COLS=16384,
                  # (one chunk: the test after the next)
                  MISALIGNED_ONE_CHUNK_TILES=dict(plan.MISALIGNED_ONE_CHUNK_TILES, backward={4: (), 2: ()}))
    cuda = torch.device("cuda")

    def strategy(op, cols, dtype=torch.bfloat16, misaligned=True, rows=3077):
        return plan._choose(op, rows, cols, dtype, cuda, "auto", None, 132, False, misaligned).strategy

    for op in ("softmax_backward", "log_softmax_backward"):
        # From 32768 elements of tiles an SM: 264 rows of 16384, 528 of 8192.
        assert strategy(op, 12867, rows=264) == "looped" and strategy(op, 12867, rows=263) == "row_on_chip", op
        assert strategy(op, 7001, rows=528) == "looped" and strategy(op, 7001, rows=527) == "row_on_chip", op
        assert strategy(op, 12867) == strategy(op, 16383) == strategy(op, 12867, torch.float16) == "looped", op
        assert strategy(op, 12867, misaligned=False) == "row_on_chip", op
        assert strategy(op, 12867, torch.float32) == "row_on_chip", op
        assert strategy(op, 7001) == strategy(op, 21001) == "looped", op  # tiles of 8192 and 32768
        assert strategy(op, 4001) == "row_on_chip", op  # a tile of 4096
        assert strategy(op, 32076) == "split_row_on_chip", op  # 98% of a tile of 32768
    # (the forward's own rule for many such rows: the next test)
    assert strategy("softmax", 12867, rows=264) == strategy("log_softmax", 12867, rows=264) == "row_on_chip"


def test_many_misaligned_forward_rows_split_or_take_fewer_warps(plan_override):
    # MISALIGNED_FORWARD_*: from 4 (2-byte) or 8 (fp32) rows an SM, forward rows off 16-byte
    # boundaries take split_row_on_chip from a tile of 16384 (rows that fit a tile of
    # MISALIGNED_ONE_CHUNK_TILES with a chunk's margin: as one chunk of it, a warp per 4096 bytes),
    # and fewer warps held whole at the tiles ROW_ON_CHIP_MISALIGNED_FORWARD_WARPS names; aligned
    # rows, few rows, logsumexp and the backward keep their plans.
    plan_override(MISALIGNED_MIN_ROWS_PER_SM={4: 8, 2: 4}, MISALIGNED_FORWARD_SPLIT_MIN_TILE=16384,
                  MISALIGNED_ONE_CHUNK_TILES={"forward": {4: (16384,), 2: (8192, 16384)}, "backward": {4: (), 2: ()}},
                  MISALIGNED_ONE_CHUNK_WARP_BYTES=dict(plan.MISALIGNED_ONE_CHUNK_WARP_BYTES,
                                                       forward=dict.fromkeys(plan.KERNEL_DTYPES, 4096)),
                  ROW_ON_CHIP_MISALIGNED_FORWARD_WARPS={8192: 8},
                  SPLIT_ON_CHIP_WARP_BYTES={"forward": 2048, "backward": {4: 8192, 2: 1024}},
                  ROW_ON_CHIP_MIN_FILL={4: 0.0, 2: 0.6}, ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_FILL={4: None, 2: 0.7},
                  BACKWARD_MISALIGNED_LOOPED_MIN_TILE={4: None, 2: None})  # (so that the backward holds these)
    cuda = torch.device("cuda")

    def choose(op, rows, cols, dtype=torch.bfloat16, misaligned=True):
        chosen = plan._choose(op, rows, cols, dtype, cuda, "auto", None, 132, False, misaligned)
        if chosen.strategy == "split_row_on_chip":
            return chosen.strategy, chosen.num_warps, chosen.num_chunks, chosen.block_cols
        return chosen.strategy, chosen.num_warps

    for op in ("softmax", "log_softmax"):
        assert choose(op, 528, 12867) == ("split_row_on_chip", 8, 1, 16384), op  # one chunk
        assert choose(op, 8192, 5001) == ("split_row_on_chip", 4, 1, 8192), op
        assert choose(op, 8192, 8187) == ("row_on_chip", 8), op  # 8187 + 15 > 8192: held whole on 8 warps
        assert choose(op, 528, 21001)[:1] == choose(op, 1024, 21001, torch.float16)[:1] == ("split_row_on_chip",), op
        assert choose(op, 528, 21001)[2] > 1, op
        assert choose(op, 527, 12867) == ("row_on_chip", 32), op
        assert choose(op, 527, 5001) == ("row_on_chip", 16), op
        assert choose(op, 1056, 12867, torch.float32) == ("split_row_on_chip", 16, 1, 16384), op
        split = choose(op, 1056, 21001, torch.float32)
        assert split[0] == "split_row_on_chip" and split[2] > 1, op  # a tile not named: the table's chunks
        assert choose(op, 1055, 12867, torch.float32) == ("row_on_chip", 32), op
        assert choose(op, 8192, 5001, torch.float32) == ("row_on_chip", 8), op
        assert choose(op, 8192, 12867, misaligned=False) == ("row_on_chip", 32), op
        assert choose(op, 8192, 5008, misaligned=False) == ("row_on_chip", 16), op
        assert choose(op, 8192, 3001) == choose(op, 8192, 3001, torch.float32) == ("row_on_chip", 8), op  # the table's
    assert choose("logsumexp", 8192, 12867)[0] == "row_on_chip"
    assert choose("logsumexp", 8192, 5001) == ("row_on_chip", 16)
    assert choose("softmax_backward", 8192, 5001) == ("row_on_chip", 16)


def test_many_misaligned_backward_rows_take_one_chunk(plan_override):
    # MISALIGNED_*: from 4 (2-byte) or 8 (fp32) rows an SM, backward rows off
    # 16-byte boundaries that fill at least 60% of a tile it names (with a chunk's margin) take
    # split_row_on_chip as one chunk of it, a warp per 2048 bytes (fp32 softmax: 8192, fp16: 4096),
    # ahead of looped and the tail.
    plan_override(MISALIGNED_MIN_ROWS_PER_SM={4: 8, 2: 4}, MISALIGNED_ONE_CHUNK_TAIL_BELOW_FILL={4: 0.0, 2: 0.0},
                  MISALIGNED_ONE_CHUNK_TILES={"forward": {4: (), 2: (8192, 16384)},
                                              "backward": {4: (16384,), 2: (8192, 16384)}},
                  MISALIGNED_ONE_CHUNK_MIN_FILL={"forward": 0.0, "backward": 0.6},
                  MISALIGNED_ONE_CHUNK_WARP_BYTES={op: {torch.float32: fp32, torch.bfloat16: 2048, torch.float16: 4096}
                                                   for op, fp32 in (("softmax_backward", 8192),
                                                                    ("log_softmax_backward", 2048))})
    cuda = torch.device("cuda")

    def choose(op, rows, cols, dtype=torch.bfloat16, misaligned=True):
        chosen = plan._choose(op, rows, cols, dtype, cuda, "auto", None, 132, False, misaligned)
        return chosen.strategy, chosen.num_chunks, chosen.block_cols, chosen.num_warps

    for op in ("softmax_backward", "log_softmax_backward"):
        assert choose(op, 528, 12867) == ("split_row_on_chip", 1, 16384, 16), op
        assert choose(op, 8192, 5001) == ("split_row_on_chip", 1, 8192, 8), op
        assert choose(op, 8192, 5001, torch.float16) == ("split_row_on_chip", 1, 8192, 4), op
        assert choose(op, 1056, 12867, torch.float32) == ("split_row_on_chip", 1, 16384,
                                                          8 if op == "softmax_backward" else 32), op
        assert choose(op, 527, 12867)[0] == "looped" and choose(op, 1055, 12867, torch.float32)[0] == "row_on_chip", op
        assert choose(op, 8192, 8187)[0] == "looped", op  # 8187 + 15 > 8192
        assert choose(op, 8192, 4097)[0] == "row_on_chip", op  # 50% of 8192: the head and tail
        assert choose(op, 8192, 5001, torch.float32)[0] == "row_on_chip", op  # fp32 at 8192: not named
        assert choose(op, 8192, 12872, misaligned=False)[0] == "row_on_chip", op
        assert choose(op, 1024, 21001)[0] == "looped", op  # a tile of 32768


def test_one_chunk_backward_rows_take_a_head_and_a_tail(plan_override):
    # MISALIGNED_ONE_CHUNK_TAIL_*: a one-chunk backward row under 75% of its tile (15 elements of
    # margin included) is held as a head of half the tile and a tail, a warp per 2048 bytes of the
    # head (fp32 softmax: 4096); the forward keeps the whole tile.
    plan_override(MISALIGNED_ONE_CHUNK_TAIL_BELOW_FILL={4: 0.75, 2: 0.75},
                  MISALIGNED_ONE_CHUNK_TAIL_WARP_BYTES={"softmax_backward": {4: 4096, 2: 2048},
                                                        "log_softmax_backward": {4: 2048, 2: 2048}})
    cuda = torch.device("cuda")

    def choose(op, rows, cols, dtype):
        chosen = plan._choose(op, rows, cols, dtype, cuda, "auto", None, 132, False, True)
        return chosen.strategy, chosen.num_chunks, chosen.block_cols, chosen.tail_cols, chosen.num_warps

    one_chunk = ("split_row_on_chip", 1)
    assert choose("softmax_backward", 4096, 10007, torch.float32) == (*one_chunk, 8192, 2048, 8)
    assert choose("log_softmax_backward", 4096, 10007, torch.float32) == (*one_chunk, 8192, 2048, 16)
    assert choose("log_softmax_backward", 20000, 12001, torch.float32) == (*one_chunk, 8192, 4096, 16)
    for op in plan.BACKWARD_OPS:
        assert choose(op, 4096, 10007, torch.bfloat16) == (*one_chunk, 8192, 2048, 8), op
        assert choose(op, 8192, 5001, torch.float16) == (*one_chunk, 4096, 1024, 4), op
        assert choose(op, 8192, 12257, torch.bfloat16)[2:4] == (8192, 4096), op  # 12272 with the margin: under 75%
        assert choose(op, 8192, 12258, torch.bfloat16)[2:4] == (16384, 0), op
    assert choose("log_softmax", 4096, 10007, torch.float32)[2:4] == (16384, 0)


def test_split_row_chunks_by_rows(plan_override):
    # SPLIT_PROGRAMS_PER_SM by rows: one row aims at 2 programs an SM, more rows at 8.
    plan_override(SPLIT_PROGRAMS_PER_SM=((1, 2), (1 << 62, 8)))
    cuda = torch.device("cuda")
    one = plan._choose("softmax", 1, 1 << 24, torch.float32, cuda, "auto", None, 132, False)
    many = plan._choose("softmax", 198, 615032, torch.bfloat16, cuda, "auto", None, 132, False)
    assert (one.strategy, one.num_chunks) == ("split_row", 256)  # 264 wanted, whole stream blocks each
    assert (many.strategy, many.num_chunks) == ("split_row", 6)


def test_looped_backwards_take_their_own_stream_configs(plan_override):
    # LOG_BACKWARD_STREAM: (block, warps) of looped's log_softmax backward; SOFTMAX_BACKWARD_STREAM
    # its softmax backward's, for the element sizes it names and rows up to
    # SOFTMAX_BACKWARD_STREAM_MAX_COLS; the rest and the forwards keep STREAM_BLOCK / STREAM_WARPS;
    # blocks never exceed the row's tile.
    plan_override(LOG_BACKWARD_STREAM={2: (4096, 16), 4: (2048, 32)}, STREAM_WARPS=8,
                  SOFTMAX_BACKWARD_STREAM={2: (2048, 4)}, SOFTMAX_BACKWARD_STREAM_MAX_COLS=16384)
    cuda = torch.device("cuda")

    def looped(op, cols, dtype):
        chosen = plan._choose(op, 64, cols, dtype, cuda, "auto", "looped", 132, False)
        return chosen.block_cols, chosen.num_warps

    assert looped("log_softmax_backward", 8200, torch.bfloat16) == (4096, 16)
    assert looped("log_softmax_backward", 8200, torch.float32) == (2048, 32)
    assert looped("log_softmax_backward", 1000, torch.bfloat16) == (1024, 16)
    assert looped("softmax_backward", 8200, torch.bfloat16) == (2048, 4)
    assert looped("softmax_backward", 1000, torch.bfloat16) == (1024, 4)
    assert looped("softmax_backward", 16385, torch.bfloat16) == (plan.STREAM_BLOCK[2], 8)
    assert looped("softmax_backward", 8200, torch.float32) == (plan.STREAM_BLOCK[4], 8)
    assert looped("log_softmax", 8200, torch.bfloat16) == (plan.STREAM_BLOCK[2], 8)


def test_half_empty_float32_log_softmax_tiles_split():
    # ROW_ON_CHIP_LOG_MIN_FILL: float32 log_softmax rows over 8192 that fill 55-60% of their tile
    # are held by several programs (forward only; under 55% the row is a head and a tail on chip,
    # ROW_ON_CHIP_TAIL_BELOW_FILL); softmax, the backward, shorter or fuller rows and 2-byte rows
    # stay on chip.
    cuda = torch.device("cuda")

    def strategy(op, cols, dtype=torch.float32):
        chosen = plan._choose(op, 2048, cols, dtype, cuda, "auto", None, 132, False)
        return chosen.strategy + (" tail" if chosen.tail_cols else "")

    assert strategy("log_softmax", 9500) == "split_row_on_chip"
    assert strategy("log_softmax", 9000) == "row_on_chip tail"
    assert strategy("log_softmax", 8604) == "row_on_chip tail"
    assert strategy("softmax", 9500) == "row_on_chip"
    assert strategy("log_softmax_backward", 9500) == "row_on_chip tail"
    assert strategy("log_softmax", 4100) == "row_on_chip tail"
    assert strategy("log_softmax", 12000) == "row_on_chip"
    assert strategy("log_softmax", 9500, torch.bfloat16) == "row_on_chip"


def test_split_row_on_chip_register_cap_only_beyond_one_uncapped_wave():
    # The plan's constants on a 132-SM GPU: the cap where a launch has more programs than the SMs
    # hold uncapped, none for launches that fit (bf16 16x262144: 512 programs), for log_softmax and
    # fp32 (2-byte log_softmax would spill; fp32 runs faster uncapped), none backward.
    cuda = torch.device("cuda")
    def cap(op, rows, cols, dtype):
        chosen = plan._choose(op, rows, cols, dtype, cuda, "auto", None, 132, False)
        assert chosen.strategy == "split_row_on_chip"
        return chosen.max_registers, chosen.grid[0]
    assert cap("softmax", 16, 262144, torch.bfloat16) == (0, 512)
    assert cap("softmax", 64, 128256, torch.bfloat16) == (32, 1024)
    assert cap("log_softmax", 256, 151936, torch.bfloat16)[0] == 0
    assert cap("softmax", 16, 262144, torch.float32) == (0, 1024)  # fp32: faster uncapped on half the warps
    assert cap("log_softmax", 256, 151936, torch.float32)[0] == 0
    assert cap("softmax_backward", 256, 151936, torch.float32)[0] == 0
    # Rows of no multiple of 16 elements: no cap (bf16 softmax 1742 x 95704 took 2.63 ms capped, 0.57
    # without; 1742 x 95712 0.25 capped).
    assert cap("softmax", 1742, 95704, torch.bfloat16)[0] == 0
    assert cap("softmax", 1742, 95704, torch.float32)[0] == 0
    assert cap("softmax", 1742, 95712, torch.bfloat16)[0] == 32


def test_split_row_on_chip_warps_and_tiles_by_programs():
    # The forward on a 132-SM GPU: rows in fewer programs than SMs take chunks of half the tile;
    # uncapped launches past one wave a warp per 4096 bytes; capped ones keep a warp per 2048 bytes
    # of their tiles.
    cuda = torch.device("cuda")

    def chosen(op, rows, cols, dtype=torch.bfloat16, granules=True):
        c = plan._choose(op, rows, cols, dtype, cuda, "auto", None, 132, False, rows > 1 and granules, granules)
        assert c.strategy == "split_row_on_chip"
        return c.block_cols, c.num_chunks, c.num_warps, c.max_registers

    assert chosen("softmax", 1, 262147) == (4096, 65, 4, 0)  # 33 programs of 8192: fewer than the SMs
    assert chosen("log_softmax", 4, 128257) == (4096, 32, 4, 0)
    assert chosen("softmax", 264, 24083) == (8192, 3, 8, 0)  # 792 programs: one uncapped wave
    assert chosen("softmax", 256, 50257) == (8192, 7, 4, 0)  # 1792 programs in granules: uncapped
    assert chosen("log_softmax", 256, 151936, granules=False) == (8192, 19, 4, 0)  # the 2-byte log: never capped
    assert chosen("softmax", 64, 128256, granules=False) == (8192, 16, 8, 32)  # capped
    assert chosen("softmax", 16, 262144, granules=False) == (8192, 32, 8, 0)  # 512 programs: one wave
    # The backward: a quarter of its tile, bounded by the chunks a row may take (66 on 132 SMs).
    def backward(rows, cols, dtype):
        c = plan._choose("softmax_backward", rows, cols, dtype, cuda, "auto", None, 132, False, rows > 1, True)
        return c.block_cols, c.num_chunks, c.num_warps
    assert backward(1, 100003, torch.bfloat16) == (2048, 49, 1)
    assert backward(1, 262147, torch.bfloat16) == (4096, 65, 2)
    assert backward(1, 131072, torch.float32) == (2048, 64, 1)
    assert backward(64, 50257, torch.bfloat16) == (8192, 7, 4)  # 448 programs: the table's tile


@needs_triton
def test_split_row_on_chip_under_a_register_cap(plan_override, gen):
    # The plan passes its cap to Triton's compiler (maxnreg; the interpreter ignores it), by op and
    # element size, where a launch has more programs than fit uncapped: results stay those of the
    # uncapped kernel, forward and backward.
    plan_override(SPLIT_ON_CHIP_UNCAPPED_PROGRAMS_PER_SM=0, SPLIT_ON_CHIP_CAP_MIN_FILL=0.0)
    x = make_logits((3, 3008), torch.bfloat16, gen, outliers=False)  # a multiple of 16: capped rows
    dy = make_logits((3, 3008), torch.bfloat16, gen, scale=1.0)

    def run(caps):
        plan_override(SPLIT_ON_CHIP_MAX_REGISTERS=caps)
        y = onlinesoftmax.softmax(x, strategy="split_row_on_chip")
        options = [plan.last_plan().compile_options]
        log_y = onlinesoftmax.log_softmax(x, strategy="split_row_on_chip")
        options.append(plan.last_plan().compile_options)
        dx = softmax_launch.launch_backward(y, dy, 1, False, strategy="split_row_on_chip")
        options.append(plan.last_plan().compile_options)
        return (y, log_y, dx), options

    free, options = run(dict.fromkeys(plan.FORWARD_OPS + plan.BACKWARD_OPS, 0))
    assert options == [{}, {}, {}]
    capped, options = run({"softmax": 32, "log_softmax": {4: 32, 2: 40}, "logsumexp": 0,
                           "softmax_backward": 200, "log_softmax_backward": 0})
    assert options == [{"maxnreg": 32}, {"maxnreg": 40}, {"maxnreg": 200}]
    assert all(torch.equal(a, b) for a, b in zip(free, capped))


def test_rows_needing_the_largest_tiles_are_streamed_unless_asked_for():
    # bf16 198x615032 held in 16384-element tiles ran at 0.2x torch: the plan streams such rows.
    def choose(strategy=None):
        return plan.choose("softmax", 198, 615032, torch.bfloat16, torch.device("cuda"), strategy=strategy, sms=132,
                           interpreting=False)
    assert choose().strategy == "split_row"
    assert choose("split_row_on_chip").block_cols == 16384
    assert plan.choose("softmax", 64, 128256, torch.bfloat16, torch.device("cuda"), sms=132,
                       interpreting=False).strategy == "split_row_on_chip"


@needs_triton
def test_split_row_on_chip_refuses_rows_too_long_to_hold(plan_override):
    # A row needs all its programs resident at once: more chunks than that is an error, not a hang.
    plan_override(SPLIT_ON_CHIP_TILE_BYTES={"forward": 64, "backward": 64})
    plan_override(SPLIT_ON_CHIP_MAX_TILE=16)
    cols = 16 * plan._split_on_chip_max_chunks(_device.sm_count(DEVICE)) + 1
    with pytest.raises(ValueError, match="side by side"):
        onlinesoftmax.softmax(torch.randn(2, cols, device=DEVICE), strategy="split_row_on_chip")
    onlinesoftmax.softmax(torch.randn(2, cols, device=DEVICE))  # the automatic choice goes elsewhere
    assert plan.last_plan().strategy != "split_row_on_chip"


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("strategy", ["row_on_chip", "looped", "split_row", "split_row_on_chip"])
@pytest.mark.parametrize("rows_start", ["off_16_bytes", "on_8_bytes", "on_16_bytes"])
def test_rows_of_no_multiple_of_16_are_read_in_granules(rows_start, strategy, dtype, gen, monkeypatch):
    # Rows of an odd length start at another alignment each ("off_16_bytes"); rows of 8 bytes more
    # than a multiple of 16 ("on_8_bytes") start on 8-byte boundaries; rows of a multiple of 16
    # bytes but not of 16 elements ("on_16_bytes") all start on a boundary that Triton cannot
    # prove. The streaming kernels then read and write whole 16-byte granules (ALIGN = elements in
    # 16 bytes) and the partial granules at the row ends one element at a time; row_on_chip tells
    # Triton the rows' alignment (ROW_ALIGN: the granule, or the elements in 8 bytes) where there is
    # one. Forward and backward, against float64 (under the interpreter a false ROW_ALIGN truncates
    # the row); a view whose rows are not where the output's are takes element masks (ALIGN = 1).
    launched = []
    launch = _launch.Launcher.__call__

    def recording(self, grid, key, *args, **meta):
        launched.append(meta.get("ROW_ALIGN" if strategy == "row_on_chip" else "ALIGN"))
        return launch(self, grid, key, *args, **meta)

    monkeypatch.setattr(_launch.Launcher, "__call__", recording)
    granule = 16 // dtype.itemsize
    extra = {"off_16_bytes": 37, "on_8_bytes": 16 + granule // 2, "on_16_bytes": 16 + granule}[rows_start]
    if strategy == "row_on_chip":  # several rows a program
        cols = 16 + extra
        expected = {"off_16_bytes": 1, "on_8_bytes": granule // 2, "on_16_bytes": granule}[rows_start]
    else:  # several blocks and split chunks
        cols = 2 * plan.STREAM_BLOCK[dtype.itemsize] + extra
        expected = granule
    x = make_logits((5, cols), dtype, gen, scale=2.0, outliers=False).requires_grad_()
    dy = make_logits(x.shape, dtype, gen, scale=1.0)
    for op, (ours, ref) in OPS.items():
        launched.clear()
        out = ours(x, -1, strategy=strategy)
        (dx,) = torch.autograd.grad(out, x, dy)
        assert launched and set(launched) == {expected}, launched
        assert_matches(out, ref(x.detach().double(), -1), dtype, f"{op} {strategy}")
        assert_matches(dx, grad64(op, out, dy), dtype, f"d{op} {strategy}")
    launched.clear()
    view = x.detach()[:, 1:]
    assert_matches(onlinesoftmax.softmax(view, -1, strategy=strategy), torch.softmax(view.double(), -1), dtype)
    assert set(launched) == {1}


@needs_triton
@pytest.mark.parametrize("dtype, cols", [(torch.bfloat16, 5001), (torch.bfloat16, 12867), (torch.float16, 5001),
                                         (torch.float16, 12867), (torch.float32, 12867), (torch.float32, 10007)])
def test_many_misaligned_rows_held_as_one_chunk(cols, dtype, gen):
    # Rows off 16-byte boundaries, as many as MISALIGNED_MIN_ROWS_PER_SM asks for, run as one
    # split_row_on_chip chunk (no exchange), forward and backward (rows under 75% of the tile: a
    # head and a tail); rows of -inf, NaN, a lone -inf and huge magnitudes among them, against float64.
    rows = plan.MISALIGNED_MIN_ROWS_PER_SM[dtype.itemsize] * _device.sm_count(DEVICE)
    x = edge_row_logits((rows, cols), dtype, gen)
    dy = make_logits(x.shape, dtype, gen, scale=1.0)
    tile = 8192 if cols < 8192 else 16384
    for op, (ours, ref) in OPS.items():
        out = ours(x, -1)
        chosen = plan.last_plan()
        assert (chosen.strategy, chosen.num_chunks, chosen.block_cols, chosen.max_registers) == \
            ("split_row_on_chip", 1, tile, 0)
        assert_matches(out, ref(x.detach().double(), -1), dtype, f"{op} {rows}x{cols}")
        # The backward of these rows too (MISALIGNED_ONE_CHUNK_*), against float64 from our y
        # (the edge rows: NaN where y is).
        (dx,) = torch.autograd.grad(out, x, dy)
        chosen = plan.last_plan()
        assert (chosen.strategy, chosen.num_chunks, chosen.block_cols + chosen.tail_cols) == \
            ("split_row_on_chip", 1, {5001: 4096 + 1024, 10007: 8192 + 2048}.get(cols, tile))
        assert_matches(dx, grad64(op, out, dy), dtype, f"d{op} {rows}x{cols}")


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("cols, strategy", [(26020, "row_on_chip"), (26021, "split_row_on_chip")])
def test_few_long_misaligned_rows_whole_where_rows_are_8_byte_vectors(cols, strategy, dtype, gen):
    # Few 2-byte rows off 16-byte boundaries filling most of a tile of 32768: held whole where every
    # row starts and ends on 8 bytes (26020), split where rows are of an odd length (26021), forward
    # and backward; rows of -inf, NaN, a lone -inf and huge magnitudes among them, against float64.
    rows = plan.ROW_ON_CHIP_MISALIGNED_SPLIT_MIN_ROWS_PER_SM["log_softmax"][dtype] * _device.sm_count(DEVICE) - 1
    x = edge_row_logits((rows, cols), dtype, gen)
    dy = make_logits(x.shape, dtype, gen, scale=1.0)
    for op, (ours, ref) in OPS.items():
        out = ours(x, -1)
        assert plan.last_plan().strategy == strategy, op
        assert_matches(out, ref(x.detach().double(), -1), dtype, f"{op} {rows}x{cols}")
        (dx,) = torch.autograd.grad(out, x, dy)
        assert plan.last_plan().strategy == strategy, op
        assert_matches(dx, grad64(op, out, dy), dtype, f"d{op} {rows}x{cols}")


@needs_triton
@pytest.mark.parametrize("strategy", ["row_on_chip", "looped", "split_row", "split_row_on_chip"])
def test_repeated_calls_reuse_launches_safely(strategy, gen):
    # The launchers cache a recipe per call signature and a compiled kernel per recipe and pointer
    # alignment. Interleave signatures that must not share one: the same shape with an input
    # 4 bytes off 16-byte alignment, another temperature, another row length, a strided view.
    base = make_logits((4, 3 * plan.STREAM_BLOCK[4] + 3), torch.float32, gen)
    cases = [base[:, :-3], base.view(-1)[1:1 + 4 * (base.shape[1] - 3)].view(4, -1), base[:, 1:-2],
             base[:, :-3], base[:, :41], base[::2, :-3]]
    for round_ in range(2):
        for i, x in enumerate(cases):
            for temperature in (1.0, 0.5):
                out = onlinesoftmax.softmax(x, temperature=temperature, strategy=strategy)
                assert plan.last_plan().strategy == strategy
                assert_matches(out, torch.softmax(x.double() / temperature, -1), torch.float32,
                               f"case {i} T={temperature} round {round_}")
        x = cases[1].detach().requires_grad_()
        dy = make_logits(x.shape, torch.float32, gen, scale=1.0)
        (dx,) = torch.autograd.grad(onlinesoftmax.log_softmax(x, strategy=strategy), x, dy)
        x64 = x.detach().double().requires_grad_()
        (dx64,) = torch.autograd.grad(torch.log_softmax(x64, -1), x64, dy.double())
        assert_matches(dx, dx64, torch.float32, f"misaligned backward round {round_}")


# ----------------------------------------------------------------------------------------------
# GPU only: split_row_on_chip with many programs per row (the interpreter runs one per row)
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def small_split_tiles(plan_override):
    """split_row_on_chip with chunks of at most 4096 (forward) / 2048 (backward) bytes of input, so
    that test-sized rows take many programs each."""
    plan_override(SPLIT_ON_CHIP_TILE_BYTES={"forward": 4096, "backward": 2048})
    plan_override(SPLIT_ON_CHIP_WARP_BYTES={"forward": 1024, "backward": 1024})
    yield


def assert_counters_left_zero():
    # Every launch must leave its stream's counters zero, or the next launch waits forever.
    torch.cuda.synchronize()
    exchanges = _buffers._EXCHANGE.values()
    assert exchanges, "no launch used the stream's kept counters"
    for _, counters in exchanges:
        assert not counters.any(), "split_row_on_chip left a counter set"


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("rows, cols", [(1, 4097), (3, 5000), (7, 16 * 1024), (2000, 3001)])
def test_split_row_on_chip_many_programs_per_row(rows, cols, dtype, small_split_tiles, gen):
    # 2000 rows of 3 programs: far more programs than fit on the GPU at once, so tickets are
    # handed out over many waves and every row counter is used and reset.
    x = make_logits((rows, cols), dtype, gen).to(DEVICE)
    for op, (ours, ref) in OPS.items():
        out = ours(x, -1, strategy="split_row_on_chip")
        chosen = plan.last_plan()
        assert chosen.strategy == "split_row_on_chip" and chosen.num_chunks == -(-cols // (4096 // dtype.itemsize)) > 1
        assert_matches(out, ref(x.double(), -1), dtype, f"{op} {rows}x{cols}")
        assert torch.equal(out, ours(x, -1, strategy="split_row_on_chip")), "not bitwise reproducible"
    lse = onlinesoftmax.logsumexp(x, -1, strategy="split_row_on_chip")
    assert_matches(lse, torch.logsumexp(x.double(), -1), dtype, "logsumexp")
    # Backward judged against float64 arithmetic on our own stored y (see the gradient tests above).
    xg = make_logits((rows, cols), dtype, gen, scale=2.0, outliers=False).requires_grad_()
    dy = make_logits((rows, cols), dtype, gen, scale=1.0)
    y = onlinesoftmax.softmax(xg, strategy="split_row_on_chip")
    (dx,) = torch.autograd.grad(y, xg, dy)
    assert plan.last_plan().num_chunks == -(-cols // (2048 // dtype.itemsize))
    y64, dy64 = y.detach().double(), dy.double()
    assert_matches(dx, y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True)), dtype, "backward")
    assert_counters_left_zero()


@gpu_only
@pytest.mark.parametrize("rows, cols", [(1, 262147), (1, 100003), (4, 128257), (300, 50257), (600, 65536)])
def test_split_row_on_chip_plans_by_programs(rows, cols, gen):
    # The plan's own tiles and warps (no small_split_tiles): few rows in chunks of half (forward) or
    # a quarter (backward) of the tile, many uncapped programs on half the warps; bf16 and fp32
    # against float64, the backward against float64 arithmetic on our stored y.
    for dtype in (torch.bfloat16, torch.float32):
        x = make_logits((rows, cols), dtype, gen).to(DEVICE)
        for op, (ours, ref) in OPS.items():
            out = ours(x, -1, strategy="split_row_on_chip")
            assert plan.last_plan().num_chunks > 1
            assert_matches(out, ref(x.double(), -1), dtype, f"{op} {dtype} {rows}x{cols}")
        xg = make_logits((rows, cols), dtype, gen, scale=2.0, outliers=False).to(DEVICE).requires_grad_()
        dy = make_logits((rows, cols), dtype, gen, scale=1.0).to(DEVICE)
        y = onlinesoftmax.softmax(xg, strategy="split_row_on_chip")
        (dx,) = torch.autograd.grad(y, xg, dy)
        assert plan.last_plan().num_chunks > 1
        y64, dy64 = y.detach().double(), dy.double()
        assert_matches(dx, y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True)), dtype, f"backward {dtype}")
    assert_counters_left_zero()


@gpu_only
def test_split_row_on_chip_special_values_across_chunks(small_split_tiles):
    # Row 0: one chunk all -inf (its partial is (-inf, 0)); row 1: all -inf (NaN, as torch);
    # row 2: NaN in one chunk only (the whole row NaN); row 3: +inf in the last chunk.
    x = torch.randn(4, 4000, device="cuda")
    x[0, 1024:2048] = float("-inf")
    x[1] = float("-inf")
    x[2, 3000] = float("nan")
    x[3, 3999] = float("inf")
    for op, (ours, ref) in OPS.items():
        assert_matches(ours(x, -1, strategy="split_row_on_chip"), ref(x.double(), -1), torch.float32, op)
    assert_matches(onlinesoftmax.logsumexp(x, -1, strategy="split_row_on_chip"),
                   torch.logsumexp(x.double(), -1), torch.float32, "logsumexp")
    assert_counters_left_zero()


@gpu_only
def test_split_row_on_chip_under_cuda_graphs(small_split_tiles, gen):
    # Captured launches get their own zeroed counters (a memset node), replayed many times.
    x = make_logits((5, 4000), torch.float32, gen).to(DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        onlinesoftmax.softmax(x, strategy="split_row_on_chip")  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = onlinesoftmax.softmax(x, strategy="split_row_on_chip")
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        out.fill_(float("nan"))
        x.copy_(make_logits((5, 4000), torch.float32, gen))
        ref = torch.softmax(x.double(), -1)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, ref, torch.float32, "graph replay")
    assert_counters_left_zero()


# ----------------------------------------------------------------------------------------------
# GPU only: int64 offsets
# ----------------------------------------------------------------------------------------------


@gpu_only
@pytest.mark.slow
@pytest.mark.parametrize("shape, strategy", [((2**16 + 1, 2**15), "looped"), ((2**24 + 5, 128), "row_on_chip"),
                                             ((2**18 + 1, 8200), "row_on_chip"),  # a head and a tail tile
                                             ((2, 2**30 + 3), "split_row"),
                                             ((2**14 + 1, 2**17 + 3), "split_row_on_chip")])
def test_more_than_2_31_elements(shape, strategy):
    # bf16 keeps these at 4 GiB; torch's fp32-accumulating softmax is the reference here.
    assert math.prod(shape) > 2**31
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    out = onlinesoftmax.softmax(x, strategy=strategy)
    assert plan.last_plan().strategy == strategy
    ref = torch.softmax(x, -1)
    # Last rows are where a 32-bit offset would wrap.
    assert torch.equal(out[-3:].isnan(), ref[-3:].isnan()) and not out.isnan().any()
    err = ((out[-3:].float() - ref[-3:].float()).norm() / ref[-3:].float().norm()).item()
    assert err < TOLERANCE[torch.bfloat16]
    del out, ref, x
    torch.cuda.empty_cache()


@gpu_only
@pytest.mark.parametrize("copy", [0, 1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_opaque_widening_is_exact_for_every_16_bit_pattern(dtype, copy):
    # The kernels that hold 16-bit tiles widen them through inline PTX on the GPU (the interpreter,
    # and so CI, takes .to(tl.float32)), by two instruction sequences (COPY): each must give the
    # same fp32 bits as torch for every value, NaN aside.
    import triton
    import triton.language as tl

    from onlinesoftmax._triton import widen_opaque

    @triton.jit
    def widen_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr, COPY: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, widen_opaque(tl.load(x_ptr + offs), True, COPY))

    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).cuda()
    out = torch.full(x.shape, float("nan"), device="cuda")
    widen_kernel[(x.numel() // 1024,)](x, out, BLOCK=1024, COPY=copy)
    expected = x.float()
    nan = expected.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out[~nan].view(torch.int32), expected[~nan].view(torch.int32))


# --------------------------------------------------------------------------------------------
# The eager torch route: small eager CUDA calls run torch's kernel (plan.EAGER_HOST_US)
# --------------------------------------------------------------------------------------------


@pytest.mark.eager_torch_route
def test_eager_torch_route_weighs_torchs_kernel_against_our_host_time(plan_override):
    def route(rows, cols, dtype=torch.bfloat16, train=False):
        chosen = plan.choose("softmax", rows, cols, dtype, torch.device("cuda"), sms=132, interpreting=False)
        return eager_route.eager_torch(chosen, train, sms=132)

    assert route(4, 1000) and route(64, 32001)  # torch's kernel finishes within our host time
    assert not route(16384, 65536)  # the GPU's time decides: ours
    # torch gives a long row one block: 16 rows of 128257 take it about 27 us, longer than our host path.
    assert not route(16, 128257)
    # Differentiated, our two Python autograd steps cost more host time: torch's kernels up to larger sizes.
    assert route(4096, 4097, train=True) and not route(4096, 4097)
    assert eager_route.torch_kernel_us(16, 128257, 0, 132) == pytest.approx(plan.TORCH_ROW_US + 128257 * 0.2e-3)
    # A training step of few long rows: the rows side by side slow one another. torch's fp32 step at
    # 32 x 262147 took 294 us on the H100 (the forward's model of a row alone: 136), longer than our
    # host's: ours. At 8 rows it took 166: torch's.
    assert not route(32, 262147, torch.float32, train=True) and route(8, 262147, torch.float32, train=True)
    step = plan.choose("softmax", 32, 262147, torch.float32, torch.device("cuda"), sms=132, interpreting=False)
    assert 250 < eager_route.torch_step_us(step) < 300
    # torch's softmax backward streams long rows slower than its log_softmax backward (1230 against
    # 2000 GB/s): a training step of softmax that torch would finish in our host time as log_softmax is ours.
    log = plan.choose("log_softmax", 5576, 4941, torch.bfloat16, torch.device("cuda"), sms=132, interpreting=False)
    assert not route(5576, 4941, train=True) and eager_route.eager_torch(log, True, sms=132)
    # torch.logsumexp's forward is several launches: never routed there, differentiated it is.
    lse = plan.choose("logsumexp", 4, 1000, torch.bfloat16, torch.device("cuda"), sms=132, interpreting=False)
    assert not eager_route.eager_torch(lse, False, sms=132) and eager_route.eager_torch(lse, True, sms=132)
    plan_override(EAGER_HOST_US=plan.EAGER_ROUTE_OFF)
    assert not route(1, 8) and not route(1, 8, train=True)
    assert eager_route.eager_torch_note(plan.choose("softmax", 1, 8, torch.float32, torch.device("cuda"), sms=132,
                                             interpreting=False), sms=132) == ""


@pytest.mark.eager_torch_route
def test_eager_torch_route_over_a_dim_that_is_not_the_last():
    # torch runs a dim followed by inner elements through its spatial kernels, whose threads walk the
    # dim one step at a time: on the H200 bf16 4096 x 1000 over dim 0 took 2.8 ms (ours 0.083), (16,
    # 1024, 1024) over dim 1 1.0 ms (ours 0.31); over short dims they may stream near a copy's rate
    # (log_softmax over 19: 1.2 TB/s), so those stay torch's where bytes alone cannot rule it out.
    def route(shape, dim, train=False, op="softmax"):
        cols = shape[dim]
        chosen = plan.choose(op, math.prod(shape) // cols, cols, torch.bfloat16, torch.device("cuda"), sms=132,
                             interpreting=False)
        return eager_route.eager_torch(chosen, train, sms=132, inner=math.prod(shape[dim + 1:]))

    assert not route((4096, 1000), 0) and not route((16, 1024, 1024), 1)
    assert not route((32, 1000, 7, 7), 1, op="log_softmax")  # 63 steps a thread (16 share the dim): 46 us
    assert route((2, 4, 8192, 16), 1) and route((8, 21, 256, 256), 1)
    # A training step: our two autograd steps' host time (180 us) against torch's two kernels.
    assert route((8, 21, 256, 256), 1, train=True) and not route((16, 1024, 1024), 1, train=True)
    # The last dim (no inner elements) keeps the row model: torch's kernel over rows of 1000 streams.
    assert route((4096, 1000), 1) == eager_route.eager_torch(
        plan.choose("softmax", 4096, 1000, torch.bfloat16, torch.device("cuda"), sms=132, interpreting=False), sms=132)
    if ON_GPU:  # the route as an eager call takes it (torch's kernel reports the plan "torch")
        x = torch.randn(4096, 1000, device=DEVICE, dtype=torch.bfloat16)
        assert_matches(onlinesoftmax.softmax(x, 0), torch.softmax(x.double(), 0), torch.bfloat16, "over dim 0")
        assert plan.last_plan().strategy != "torch"


@pytest.mark.eager_torch_route
def test_explain_says_when_eager_calls_take_torchs_kernel(capsys):
    from onlinesoftmax.cli import main

    assert main(["explain", "4x1000", "--dtype", "bf16", "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert "strategy:    row_on_chip" in out and "eager calls: torch's own kernel" in out
    assert main(["explain", "16384x65536", "--dtype", "fp32", "--sms", "132"]) == 0
    assert "eager calls" not in capsys.readouterr().out


@gpu_only
@pytest.mark.eager_torch_route
@pytest.mark.parametrize("fn, ref", [(onlinesoftmax.softmax, torch.softmax), (onlinesoftmax.log_softmax, torch.log_softmax),
                                     (onlinesoftmax.logsumexp, torch.logsumexp)], ids=["softmax", "log_softmax", "logsumexp"])
def test_eager_torch_route_gives_torchs_result_and_kernels_under_graphs_and_compile(fn, ref, gen):
    x = make_logits((8, 1001), torch.bfloat16, gen)
    if fn is onlinesoftmax.logsumexp:
        # Its forward never takes the route (torch's is several kernels: plan.EAGER_ROUTE_FORWARD_OFF).
        assert_matches(fn(x, -1), ref(x.double(), -1), torch.bfloat16, "logsumexp eager")
        assert plan.last_plan().strategy != "torch"
    else:
        assert torch.equal(fn(x, -1), ref(x, -1))
        assert plan.last_plan().strategy == "torch" and "EAGER_HOST_US" in plan.last_plan().reason
        # An explicit algorithm (or strategy) asks for our kernels.
        fn(x, -1, algorithm="online")
        assert plan.last_plan().strategy != "torch"
    # Differentiated, the graph is torch's own node.
    xg = x.clone().requires_grad_()
    assert type(fn(xg, -1).grad_fn).__name__.endswith("Backward0")
    # Captured into a CUDA graph, the call is the kernels'.
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(static, -1)
        # On a stream of its own that captures nothing, the route still gives it to torch.
        assert (plan.last_plan().strategy == "torch") == (fn is not onlinesoftmax.logsumexp)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(static, -1)
    assert plan.last_plan().strategy != "torch"
    fresh = make_logits((8, 1001), torch.bfloat16, gen)
    static.copy_(fresh)
    out.fill_(float("nan"))
    graph.replay()
    assert_matches(out, ref(fresh.double(), -1), torch.bfloat16, "graph replay")
    # Under torch.compile, the custom op: the kernels.
    compiled = torch.compile(lambda t: fn(t, -1), fullgraph=True)
    assert_matches(compiled(fresh), ref(fresh.double(), -1), torch.bfloat16, "compiled")


def test_padded_two_byte_rows_leave_row_on_chip():
    # bf16 rows a little over a power of two fill half of row_on_chip's tile. Up to a head of 8192
    # (forward) or 16384 (backward) the row is held as that head and a tail tile; rows that start
    # off 16-byte boundaries are streamed in the backward (looped) and held across programs in the
    # forward where the tile is at most 16384 or rows are many; logsumexp, short rows and well-filled
    # tiles stay.
    cuda = torch.device("cuda")
    def chosen(op, rows, cols, dtype=torch.bfloat16, strategy=None):
        # a contiguous tensor's plan, its rows read as the launchers read them
        return softmax_launch.contiguous_plan(op, rows, cols, dtype, cuda, "auto", strategy, sms=132,
                                              interpreting=False)
    def strategy(*args):
        c = chosen(*args)
        return c.strategy + (f" {c.block_cols}+{c.tail_cols}" if c.tail_cols else "")
    assert strategy("log_softmax", 9682, 8604) == "row_on_chip 8192+512"
    assert strategy("softmax", 4096, 9000) == "row_on_chip 8192+1024"
    assert strategy("softmax_backward", 9682, 8604) == "looped"  # off 16-byte boundaries, a head of 8192
    assert strategy("log_softmax_backward", 16384, 4097) == "row_on_chip 4096+16"  # off them, a head of 4096
    assert strategy("log_softmax_backward", 9682, 8600) == "row_on_chip 8192+512"
    assert strategy("log_softmax_backward", 1024, 17000) == "row_on_chip 16384+1024"
    assert strategy("softmax", 1024, 17000) == "row_on_chip"  # a head of 16384 lost; split ran at 179-870 GB/s
    assert strategy("softmax", 256, 10001) == "row_on_chip"  # 61% of the tile
    assert strategy("softmax", 4096, 10001) == "split_row_on_chip"  # as many rows (MISALIGNED_FORWARD_*)
    assert strategy("softmax", 1024, 9500) == "split_row_on_chip"  # 58%, off 16-byte boundaries
    # ... and at a tile of 32768 too, from ROW_ON_CHIP_HALF_EMPTY_SPLIT_MIN_ROWS_PER_SM rows an SM
    # (rows of 4-byte starts with a short tail: past ROW_ON_CHIP_TAIL_WORD_STARTS_ROWS_PER_SM)
    assert strategy("log_softmax", 396, 18419) == strategy("softmax", 982, 18038) == "split_row_on_chip"
    assert strategy("log_softmax", 529, 18038) == strategy("log_softmax", 396, 19002) == "split_row_on_chip"
    assert strategy("log_softmax", 395, 18419) == strategy("softmax", 982, 18040) == "row_on_chip"
    assert strategy("log_softmax_backward", 982, 18038) == "looped"
    assert strategy("logsumexp", 9682, 8604) == "row_on_chip 8192+512"  # as the forwards (ROW_ON_CHIP_TAIL_LOGSUMEXP)
    assert strategy("logsumexp", 4096, 10001) == "row_on_chip"
    assert strategy("softmax_backward", 5576, 4944) == "row_on_chip"  # 60% of the tile
    assert strategy("softmax_backward", 5576, 4941) == "split_row_on_chip 4096+1024"  # off them, 61%: one chunk, head and tail
    assert strategy("softmax_backward", 527, 4941) == "row_on_chip"  # fewer rows: neither rule
    assert strategy("softmax", 2048, 4097, torch.float32) == "row_on_chip 4096+16"
    assert strategy("softmax_backward", 2048, 4097, torch.float32) == "row_on_chip 4096+16"
    assert strategy("softmax_backward", 474, 23612, torch.float32) == "row_on_chip 16384+8192"  # 72%
    assert strategy("softmax", 474, 23612, torch.float32) == "row_on_chip"
    assert strategy("softmax", 2048, 4096) == "row_on_chip"  # a power of two
    assert chosen("softmax", 2048, 8200).num_warps == plan.ROW_ON_CHIP_TAIL_WARPS
    # Few 2-byte rows off 16-byte boundaries (one an SM at most) also take a head of 16384, forward
    # only (ROW_ON_CHIP_TAIL_FEW_ROWS_*); more rows, rows on boundaries and fuller tiles do not.
    assert strategy("log_softmax", 132, 18419) == strategy("softmax", 15, 18419) == "row_on_chip 16384+2048"
    assert chosen("softmax", 15, 18419).num_warps == plan.ROW_ON_CHIP_TAIL_WARPS
    assert strategy("log_softmax", 133, 18419) == "row_on_chip"
    # ... up to ROW_ON_CHIP_TAIL_WORD_STARTS_ROWS_PER_SM an SM on 4-byte starts, tails up to 2048
    assert strategy("log_softmax", 528, 18038) == strategy("softmax", 150, 17502) == "row_on_chip 16384+2048"
    assert strategy("log_softmax", 264, 19002) == "row_on_chip"  # a tail of 4096
    assert strategy("softmax", 264, 18036) == "row_on_chip"  # 8-byte starts
    assert strategy("softmax", 15, 17000) == "row_on_chip"
    assert strategy("softmax", 15, 20011) == "row_on_chip"  # 61% of the tile
    assert strategy("logsumexp", 15, 18419) == "row_on_chip"
    assert strategy("softmax", 15, 18419, torch.float32) == "row_on_chip"


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("cols", [33, 40, 47])
def test_row_on_chip_head_and_tail(op, cols, dtype, plan_override, gen):
    # Rows held as a power-of-two head (32) and a tail tile (16), forced at a small size: forward
    # and backward on a strided view against float64, with -inf, an all -inf row and NaN in the
    # tail, and a temperature.
    always = {direction: {4: 1.0, 2: 1.0} for direction in ("forward", "backward")}
    plan_override(ROW_ON_CHIP_TAIL_BELOW_FILL=always, ROW_ON_CHIP_TAIL_MIN_COLS=16)
    ours, ref = OPS[op]
    x = layout(make_logits((6, 3, cols), dtype, gen, scale=2.0, outliers=False), "sliced", -1)
    x[0, 0, cols - 2] = float("-inf")
    x[1, 1] = float("-inf")
    x[2, 2, cols - 1] = float("nan")
    x[3, 0, 1] = 60.0  # the maximum in the head, the tail far below it
    x[4, 1, cols - 1] = 60.0  # the maximum in the tail
    x = x.requires_grad_()
    out = ours(x, -1, strategy="row_on_chip", temperature=0.7)
    assert (plan.last_plan().block_cols, plan.last_plan().tail_cols) == (32, 16)
    assert_matches(out, ref(x.detach().double() / 0.7, -1), dtype, f"{op} head + tail")
    dy = make_logits((6, 3, cols), dtype, gen, scale=1.0)
    (dx,) = torch.autograd.grad(out, x, dy)
    assert (plan.last_plan().block_cols, plan.last_plan().tail_cols) == (32, 16)
    # The kernel's own arithmetic from the stored y, as in test_gradients_match_float64_autograd.
    y64, dy64 = out.detach().double(), dy.double()
    if op == "softmax":
        dx64 = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True)) / 0.7
    else:
        dx64 = (dy64 - y64.exp() * dy64.sum(-1, keepdim=True)) / 0.7
    assert_matches(dx, dx64, dtype, f"d{op} head + tail")
    lse = onlinesoftmax.logsumexp(x.detach(), -1, strategy="row_on_chip")
    assert plan.last_plan().tail_cols == 16
    assert_matches(lse, torch.logsumexp(x.detach().double(), -1), dtype, "logsumexp head + tail")


def test_short_half_empty_rows_take_a_head_and_tail():
    # Forward rows a little past a power of two of up to 4096 elements take a head and a tail
    # (ROW_ON_CHIP_SHORT_TAIL_*): one row a program below 16 rows an SM, the width's packing up to 32,
    # then four rows of 256 (eight of 128) on one warp; fp32 only up to a head of 128; tails of at
    # most 64 (fp32 32), and of a quarter of the head where the rows are few; not the backward, not logsumexp,
    # not rows whose tail would be as wide as the head.
    cuda = torch.device("cuda")
    def launch(op, rows, cols, dtype=torch.bfloat16):
        c = plan.choose(op, rows, cols, dtype, cuda, sms=132, interpreting=False)
        return c.strategy, c.block_cols, c.tail_cols, c.rows_per_program, c.num_warps
    assert launch("softmax", 1207, 143) == ("row_on_chip", 128, 16, 1, 1)
    assert launch("log_softmax", 2111, 143)[3] == 1
    assert launch("log_softmax", 2112, 143, torch.float32) == ("row_on_chip", 128, 16, 2, 1)  # 16 rows an SM
    assert launch("softmax", 4223, 150)[3] == 2
    assert launch("softmax", 4224, 150) == ("row_on_chip", 128, 32, 4, 1)  # 32 rows an SM
    assert launch("softmax", 20000, 70, torch.float32) == ("row_on_chip", 64, 16, 8, 1)
    assert launch("log_softmax", 7230, 273) == ("row_on_chip", 256, 32, 2, 2)  # the many-rows rule as without a tail
    assert launch("log_softmax", 7230, 273, torch.float32) == ("row_on_chip", 512, 0, 2, 2)
    assert launch("softmax", 2048, 1100)[2] == 0  # a head of 1024
    assert launch("softmax", 8192, 193)[2] == 0  # a tail of 128 would be no narrower than the tile
    assert launch("softmax", 8192, 192)[1:3] == (128, 64)
    assert launch("softmax", 8192, 200)[2] == 0  # 78% of its tile
    assert launch("softmax", 16384, 350)[1:3] == (512, 0)  # a tail of 128
    assert launch("softmax", 16384, 320)[1:3] == (256, 64)
    assert launch("softmax", 1207, 180) == ("row_on_chip", 256, 0, 2, 1)  # few rows: a tail of 64 is too wide
    assert launch("softmax", 2112, 180)[1:4] == (128, 64, 2)
    assert launch("softmax", 6000, 180, torch.float32)[1:3] == (256, 0)  # fp32: tails of at most 32
    assert launch("logsumexp", 1207, 143)[2] == 0
    assert launch("softmax_backward", 1207, 143)[2] == 0
    assert launch("softmax", 4096, 64)[2] == 0  # a power of two
    assert launch("softmax", 4096, 4097)[1:] == (4096, 16, 1, plan.ROW_ON_CHIP_TAIL_WARPS)  # the long rows' rule


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("rows_per_program", [1, 4])
def test_short_rows_head_and_tail(op, rows_per_program, dtype, plan_override, gen):
    # The short rows' head (32) and tail (16), forced at one and at four rows a program (the last
    # program ragged), on a strided view with -inf, an all -inf row and NaN in the tail.
    plan_override(ROW_ON_CHIP_SHORT_TAIL_BELOW_FILL={4: 1.0, 2: 1.0}, ROW_ON_CHIP_SHORT_TAIL_MIN_COLS=16,
                  ROW_ON_CHIP_SHORT_TAIL_SPREAD_ROWS_PER_SM=0 if rows_per_program > 1 else 1 << 20,
                  ROW_ON_CHIP_SHORT_TAIL_FEW_ROWS_MAX_TAIL_SHARE=1.0,
                  ROW_TILE_ELEMENTS={"forward": 64 * rows_per_program, "backward": 4096}, ROW_TILE_SPREAD_OVER_SMS=False)
    ours, ref = OPS[op]
    x = layout(make_logits((7, 3, 41), dtype, gen, scale=2.0, outliers=False), "sliced", -1)
    x[0, 0, 39] = float("-inf")
    x[1, 1] = float("-inf")
    x[2, 2, 40] = float("nan")
    x[4, 1, 40] = 60.0  # the maximum in the tail
    out = ours(x, -1, strategy="row_on_chip", temperature=0.7)
    chosen = plan.last_plan()
    assert (chosen.block_cols, chosen.tail_cols, chosen.rows_per_program) == (32, 16, rows_per_program)
    assert_matches(out, ref(x.double() / 0.7, -1), dtype, f"{op} short head + tail")


# Compiles two row_on_chip launches for sm_90 without a GPU (scripts/probes/kernel_resources.py):
# the backward of rows held as a 32-column head and a 16-column tail, and logsumexp over bf16 rows
# of 8604 elements (every row on an 8-byte boundary, none on a 16-byte one).
_ROW_ON_CHIP_SASS_PROBE = """
import json, sys, torch
sys.path.insert(0, "scripts/probes")
import kernel_resources as kr
import onlinesoftmax
from onlinesoftmax.ops.softmax import launch
always = {d: {4: 1.0, 2: 1.0} for d in ("forward", "backward")}
anywhere = {d: {4: 1 << 20, 2: 1 << 20} for d in ("forward", "backward")}
with onlinesoftmax.override_plan("softmax", ROW_ON_CHIP_TAIL_BELOW_FILL=always, ROW_ON_CHIP_TAIL_MIN_COLS=16,
                                 ROW_ON_CHIP_TAIL_MAX_HEAD=anywhere, ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD=anywhere):
    with kr.recorded_launches(132) as calls:
        y = torch.empty(3, 37, dtype=torch.bfloat16)
        launch.launch_backward(y, y, 1, False, strategy="row_on_chip")
(fn, args, meta), = calls
narrow = (meta["BLOCK_COLS"], meta["TAIL_COLS"], kr.resource_usage(fn, args, meta, 90)["fused_multiply_adds"])
with kr.recorded_launches(132) as calls:
    launch.launch_forward(torch.empty(256, 8604, dtype=torch.bfloat16), 1, "logsumexp")
(fn, args, meta), = calls
usage = kr.resource_usage(fn, args, meta, 90)
loads = {width: n for (op, width), n in usage["accesses"].items() if op == "LDG"}
print(json.dumps({"narrow": narrow, "row_align": meta["ROW_ALIGN"], "loads": loads, "registers": usage["REG"]}))
"""


def test_row_on_chip_compiles_to_same_sums_and_wide_loads():
    """Compiled for sm_90 on this machine. (1) The softmax backward's narrow tiles (at most 32
    columns: one element of a row a lane) sum rounded products, no FFMA: a product fused into the
    butterfly's first add left the lanes of a pair with sums a bit apart, and their copies met in
    one shared-memory slot (racecheck's hazard, docs/perf-softmax.md). (2) bf16 rows of 8604
    elements, each on an 8-byte boundary, are read 8 bytes a load (ROW_ALIGN 4), not 2: their
    logsumexp took 126 registers a thread and 3.1x the time on the H100."""
    found = compiled_for_sm90(_ROW_ON_CHIP_SASS_PROBE)
    assert found["narrow"] == [32, 16, 0], found
    assert found["row_align"] == 4, found
    assert found["loads"].get("2", 0) == 0 and found["loads"].get("8", 0) > 0, found
    assert found["registers"] <= 64, found


def test_split_row_on_chip_cap_only_on_well_filled_chunks():
    # Chunks under 3/4 of their tile spill under the register cap (ptxas: a 456-byte stack in bf16):
    # uncapped there; full chunks keep it.
    cuda = torch.device("cuda")
    def cap(rows, cols):
        chosen = plan._choose("softmax", rows, cols, torch.bfloat16, cuda, "auto", "split_row_on_chip", 132, False)
        return chosen.chunk_size, chosen.block_cols, chosen.max_registers
    assert cap(4096, 9000) == (4512, 8192, 0)
    assert cap(1024, 17000) == (5680, 8192, 0)
    assert cap(4096, 12288) == (6144, 8192, 32)
    assert cap(64, 128256)[2] == 32
