"""softmax, log_softmax, logsumexp: ``kernels.py`` (Triton), ``plan.py`` (strategies as tables),
``launch.py`` (row layout, launch recipes, launches), ``op.py`` (custom ops, autograd, public functions)."""

from .op import DimensionError, log_softmax, logsumexp, softmax

__all__ = ["softmax", "log_softmax", "logsumexp", "DimensionError"]
