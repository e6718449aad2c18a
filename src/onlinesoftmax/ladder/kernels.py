"""The seed work log's softmax kernels in numba-cuda, in the order the log climbs them.

Rows (M, N) of fp32, softmax along the last dim. The fewest bytes any softmax moves are 8 MN (read x
once, write y once); each step's comment counts what it moves and how much of the GPU it keeps busy.

Steps 1-4 are the work log's kernels 1-4 (seed 003; seed 000 gives the same first kernel); step 5 is
seed 002's three-kernel 1-D softmax. Each kernel is a plain Python function compiled on first use by
:func:`_compiled`, so one source gives both the IEEE build (what ``nvcc`` builds from ``expf`` without
``-use_fast_math``) and a ``fastmath`` build (``__expf``, flush-to-zero, approximate division).

Unlike the log, the online update skips ``-inf`` entries instead of computing ``exp(-inf - -inf)``:
the log's kernels return NaN for a row that *starts* with ``-inf`` even when it holds a finite entry.
A row of only ``-inf`` gives NaN, as torch.softmax does.
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
import torch
from numba import cuda

from .. import _buffers

NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
WARP_SIZE = 32
FULL_WARP_MASK = 0xFFFFFFFF
# Shared arrays are sized when the kernel compiles: the largest block any step takes.
MAX_THREADS_PER_BLOCK = 1024

# The work log's launch configurations. Thread-per-row kernels: 1024 rows make 4 blocks of 256
# threads, 4 of the H100's 132 SMs; block-per-row kernels: 1024 threads, the log's smem[1024].
THREADS_PER_ROW_BLOCK = 256
THREADS_PER_ROW = 1024
# Seed 002 launches 256 threads and one block per 256 elements (16M elements: 65536 partials).
THREADS_1D = 256

# The simulator (NUMBA_ENABLE_CUDASIM=1) has no as_cuda_array: there the kernels take NumPy views of
# CPU tensors; on a GPU they take zero-copy views of CUDA tensors.
SIMULATED = not hasattr(cuda, "as_cuda_array")


# ---------------------------------------------------------------------------------------------------
# Device helpers. inline="always" compiles them into each kernel with that kernel's fastmath flag.


@cuda.jit(device=True, inline="always")
def online_update(row_max, norm, x):
    """Fold one element into a running (max, sum of exp(x - max)); -inf entries add nothing."""
    # "not <=" rather than ">": a NaN becomes the max, so the NaN survives seed 002's merge (which
    # drops a side whose max is -inf) and poisons the whole result, as in torch.
    if not x <= row_max:
        # norm * exp(-inf - x) is 0 while the row held only -inf: no special case needed here.
        return x, norm * math.exp(row_max - x) + ONE
    if x != NEG_INF:
        return row_max, norm + math.exp(x - row_max)
    return row_max, norm


@cuda.jit(device=True, inline="always")
def safe_merge(max_a, sum_a, max_b, sum_b):
    """Seed 002's merge of two (max, sum) partials: a side whose max is -inf holds nothing, so it is
    dropped instead of rescaled (exp(-inf - -inf) would be NaN)."""
    if max_b == NEG_INF:
        return max_a, sum_a
    if max_a == NEG_INF:
        return max_b, sum_b
    if max_a > max_b:
        return max_a, sum_a + sum_b * math.exp(max_b - max_a)
    return max_b, sum_b + sum_a * math.exp(max_a - max_b)


@cuda.jit(device=True, inline="always")
def shared_tree_reduce(value, scratch, tid, threads, is_max):
    """Block-wide max or sum through shared memory: log2(threads) halvings, a barrier after each."""
    scratch[tid] = value
    cuda.syncthreads()
    stride = threads // 2
    while stride > 0:
        if tid < stride:
            if is_max:
                scratch[tid] = max(scratch[tid], scratch[tid + stride])
            else:
                scratch[tid] = scratch[tid] + scratch[tid + stride]
        cuda.syncthreads()
        stride //= 2
    result = scratch[0]
    # scratch is reused by the next reduction: nobody may write it before everyone has read slot 0.
    cuda.syncthreads()
    return result


@cuda.jit(device=True, inline="always")
def warp_reduce(value, is_max):
    """Max or sum over the 32 lanes of a warp through register shuffles; lane 0 holds the result."""
    offset = WARP_SIZE // 2
    while offset > 0:
        other = cuda.shfl_down_sync(FULL_WARP_MASK, value, offset)
        value = max(value, other) if is_max else value + other
        offset //= 2
    return value


@cuda.jit(device=True, inline="always")
def warp_shuffle_block_reduce(value, scratch, tid, threads, is_max):
    """Block-wide max or sum: shuffles inside each warp, one shared slot per warp, shuffles again in
    warp 0. Two barriers instead of log2(threads)."""
    value = warp_reduce(value, is_max)
    lane = tid % WARP_SIZE
    warp = tid // WARP_SIZE
    if lane == 0:
        scratch[warp] = value
    cuda.syncthreads()
    if warp == 0:
        identity = NEG_INF if is_max else ZERO
        value = scratch[lane] if lane < threads // WARP_SIZE else identity
        value = warp_reduce(value, is_max)
        if lane == 0:
            scratch[0] = value
    cuda.syncthreads()
    result = scratch[0]
    cuda.syncthreads()
    return result


# ---------------------------------------------------------------------------------------------------
# Step 1 (log kernel 1): one thread per row, three passes (max; sum of exp; normalize).
# Bytes: reads the row 3 times and writes it once, 16 MN bytes, twice the fewest. Parallelism: M
# threads in all (1024, on a GPU that keeps 270,000 in flight), and the 32 threads of a warp read
# addresses N * 4 bytes apart, so one warp load touches 32 sectors instead of 4: the kernel is
# latency bound, not bandwidth bound, one dependent step after another per thread.
def three_pass_per_thread(inp, out):
    row = cuda.grid(1)
    if row >= inp.shape[0]:
        return
    cols = inp.shape[1]
    row_max = NEG_INF
    for col in range(cols):
        row_max = max(row_max, inp[row, col])
    norm = ZERO
    for col in range(cols):
        norm += math.exp(inp[row, col] - row_max)
    for col in range(cols):
        out[row, col] = math.exp(inp[row, col] - row_max) / norm


# Step 2 (log kernel 2): the online normalizer fuses the max and sum passes: each new maximum
# rescales the running sum by exp(old max - new max). Bytes: 3 passes -> 2, 12 MN bytes.
# Parallelism unchanged (M threads, uncoalesced), so the gain is at most the pass it saves (4/3).
def online_per_thread(inp, out):
    row = cuda.grid(1)
    if row >= inp.shape[0]:
        return
    cols = inp.shape[1]
    row_max = NEG_INF
    norm = ZERO
    for col in range(cols):
        row_max, norm = online_update(row_max, norm, inp[row, col])
    for col in range(cols):
        out[row, col] = math.exp(inp[row, col] - row_max) / norm


# Step 3 (log kernel 3): one block per row. Thread t takes columns t, t + T, t + 2T, ... so a warp
# reads 32 consecutive floats (coalesced, 128 bytes), keeps its own online (max, sum), and the block
# combines them with a shared-memory tree: max first, then the sums rescaled to the row max.
# Bytes: 12 MN from DRAM, but the second read of a row (128 KB) largely hits L2. Parallelism:
# M * T threads (a million), every SM busy: this is the step that turns latency into bandwidth.
def block_shared_tree(inp, out):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    scratch = cuda.shared.array(MAX_THREADS_PER_BLOCK, numba.float32)
    cols = inp.shape[1]
    local_max = NEG_INF
    local_norm = ZERO
    for col in range(tid, cols, threads):
        local_max, local_norm = online_update(local_max, local_norm, inp[row, col])
    row_max = shared_tree_reduce(local_max, scratch, tid, threads, True)
    # A thread that saw only -inf has local_norm 0: 0 * exp(-inf - row_max) stays 0 for a finite max.
    row_norm = shared_tree_reduce(local_norm * math.exp(local_max - row_max), scratch, tid, threads, False)
    for col in range(tid, cols, threads):
        out[row, col] = math.exp(inp[row, col] - row_max) / row_norm


# Step 4 (log kernel 4): the same block-per-row kernel with warp-shuffle reductions: 32 lanes combine
# through registers, one shared slot per warp, a second shuffle round in warp 0. Bytes: unchanged.
# Parallelism: unchanged; the reductions drop from log2(T) = 10 barriers to 2 each, which matters
# only while the reductions are a visible share of the time (the 1050Ti: 1.28x; an H100 row: a few %).
def block_warp_shuffle(inp, out):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    scratch = cuda.shared.array(WARP_SIZE, numba.float32)
    cols = inp.shape[1]
    local_max = NEG_INF
    local_norm = ZERO
    for col in range(tid, cols, threads):
        local_max, local_norm = online_update(local_max, local_norm, inp[row, col])
    row_max = warp_shuffle_block_reduce(local_max, scratch, tid, threads, True)
    row_norm = warp_shuffle_block_reduce(local_norm * math.exp(local_max - row_max), scratch, tid, threads,
                                         False)
    for col in range(tid, cols, threads):
        out[row, col] = math.exp(inp[row, col] - row_max) / row_norm


# Step 5 (seed 002): one long vector, so no row to give a block: three kernels.
# (a) every block folds its slice (grid-stride) into an online (max, sum) per thread and merges them
#     with a shared tree of safe_merge into one partial per block: reads 4 n bytes.
# (b) one block merges the partials into the vector's (max, sum): 8 bytes per partial, but one SM.
# (c) every thread normalizes its elements: reads 4 n, writes 4 n.
# Bytes: 12 n, as in step 3 (no row fits on chip to save the second read). Parallelism: all SMs in
# (a) and (c); (b) runs on one SM, so the partial count decides whether it is free or a bottleneck.
def vector_block_partials(inp, partial_max, partial_sum):
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    max_scratch = cuda.shared.array(MAX_THREADS_PER_BLOCK, numba.float32)
    sum_scratch = cuda.shared.array(MAX_THREADS_PER_BLOCK, numba.float32)
    local_max = NEG_INF
    local_sum = ZERO
    for i in range(cuda.grid(1), inp.shape[0], cuda.gridsize(1)):
        local_max, local_sum = online_update(local_max, local_sum, inp[i])
    max_scratch[tid] = local_max
    sum_scratch[tid] = local_sum
    cuda.syncthreads()
    stride = threads // 2
    while stride > 0:
        if tid < stride:
            max_scratch[tid], sum_scratch[tid] = safe_merge(max_scratch[tid], sum_scratch[tid],
                                                            max_scratch[tid + stride], sum_scratch[tid + stride])
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        partial_max[cuda.blockIdx.x] = max_scratch[0]
        partial_sum[cuda.blockIdx.x] = sum_scratch[0]


def vector_merge_partials(partial_max, partial_sum, total):
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    max_scratch = cuda.shared.array(MAX_THREADS_PER_BLOCK, numba.float32)
    sum_scratch = cuda.shared.array(MAX_THREADS_PER_BLOCK, numba.float32)
    local_max = NEG_INF
    local_sum = ZERO
    for i in range(tid, partial_max.shape[0], threads):
        local_max, local_sum = safe_merge(local_max, local_sum, partial_max[i], partial_sum[i])
    max_scratch[tid] = local_max
    sum_scratch[tid] = local_sum
    cuda.syncthreads()
    stride = threads // 2
    while stride > 0:
        if tid < stride:
            max_scratch[tid], sum_scratch[tid] = safe_merge(max_scratch[tid], sum_scratch[tid],
                                                            max_scratch[tid + stride], sum_scratch[tid + stride])
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        total[0] = max_scratch[0]
        total[1] = sum_scratch[0]


def vector_normalize(inp, total, out):
    vector_max = total[0]
    vector_sum = total[1]
    for i in range(cuda.grid(1), inp.shape[0], cuda.gridsize(1)):
        out[i] = math.exp(inp[i] - vector_max) / vector_sum


# ---------------------------------------------------------------------------------------------------
# Launchers: torch tensors in, torch tensors out, on torch's current stream.


@functools.cache
def _compiled(kernel, fastmath: bool):
    return cuda.jit(fastmath=fastmath)(kernel)


@functools.cache
def _numba_stream(handle: int):
    return cuda.external_stream(handle)


def _views(*tensors):
    """Zero-copy numba views of the tensors and the stream to launch on."""
    if SIMULATED:
        if any(t.is_cuda for t in tensors):
            raise ValueError("NUMBA_ENABLE_CUDASIM=1 runs the kernels on CPU tensors; got a CUDA tensor")
        return [t.numpy() for t in tensors], 0
    if not all(t.is_cuda for t in tensors):
        raise ValueError("the ladder's kernels take CUDA tensors (CPU tensors only under NUMBA_ENABLE_CUDASIM=1)")
    # sync=False: the kernel is queued on torch's current stream, behind whatever produced the input.
    views = [cuda.as_cuda_array(t, sync=False) for t in tensors]
    return views, _numba_stream(torch.cuda.current_stream(tensors[0].device).cuda_stream)


def _check(x, ndim: int, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} takes a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name} is fp32 only (as in the work log); got {x.dtype}: convert with x.float()")
    if x.dim() != ndim:
        raise ValueError(f"{name} takes a {ndim}-D tensor, got shape {tuple(x.shape)}")


def _check_threads(threads_per_block: int, multiple_of: int, name: str) -> None:
    # The tree reductions halve the block, so it must be a power of two; shuffles need whole warps.
    power_of_two = threads_per_block > 0 and threads_per_block & (threads_per_block - 1) == 0
    if not power_of_two or threads_per_block % multiple_of or threads_per_block > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"{name}: threads_per_block must be a power of two, a multiple of {multiple_of} and "
                         f"at most {MAX_THREADS_PER_BLOCK}; got {threads_per_block}")


def _rows_launch(kernel, x, threads_per_block, blocks, fastmath):
    out = _buffers.empty(x.shape, torch.float32, x.device)
    if x.numel():
        (inp_view, out_view), stream = _views(x, out)
        _compiled(kernel, fastmath)[blocks, threads_per_block, stream](inp_view, out_view)
    return out


def softmax_three_pass_per_thread(x: torch.Tensor, threads_per_block: int = THREADS_PER_ROW_BLOCK,
                                  fastmath: bool = False) -> torch.Tensor:
    """Step 1: softmax over the last dim of a 2-D fp32 tensor, one thread per row, three passes.

    Parameters
    ----------
    x : torch.Tensor
        (M, N) float32 on a CUDA device (on the CPU under ``NUMBA_ENABLE_CUDASIM=1``); any strides.
    threads_per_block : int
        Threads per block (rows per block); default the work log's 256.
    fastmath : bool
        Compile with ``__expf`` and approximate division instead of IEEE ``expf`` and ``/``.

    Returns
    -------
    torch.Tensor
        (M, N) float32. A row of only ``-inf`` gives NaN; so does any row with a NaN.

    Raises
    ------
    TypeError
        ``x`` is not a float32 tensor.
    ValueError
        ``x`` is not 2-D, or not on a CUDA device outside the simulator.
    """
    _check(x, 2, "softmax_three_pass_per_thread")
    return _rows_launch(three_pass_per_thread, x, threads_per_block,
                        math.ceil(x.shape[0] / threads_per_block), fastmath)


def softmax_online_per_thread(x: torch.Tensor, threads_per_block: int = THREADS_PER_ROW_BLOCK,
                              fastmath: bool = False) -> torch.Tensor:
    """Step 2: as :func:`softmax_three_pass_per_thread`, with the max and sum passes fused (online)."""
    _check(x, 2, "softmax_online_per_thread")
    return _rows_launch(online_per_thread, x, threads_per_block, math.ceil(x.shape[0] / threads_per_block), fastmath)


def softmax_block_shared_tree(x: torch.Tensor, threads_per_block: int = THREADS_PER_ROW,
                              fastmath: bool = False) -> torch.Tensor:
    """Step 3: one block per row, shared-memory tree reductions. Same contract as step 1, except
    that ``threads_per_block`` (default 1024) is the threads sharing a row: a power of two."""
    _check(x, 2, "softmax_block_shared_tree")
    _check_threads(threads_per_block, 1, "softmax_block_shared_tree")
    return _rows_launch(block_shared_tree, x, threads_per_block, x.shape[0], fastmath)


def softmax_block_warp_shuffle(x: torch.Tensor, threads_per_block: int = THREADS_PER_ROW,
                               fastmath: bool = False) -> torch.Tensor:
    """Step 4: one block per row, warp-shuffle reductions. Same contract as step 3, with
    ``threads_per_block`` a power of two from 32 to 1024. Not available in the simulator."""
    _check(x, 2, "softmax_block_warp_shuffle")
    _check_threads(threads_per_block, WARP_SIZE, "softmax_block_warp_shuffle")
    if SIMULATED:
        raise NotImplementedError("numba's CUDA simulator has no shfl_down_sync: step 4 runs on a GPU only")
    return _rows_launch(block_warp_shuffle, x, threads_per_block, x.shape[0], fastmath)


def softmax_vector_three_kernels(x: torch.Tensor, threads_per_block: int = THREADS_1D,
                                 partial_blocks: int | None = None, fastmath: bool = False) -> torch.Tensor:
    """Step 5 (seed 002): softmax of a 1-D fp32 vector with three kernels (partials, merge, normalize).

    Parameters
    ----------
    x : torch.Tensor
        (n,) float32 on a CUDA device (on the CPU under ``NUMBA_ENABLE_CUDASIM=1``).
    threads_per_block : int
        A power of two up to 1024; default seed 002's 256.
    partial_blocks : int, optional
        Blocks of the partials and normalize kernels (each loops over its grid stride). Default
        seed 002's one block per ``threads_per_block`` elements.
    fastmath : bool
        Compile with ``__expf`` and approximate division.

    Returns
    -------
    torch.Tensor
        (n,) float32; all NaN when every entry is ``-inf`` or any is NaN.

    Raises
    ------
    TypeError
        ``x`` is not a float32 tensor.
    ValueError
        ``x`` is not 1-D, a launch parameter is out of range, or ``x`` is on the wrong device.
    """
    _check(x, 1, "softmax_vector_three_kernels")
    _check_threads(threads_per_block, 1, "softmax_vector_three_kernels")
    n = x.shape[0]
    blocks = math.ceil(n / threads_per_block) if partial_blocks is None else partial_blocks
    if blocks < 1:
        raise ValueError(f"softmax_vector_three_kernels: partial_blocks must be positive, got {partial_blocks}")
    out = _buffers.empty((n,), torch.float32, x.device)
    if n == 0:
        return out
    partial_max = _buffers.empty((blocks,), torch.float32, x.device)
    partial_sum = _buffers.empty((blocks,), torch.float32, x.device)
    total = _buffers.empty((2,), torch.float32, x.device)
    (inp_view, out_view, max_view, sum_view, total_view), stream = _views(x, out, partial_max, partial_sum, total)
    _compiled(vector_block_partials, fastmath)[blocks, threads_per_block, stream](inp_view, max_view, sum_view)
    _compiled(vector_merge_partials, fastmath)[1, threads_per_block, stream](max_view, sum_view, total_view)
    _compiled(vector_normalize, fastmath)[blocks, threads_per_block, stream](inp_view, total_view, out_view)
    return out


# The row steps in ladder order: (name the bench and tests print, launcher, the seed's 1050Ti ms on
# 1024 x 32768 fp32).
ROW_STEPS = (
    ("1 three-pass, thread/row", softmax_three_pass_per_thread, 124.1),
    ("2 online, thread/row", softmax_online_per_thread, 88.1),
    ("3 block/row, shared tree", softmax_block_shared_tree, 6.61),
    ("4 block/row, warp shuffle", softmax_block_warp_shuffle, 5.17),
)
