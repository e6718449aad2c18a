"""What the cross-entropy test modules share: the options grid, the float64 reference and targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from onlinesoftmax.ops.cross_entropy import cross_entropy, plan

from conftest import DEVICE, assert_matches

OPTIONS = [
    {},
    {"label_smoothing": 0.1},
    {"z_loss": 1e-2},
    {"softcap": 5.0},
    {"temperature": 0.7},
    {"weight": True},
    {"weight": True, "label_smoothing": 0.2},
    {"label_smoothing": 0.05, "z_loss": 1e-3, "softcap": 8.0, "temperature": 1.3, "weight": True},
]

# gradient_in_forward=True: a training step that keeps its logits writes their gradient in its
# forward where the plan says (plan.gradient_in_forward); these tables let it at any size.
GRADIENT_IN_FORWARD_ALWAYS = dict(GRADIENT_IN_FORWARD_MIN_BYTES=0, GRADIENT_IN_FORWARD_MIN_ROWS_PER_SM=0)


def option_ids(options):
    return "-".join(f"{k}" for k in options) or "plain"


def reference(x, target, *, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0, softcap=None,
              temperature=1.0, weight=None):
    """torch's F.cross_entropy in float64 on the transformed logits, plus the z term (over valid rows for "mean")."""
    y = x.double()
    if softcap is not None:
        y = softcap * torch.tanh(y / softcap)
    y = y / temperature
    classes = y.shape[-1]
    y2, t1 = y.reshape(-1, classes), target.reshape(-1)
    w = weight.double() if weight is not None else None
    loss = F.cross_entropy(y2, t1, weight=w, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    valid = t1 != ignore_index
    z = z_loss * torch.logsumexp(y2, -1) ** 2 * valid
    if reduction == "none":
        return (loss + z).reshape(target.shape)
    if reduction == "sum":
        return loss + z.sum()
    return loss + z.sum() / valid.sum()


def make_targets(rows, classes, gen, ignore_every=4, ignore_index=-100):
    t = torch.randint(0, classes, (rows,), generator=gen)
    t[::ignore_every] = ignore_index
    return t.to(DEVICE)


def resolve_options(options, classes, gen):
    options = dict(options)
    if options.get("weight"):
        options["weight"] = (torch.rand(classes, generator=gen, dtype=torch.float64) + 0.5).float().to(DEVICE)
    return options


# Losses are sums of many rounded terms: a reduced bf16/fp16 loss is one rounding of an fp32 sum,
# within the table's bound; the gradients are elementwise, within it too.

def check_loss_and_grad(x, target, dtype, upstream=None, strategy=None, inplace=False, what="", in_forward=False,
                         **options):
    """Loss and gradient of ours against the float64 reference on the same (rounded) logits; returns the
    plans of the forward and of the backward."""
    x64 = x.detach().double().requires_grad_()
    ref = reference(x64, target, **options)
    leaf = x.detach().clone().requires_grad_()
    logits = leaf * 1  # a non-leaf: in place, it is overwritten with the gradient
    out = cross_entropy(logits, target, strategy=strategy, inplace_backward=inplace, gradient_in_forward=in_forward,
                        **options)
    chosen = plan.last_plan()
    # The upstream gradient as ours receives it (in the loss's dtype), for both: a reference given
    # the unrounded one would differ by that rounding, which is not ours.
    g = (upstream if upstream is not None else torch.ones_like(ref)).to(out.dtype)
    (ref * g.double()).sum().backward()
    (out * g).sum().backward()
    assert_matches(out.detach(), ref.detach(), dtype, f"{what} loss")
    assert_matches(leaf.grad, x64.grad, dtype, f"{what} grad")
    if inplace:
        assert torch.equal(logits.detach(), leaf.grad), f"{what}: the logits do not hold the gradient"
    else:
        assert torch.equal(logits.detach(), x.detach()), f"{what}: the forward changed the logits"
    return chosen, plan.last_plan()


def inplace_upstream(rows, gen):
    """A per-row upstream gradient for in-place tests: random signs and powers of two. In place the
    gradient is stored for an upstream of 1 and then scaled by the row's: two roundings to the
    logits' dtype, which took a bf16 gradient to 1.02e-2 (the table's bound 1e-2) in about one
    interpreter run in twenty while its casts truncated (conftest now rounds them to nearest, as
    the GPU does). Scaling by a power of two is exact, so the test sees the kernels' one rounding,
    whatever the row's upstream."""
    sign = torch.randint(0, 2, (rows,), generator=gen, dtype=torch.float64) * 2 - 1
    return (sign * 2.0 ** torch.randint(-2, 3, (rows,), generator=gen).double()).to(DEVICE)
