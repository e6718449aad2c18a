"""Softmax-family ops, top-k, attention and cross-entropy over a dimension sharded across ranks.

Each rank reduces its shard to a few numbers per row with the library's own kernels (the (m, d)
pair of the online normalizer, a partial attention's log-sum-exp), the ranks exchange those in one small
all_gather, and every rank finishes its shard from the same merged values, in rank order (bitwise
the same on every rank and across runs). See ``rows.py`` for why one gather and not two
all-reduces.
"""

from ._group import check_group, last_strategy
from .context import attention, merge_attention
from .vocab import cross_entropy
from .rows import DimensionError, log_softmax, logsumexp, softmax
from .topk import softmax_topk

__all__ = ["softmax", "log_softmax", "logsumexp", "softmax_topk", "merge_attention", "attention", "cross_entropy",
           "check_group", "last_strategy", "DimensionError"]
