"""softmax_topk: ``kernels.py`` (Triton), ``plan.py`` (tables), ``launch.py`` (launches), ``op.py``
(custom ops, autograd, the public function)."""

from .op import softmax_topk

__all__ = ["softmax_topk"]
