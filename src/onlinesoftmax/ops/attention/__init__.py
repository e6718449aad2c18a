"""Flash attention: ``kernels.py`` (Triton forward and backward), ``plan.py`` (block tables),
``launch.py`` (layout checks, launches), ``op.py`` (custom ops, autograd, the public function)."""

from .op import attention

__all__ = ["attention"]
