"""linear_cross_entropy's plan: rows a chunk, classes a vocabulary slice, and the matmuls' vocabulary
widths, as small tables with a reason each (the cross-entropy kernels' own plan is ``plan.py``)."""

from __future__ import annotations

import torch

# linear_cross_entropy: chunk="auto" bounds a chunk's logits (rows x V in the input dtype) by
# this many bytes, in multiples of LINEAR_CHUNK_MULTIPLE rows. 512 MiB is 2048 rows at V = 128256
# bf16: the grad-W matmul of a chunk then has K = 2048, enough that reading and writing its fp32
# accumulator (8 bytes per element of W, 4.2 GB at 128256 x 4096, 1.4 ms) stays below its compute
# (3.3 ms at 650 TFLOP/s); 1024-row chunks would make it nearly memory-bound. Chunks that
# accumulate grad W take up to grad W's own bytes instead where that is more (the backward holds
# grad W anyway): 4096 rows at 128256 x 4096, where 16384 x 4096 x 128256 bf16 went from 77.98 ms
# (2048-row chunks; torch.compile 74.80, one chunk and 2 GB more) to 76.64 (torch.compile 76.16).
LINEAR_CHUNK_BYTES = 512 * 2**20
LINEAR_CHUNK_MULTIPLE = 128
# The matmuls' vocabulary dimension in multiples of this many elements (128 bytes in bf16): the
# logits buffer's rows are padded to it (the leading dimension of all three matmuls), and a
# vocabulary that is no multiple of it is multiplied as its largest multiple plus a tail (for
# 50257: 50240 + 17). At 8192 x 4096 x 50257 bf16, whole rows of 50257 ran the three matmuls at
# 130 TFLOP/s (76.4 ms; torch eager's F.cross_entropy(h @ W.T) 77.6, torch.compile's padded
# matmuls 17.1); padded rows alone, 157 TFLOP/s (64.4 ms); bench linear_cross_entropy, H100.
LINEAR_VOCAB_MULTIPLE = 64


def linear_logits_width(vocab: int) -> int:
    """Elements a row of linear_cross_entropy's logits buffer takes (V rounded up, see above)."""
    return -(-vocab // LINEAR_VOCAB_MULTIPLE) * LINEAR_VOCAB_MULTIPLE


def linear_vocab_parts(vocab: int) -> tuple[tuple[int, int], ...]:
    """The vocabulary's column ranges the matmuls take one at a time: the largest multiple of
    LINEAR_VOCAB_MULTIPLE, then the tail (one range when there is no tail or nothing before it)."""
    aligned = vocab // LINEAR_VOCAB_MULTIPLE * LINEAR_VOCAB_MULTIPLE
    return ((0, vocab),) if aligned in (0, vocab) else ((0, aligned), (aligned, vocab))


def linear_chunk_rows(rows: int, vocab: int, hidden: int, dtype: torch.dtype, accumulate_weight_grad: bool,
                      chunk) -> int:
    """Rows per chunk of linear_cross_entropy: ``chunk`` when it is an int. "auto": the most rows whose
    logits fit LINEAR_CHUNK_BYTES (or grad W's bytes, if more, where chunks accumulate grad W), in
    multiples of LINEAR_CHUNK_MULTIPLE, unless all the rows as one chunk make a peak no higher.

    With a weight gradient wanted in a 16-bit ``dtype`` (``accumulate_weight_grad``), chunks hold the
    float32 accumulator of grad W (V x H x 4 bytes) through the step, beside a chunk's logits in the
    forward and beside grad W itself in the backward; one chunk needs no accumulator (its one
    matmul accumulates in float32 inside cuBLAS and writes grad W at once), only all the logits
    beside grad W. At 8192 x 128256 bf16 rows, H = 4096, both peaks are 3.15 GB, and one chunk is
    the faster run (three whole matmuls, no accumulator traffic)."""
    rows = max(rows, 1)
    if chunk != "auto":
        return max(1, min(int(chunk), rows))
    row_bytes = linear_logits_width(vocab) * dtype.itemsize
    weight_grad = vocab * hidden * dtype.itemsize
    # With the accumulator, a chunk as large as grad W raises no peak (the backward holds grad W
    # beside it anyway) and halves the accumulator's passes where grad W is over twice the budget.
    budget = max(LINEAR_CHUNK_BYTES, weight_grad) if accumulate_weight_grad else LINEAR_CHUNK_BYTES
    fit = budget // max(1, row_bytes)
    chunk_rows = max(1, min(rows, max(LINEAR_CHUNK_MULTIPLE, fit // LINEAR_CHUNK_MULTIPLE * LINEAR_CHUNK_MULTIPLE)))
    if accumulate_weight_grad and chunk_rows < rows:
        chunked_peak = vocab * hidden * 4 + max(chunk_rows * row_bytes, weight_grad)
        if rows * row_bytes + weight_grad <= chunked_peak:
            return rows
    return chunk_rows


# linear_cross_entropy by vocabulary slices (vocab_chunk="auto"): slices of the most classes whose
# logits over all the rows fit this many bytes, in multiples of LINEAR_VOCAB_MULTIPLE. 256 MiB is
# 16384 classes at 8192 bf16 rows: eight slices of a 128256 vocabulary, so the float32 grad-x
# accumulator (rows x H x 4 bytes, 128 MiB at H = 4096) is read and written eight times (2.1 GB).
LINEAR_VOCAB_CHUNK_BYTES = 256 * 2**20


def linear_vocab_chunk(rows: int, vocab: int, dtype: torch.dtype, vocab_chunk) -> int:
    """Classes per vocabulary slice of linear_cross_entropy: ``vocab_chunk`` when it is an int, "auto":
    the most whose logits over ``rows`` fit LINEAR_VOCAB_CHUNK_BYTES, a multiple of LINEAR_VOCAB_MULTIPLE
    (at least one multiple, at most the vocabulary)."""
    if vocab_chunk != "auto":
        return min(vocab_chunk, vocab)
    fit = LINEAR_VOCAB_CHUNK_BYTES // max(1, rows * dtype.itemsize)
    return min(vocab, max(LINEAR_VOCAB_MULTIPLE, fit // LINEAR_VOCAB_MULTIPLE * LINEAR_VOCAB_MULTIPLE))
