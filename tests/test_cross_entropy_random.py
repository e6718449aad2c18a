"""cross_entropy on shapes drawn at random, each with a mode, dtype, reduction, options and layout,
against torch in float64.

The plans choose among strategies, chunk counts, tails and edges by shape; the other modules pick
their shapes to force each one. These draw them as users have them (rows from 1 to a few thousand;
classes log-uniform, or a vocabulary plus a few), so that a combination no hand-picked case meets
(the gradient in the forward at a shape whose in-place plan is 'separate' had raised) is met here.
Each draw's seed comes from the test's printed generator seed. Under the interpreter, a few small
draws; on the GPU, shapes up to 2^25 logits.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

import onlinesoftmax
from onlinesoftmax.ops.cross_entropy import cross_entropy

from conftest import ON_GPU, DEVICE, assert_matches, make_logits, needs_triton
from cross_entropy_cases import GRADIENT_IN_FORWARD_ALWAYS, OPTIONS, option_ids, reference, resolve_options

DRAWS = 32 if ON_GPU else 4
MAX_LOGITS = 1 << 25 if ON_GPU else 3000
VOCABULARIES = (32000, 50257, 128256, 151936, 256000)


def draw(rng: random.Random) -> dict:
    """One case: shape, row padding (a row stride past the classes), dtype, mode, reduction, options."""
    if rng.random() < 0.5 or not ON_GPU:
        cols = int(math.exp(rng.uniform(math.log(2), math.log(262144 if ON_GPU else 600))))
    else:
        cols = rng.choice(VOCABULARIES) + rng.randint(-3, 13)
    rows = int(math.exp(rng.uniform(0, math.log(4096))))
    rows = max(1, min(rows, MAX_LOGITS // cols))
    return dict(rows=rows, cols=cols, pad=rng.choice([0, 0, rng.randint(1, 7)]),
                dtype=rng.choice([torch.float32, torch.bfloat16, torch.float16]),
                mode=rng.choice(["default", "inplace", "in_forward"]), reduction=rng.choice(["mean", "sum", "none"]),
                options=rng.choice(OPTIONS), ignore_every=rng.choice([2, 4, 1000]))


@needs_triton
@pytest.mark.parametrize("index", range(DRAWS))
def test_random_shapes_every_mode(index, gen):
    # The index too: under a fixed ONLINESOFTMAX_TEST_SEED every test's generator starts alike.
    rng = random.Random(int(torch.randint(0, 1 << 62, (1,), generator=gen)) * DRAWS + index)
    case = draw(rng)
    rows, cols, pad, dtype, mode = (case[k] for k in ("rows", "cols", "pad", "dtype", "mode"))
    what = (f"draw {index}: {rows}x{cols} (+{pad}) {str(dtype)[6:]} {mode} {case['reduction']} "
            f"{option_ids(case['options'])}")
    options = resolve_options(case["options"], cols, gen)
    base = make_logits((rows, cols + pad), dtype, gen, outliers=False)
    target = torch.randint(0, cols, (rows,), generator=gen)
    target[1::case["ignore_every"]] = -100  # row 0 always counts ('mean' over no rows is NaN: tested elsewhere)
    target = target.to(DEVICE)
    x64 = base[:, :cols].double().requires_grad_()
    ref = reference(x64, target, reduction=case["reduction"], **options)
    leaf = base.clone().requires_grad_()
    logits = (leaf * 1)[:, :cols]  # a view of rows (cols + pad) apart where padded
    # In place the gradient is stored for an upstream of 1, then scaled: powers of two keep that exact.
    scales = torch.tensor([0.5, 1.0, 2.0, -4.0]) if mode == "inplace" else torch.tensor([0.7, 1.0, -1.3])
    shape = (rows,) if case["reduction"] == "none" else ()
    upstream = scales[torch.randint(0, len(scales), shape, generator=gen)].to(DEVICE)
    with onlinesoftmax.override_plan("cross_entropy", **(GRADIENT_IN_FORWARD_ALWAYS if mode == "in_forward" else {})):
        out = cross_entropy(logits, target, reduction=case["reduction"], inplace_backward=mode == "inplace",
                            gradient_in_forward=mode == "in_forward", **options)
        g = upstream.to(out.dtype)  # as ours receives it, for both
        (ref * g.double()).sum().backward()
        (out * g).sum().backward()
    assert_matches(out.detach(), ref.detach(), dtype, f"{what}: loss")
    assert_matches(leaf.grad[:, :cols], x64.grad, dtype, f"{what}: grad")
    assert not leaf.grad[:, cols:].any(), f"{what}: a gradient in the padding"
