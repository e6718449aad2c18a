"""onlinesoftmax: softmax, log-softmax and logsumexp for PyTorch as Triton kernels built on the
online normalizer (Milakov & Gimelshein, 2018)."""

from .softmax import DimensionError, log_softmax, logsumexp, softmax

__all__ = ["softmax", "log_softmax", "logsumexp", "DimensionError"]
__version__ = "0.1.0"
