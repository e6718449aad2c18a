"""Decode attention over a KV cache (flash-decoding, contiguous or paged) and merge_attention."""

from .op import attention_with_kvcache, merge_attention

__all__ = ["attention_with_kvcache", "merge_attention"]
