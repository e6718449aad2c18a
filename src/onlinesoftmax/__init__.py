"""onlinesoftmax: softmax, log-softmax, logsumexp, fused softmax + top-k, attention, decoding
attention over a KV cache and cross-entropy for PyTorch, as Triton kernels built on the online
normalizer (Milakov & Gimelshein, 2018)."""

from importlib.metadata import PackageNotFoundError, version as _version

from ._device import override_plan
from ._validate import DimensionError
from .ops.attention import attention
from .ops.cross_entropy import CrossEntropyLoss, LinearCrossEntropyLoss, cross_entropy, linear_cross_entropy
from .ops.decode import attention_with_kvcache, merge_attention
from .ops.softmax import log_softmax, logsumexp, softmax
from .ops.topk import softmax_topk
from . import distributed  # the same ops over a dim sharded across ranks

try:
    __version__ = _version("onlinesoftmax")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["softmax", "log_softmax", "logsumexp", "softmax_topk", "attention", "attention_with_kvcache",
           "merge_attention", "cross_entropy", "linear_cross_entropy", "CrossEntropyLoss",
           "LinearCrossEntropyLoss", "override_plan", "DimensionError",
           "distributed"]
