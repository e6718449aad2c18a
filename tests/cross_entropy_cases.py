"""What the cross-entropy test modules share: the options grid, the float64 reference and targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from conftest import DEVICE

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
