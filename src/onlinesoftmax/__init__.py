"""onlinesoftmax: softmax, log-softmax, logsumexp, fused softmax + top-k and attention for PyTorch as
Triton kernels built on the online normalizer (Milakov & Gimelshein, 2018)."""

from .attention import attention
from .softmax import DimensionError, log_softmax, logsumexp, softmax
from .topk import softmax_topk
from . import distributed  # softmax family over a dim sharded across ranks

__all__ = ["softmax", "log_softmax", "logsumexp", "attention", "softmax_topk", "DimensionError"]
__version__ = "0.1.0"
