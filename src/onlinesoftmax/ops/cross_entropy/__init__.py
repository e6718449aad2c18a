"""cross_entropy and linear_cross_entropy: the loss of a log-softmax read at the targets, from the
online normalizer; the gradient fused into the forward where the logits may be overwritten. Their
torch.nn modules in modules.py."""

from .linear import linear_cross_entropy
from .modules import CrossEntropyLoss, LinearCrossEntropyLoss
from .op import cross_entropy

__all__ = ["cross_entropy", "linear_cross_entropy", "CrossEntropyLoss", "LinearCrossEntropyLoss"]
