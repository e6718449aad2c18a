"""Decode attention over a KV cache (flash-decoding) and merge_attention: launchers, the torch path
for CPU tensors, custom ops for torch.compile, and the public functions."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from ... import _autocast, _buffers, _device, _validate
from ..._launch import Launcher, aligned, dependent_launch, op_when_compiling, vector_width
from . import kernels, plan as planner

NAME = "attention_with_kvcache"
MERGE_NAME = "merge_attention"
DTYPES = (torch.float16, torch.bfloat16)
MERGE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
MIN_PAGE_SIZE = 16
# The torch path gathers this many keys of every sequence at a time: it bounds the fp32 copies of
# K and V and the score tile, while keeping each einsum large enough to run at matmul speed.
CPU_KEY_BLOCK = 2048

# --------------------------------------------------------------------------------------------
# Launchers (Triton: CUDA, or CPU tensors under TRITON_INTERPRET=1)
# --------------------------------------------------------------------------------------------

# Launches skip Triton's per-call argument binding (_launch.Launcher), keyed by what decides the
# kernels' specialization: the plan (every shape and tile), the strides, and the alignment of the
# caller's tensors. A decode step is one call per layer per generated token.
_split_launcher = Launcher(kernels.decode_split_kernel)
_merge_launcher = Launcher(kernels.decode_merge_kernel)
_merge_attention_launcher = Launcher(kernels.merge_attention_kernel)
_device.plan_cache(lambda: (_split_launcher.compiled.clear(), _merge_launcher.compiled.clear(),
                            _merge_attention_launcher.compiled.clear()))


def _capacity(k_cache: torch.Tensor, block_table: Optional[torch.Tensor]) -> int:
    return block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]


class _Recipe:
    """Everything a call signature fixes: the plan, buffer shapes, the kernels' integer arguments
    (shapes and strides) and constexprs. Built once per signature; a repeated call only allocates
    and launches (a decode step calls this once per layer per token)."""

    __slots__ = ("plan", "out_shape", "lse_shape", "part_rows", "part_lse_offset", "split_ints", "merge_ints",
                 "split_launch", "merge_launch", "nothing_to_read")

    def __init__(self, key, q, k_cache, v_cache, cache_seqlens, block_table, causal, num_splits, return_lse):
        batch, n_queries, heads_q, head_dim = q.shape
        heads_kv = k_cache.shape[2]
        page_size = k_cache.shape[1] if block_table is not None else 0
        capacity = _capacity(k_cache, block_table)
        device = q.device
        chosen = self.plan = planner.decode_plan(
            batch, heads_q, heads_kv, n_queries, head_dim, capacity, page_size, q.dtype, cache_seqlens is not None,
            num_splits, device.type == "cuda", _device.sm_count(device), _device.interpreter_active())
        self.out_shape = (batch, n_queries, heads_q, head_dim)
        self.lse_shape = (batch, heads_q, n_queries)
        self.nothing_to_read = capacity == 0  # (and no cache memory to point at): every row is empty
        split = chosen.path == "split"
        self.part_rows = chosen.slots * heads_q * n_queries if split else 0
        self.part_lse_offset = self.part_rows * head_dim
        # Unused pointers (no lengths, a contiguous cache, no lse) get the output as a placeholder.
        seqlens_stride = cache_seqlens.stride(0) if cache_seqlens is not None else 0
        table_strides = block_table.stride() if block_table is not None else (0, 0)
        out_strides = (n_queries * heads_q * head_dim, heads_q * head_dim, head_dim)  # ours: contiguous
        lse_strides = (heads_q * n_queries, n_queries, 1) if return_lse else (0, 0, 0)
        group = heads_q // heads_kv
        counts = (capacity, chosen.min_chunk_blocks, chosen.target_splits, chosen.num_splits)
        # The caches' strides read as (page or sequence, row, head, dim) for either layout.
        self.split_ints = (batch, group, n_queries, *counts, *q.stride(), *k_cache.stride(), *v_cache.stride(),
                           seqlens_stride, *table_strides, *out_strides, *lse_strides)
        self.merge_ints = (batch, group, n_queries, heads_q, *counts, seqlens_stride, *out_strides, *lse_strides)
        common = dict(HEAD_DIM=head_dim, BATCH_POW2=_device.next_power_of_2(batch) if split else 1,
                      HAS_SEQLENS=cache_seqlens is not None, AUTO=chosen.num_splits == 0, WRITE_LSE=return_lse,
                      VEC=vector_width(head_dim, q, k_cache, v_cache))
        waits = dependent_launch(q.device)  # (the merge's)
        self.split_launch = _split_launcher.bind(
            chosen.grid, (*key, waits["WAIT"]), **common, BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n,
            BLOCK_D=chosen.block_d, PAGE_SIZE=page_size, CAUSAL=causal, SPLIT=split,
            LAUNCH_DEPENDENTS=split and waits["WAIT"], num_warps=chosen.num_warps, num_stages=chosen.num_stages)
        self.merge_launch = _merge_launcher.bind(
            chosen.merge_grid, (*key, waits["WAIT"]), **common, BLOCK_R=chosen.merge_block_r,
            BLOCK_P=chosen.merge_block_p, BLOCK_D=chosen.merge_block_d, BLOCK_N=chosen.block_n,
            num_warps=chosen.merge_warps, **waits) if split else None


_RECIPES: dict = {}
_device.plan_cache(_RECIPES.clear)


def launch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
                  block_table: Optional[torch.Tensor], causal: bool, scale: float, num_splits: int,
                  return_lse: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(out, lse or None) for validated inputs; ``num_splits`` 0 is "auto"."""
    device = q.device
    # What decides the plan and the kernels' specialization (shapes, strides, dtypes, the caller's
    # pointers' alignment, options): the recipe's and the launchers' key.
    signature = (q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.stride(), q.dtype, device,
                 None if cache_seqlens is None else (cache_seqlens.stride(), aligned(cache_seqlens)),
                 None if block_table is None else (block_table.shape, block_table.stride(), aligned(block_table)),
                 causal, num_splits, return_lse, aligned(q), aligned(k_cache), aligned(v_cache),
                 _device.interpreter_active())
    recipe = _RECIPES.get(signature)
    if recipe is None:
        recipe = _device.remember(_RECIPES, signature, _Recipe(signature, q, k_cache, v_cache, cache_seqlens,
                                                                block_table, causal, num_splits, return_lse))
    chosen = recipe.plan
    planner.record(chosen)
    if chosen.path == "torch":
        return decode_torch(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, return_lse)
    out = _buffers.empty(recipe.out_shape, q.dtype, device)
    lse = _buffers.empty(recipe.lse_shape, torch.float32, device) if return_lse else None
    if out.numel() == 0:
        return out, lse
    if recipe.nothing_to_read:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse
    split = chosen.path == "split"
    # The partials: outputs, then lses (recipe.part_lse_offset elements on), in one buffer; a
    # placeholder, never written, on the direct path.
    parts = _buffers.empty((recipe.part_rows * (q.shape[3] + 1),), torch.float32, device) if split else out
    seqlens = cache_seqlens if cache_seqlens is not None else out
    lse_arg = lse if lse is not None else out
    recipe.split_launch(q, k_cache, v_cache, seqlens, block_table if block_table is not None else out, out, lse_arg,
                        parts, recipe.part_lse_offset, *recipe.split_ints, scale * kernels.LOG2E)
    if split:
        recipe.merge_launch(parts, recipe.part_lse_offset, seqlens, out, lse_arg, *recipe.merge_ints)
    return out, lse


def launch_merge(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_attention for validated, stacked inputs: outs (N, ..., D), lses (N, ...)."""
    n_parts, head_dim = outs.shape[0], outs.shape[-1]
    rows = math.prod(outs.shape[1:-1])
    device = outs.device
    chosen = planner.merge_plan(n_parts, rows, head_dim, _device.triton_runs_on(device), _device.sm_count(device))
    planner.record(chosen)
    if chosen.path == "torch":
        return merge_torch(outs, lses)
    out = _buffers.empty(outs.shape[1:], outs.dtype, device)
    lse = _buffers.empty(lses.shape[1:], torch.float32, device)
    if out.numel() == 0:
        return out, lse
    outs3 = outs.reshape(n_parts, rows, head_dim)
    lses2 = lses.reshape(n_parts, rows)
    key = (chosen, outs3.dtype, lses2.dtype, outs3.stride(), lses2.stride(), aligned(outs3), aligned(lses2))
    _merge_attention_launcher(
        chosen.grid, key, outs3, lses2, out, lse, n_parts, rows, *outs3.stride(), *lses2.stride(),
        HEAD_DIM=head_dim, BLOCK_R=chosen.block_r, BLOCK_P=chosen.block_p, BLOCK_D=chosen.block_d,
        num_warps=chosen.num_warps)
    return out, lse


# --------------------------------------------------------------------------------------------
# The torch path: CPU tensors without the interpreter (and the benchmark's reference on the GPU)
# --------------------------------------------------------------------------------------------


def decode_torch(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, return_lse):
    """attention_with_kvcache in PyTorch, fp32: the cache gathered CPU_KEY_BLOCK keys at a time,
    masked scores, and the online softmax across the gathered blocks."""
    batch, n_queries, heads_q, head_dim = q.shape
    heads_kv = k_cache.shape[2]
    group = heads_q // heads_kv
    capacity = _capacity(k_cache, block_table)
    device = q.device
    if cache_seqlens is None:
        lens = torch.full((batch,), capacity, dtype=torch.int64, device=device)
    else:
        lens = cache_seqlens.long().clamp(0, capacity)
    longest = int(lens.max()) if batch else 0  # a host read: fine on this path (not the GPU's)
    queries = torch.arange(n_queries, device=device)
    # Keys j < limit[b, i] are visible to query i of sequence b (bottom-right causal, or all).
    limit = lens[:, None] - (n_queries - 1 - queries)[None, :] if causal else lens[:, None].expand(batch, n_queries)
    qf = q.float().reshape(batch, n_queries, heads_kv, group, head_dim)
    m = torch.full((batch, n_queries, heads_kv, group), float("-inf"), device=device)
    l = torch.zeros_like(m)
    acc = torch.zeros((batch, n_queries, heads_kv, group, head_dim), device=device)
    for start in range(0, longest, CPU_KEY_BLOCK):
        keys = torch.arange(start, min(start + CPU_KEY_BLOCK, longest), device=device)
        if block_table is not None:
            page_size = k_cache.shape[1]
            # Entries past a sequence's pages may hold anything: clamped for the gather, masked after.
            pages = block_table[:, keys // page_size].long().clamp(0, k_cache.shape[0] - 1)
            k, v = k_cache[pages, keys % page_size], v_cache[pages, keys % page_size]  # (B, n, Hkv, D)
        else:
            k, v = k_cache[:, start:start + keys.numel()], v_cache[:, start:start + keys.numel()]
        # Past a sequence's length the cache may hold anything, NaN included: zero the values.
        in_seq = keys[None, :] < lens[:, None]
        v = v.float().masked_fill(~in_seq[:, :, None, None], 0.0)
        s = torch.einsum("bshgd,bnhd->bshgn", qf, k.float()) * scale
        visible = keys[None, None, :] < limit[:, :, None]  # (B, Sq, n)
        s = s.masked_fill(~visible[:, :, None, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_ref = m_new.masked_fill(m_new == float("-inf"), 0.0)
        p = torch.exp(s - m_ref[..., None])
        alpha = torch.exp(m - m_ref)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.einsum("bshgn,bnhd->bshgd", p, v)
        m = m_new
    has_keys = l > 0
    out = torch.where(has_keys[..., None], acc / torch.where(has_keys, l, 1.0)[..., None], 0.0)
    out = out.reshape(batch, n_queries, heads_q, head_dim).to(q.dtype)
    if not return_lse:
        return out, None
    lse = torch.where(has_keys, m + torch.log(torch.where(has_keys, l, 1.0)), float("-inf"))
    return out, lse.reshape(batch, n_queries, heads_q).transpose(1, 2).contiguous()


def merge_torch(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_attention in PyTorch, fp32, with the kernel's conventions for -inf and NaN."""
    lses = lses.float()
    m = lses.amax(0)
    m_ref = m.masked_fill(m == float("-inf"), 0.0)
    weights = torch.exp(lses - m_ref)  # empty partials weigh 0
    values = outs.float().masked_fill((lses == float("-inf"))[..., None], 0.0)  # and are not read
    total = weights.sum(0)
    empty = total == 0
    total = torch.where(empty, 1.0, total)
    out = ((weights[..., None] * values).sum(0) / total[..., None]).masked_fill(empty[..., None], 0.0)
    lse = torch.where(empty, float("-inf"), m_ref + torch.log(total))
    return out.to(outs.dtype), lse


# --------------------------------------------------------------------------------------------
# Custom ops: torch.compile sees one opaque op each, with shape-only fakes
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("onlinesoftmax::attention_with_kvcache", mutates_args=())
def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
               block_table: Optional[torch.Tensor], causal: bool, scale: float, num_splits: int,
               return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = launch_decode(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse)
    return out, lse if lse is not None else q.new_empty((0,), dtype=torch.float32)


@_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse):
    batch, n_queries, heads_q, _ = q.shape
    lse_shape = (batch, heads_q, n_queries) if return_lse else (0,)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("onlinesoftmax::merge_attention", mutates_args=())
def _merge_op(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_merge(outs, lses)


@_merge_op.register_fake
def _(outs, lses):
    return outs.new_empty(outs.shape[1:]), lses.new_empty(lses.shape[1:], dtype=torch.float32)


_decode = op_when_compiling(_decode_op, launch_decode)
_merge = op_when_compiling(_merge_op, launch_merge)
_FORWARD = {NAME: _decode, MERGE_NAME: _merge}


class _ForwardOnly(torch.autograd.Function):
    """Inputs that require grad get outputs whose backward raises, as torch does for an op
    without a derivative: inference under grad mode still works, a training step fails loudly."""

    @staticmethod
    def forward(ctx, name, *args):
        ctx.name = name
        out, lse = _FORWARD[name](*args)
        if lse is not None:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"{ctx.name} is forward-only: it has no backward. Call it under torch.no_grad() or "
                           "torch.inference_mode(), or use onlinesoftmax.attention (differentiable) for training.")


def _run(name, tensors, args):
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return _ForwardOnly.apply(name, *args)
    return _FORWARD[name](*args)


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------


_CHECKED: dict = {}  # signature -> (scale, num_splits) of calls that passed _check
_device.plan_cache(_CHECKED.clear)


def _signature(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits) -> Optional[tuple]:
    """What _check looks at, as a key (types included, as attention's: True == 1 and 1 == 1.0, but the
    checks take some of these and refuse others); None where it cannot be one (not tensors): such
    calls are checked every time, as are those whose key cannot be hashed (the lookup says so)."""
    try:
        return (q.shape, k_cache.shape, v_cache.shape, q.dtype, k_cache.dtype, v_cache.dtype, q.device,
                k_cache.device, v_cache.device, type(q), type(k_cache), type(v_cache),
                *(None if t is None else (t.shape, t.dtype, t.device, type(t)) for t in (cache_seqlens, block_table)),
                causal, type(causal), scale, type(scale), num_splits, type(num_splits))
    except AttributeError:
        return None


def _check(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits) -> tuple[float, int]:
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _validate.tensor(t, NAME, name)
        if t.dim() != 4:
            layout = "(batch, queries, heads, head_dim)" if name == "q" else \
                "(batch, S_max, kv_heads, head_dim) or, paged, (num_blocks, page_size, kv_heads, head_dim)"
            raise ValueError(f"{NAME}: {name} must be 4-D {layout}, got shape {tuple(t.shape)}")
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise TypeError(f"{NAME}: q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, "
                        f"{v_cache.dtype}")
    _validate.float_dtype(q, NAME, DTYPES)
    _validate.device(q, NAME)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{NAME}: k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    batch, _, heads_q, head_dim = q.shape
    heads_kv = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"{NAME}: head dims differ: q has {head_dim}, the cache {k_cache.shape[3]}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{NAME}: head dim {head_dim} is not supported: 1 to {MAX_HEAD_DIM}")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"{NAME}: the query heads ({heads_q}) must be a multiple of the cache's KV heads "
                         f"({heads_kv})")
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache)
    for name, t, dims in (("cache_seqlens", cache_seqlens, 1), ("block_table", block_table, 2)):
        if t is None:
            continue
        _validate.tensor(t, NAME, name)
        if t.dtype != torch.int32:
            raise TypeError(f"{NAME}: {name} must be int32 (as flash-attn's), got {t.dtype}: pass {name}.int()")
        if t.dim() != dims or t.shape[0] != batch:
            want = "(batch,)" if dims == 1 else "(batch, max_blocks_per_seq)"
            raise ValueError(f"{NAME}: {name} must have shape {want} with batch {batch}, got {tuple(t.shape)}")
        tensors[name] = t
    _validate.same_device(NAME, **tensors)
    if block_table is not None:
        if cache_seqlens is None:
            raise ValueError(f"{NAME}: a paged cache (block_table) needs cache_seqlens: the pages do not say "
                             "how many keys each sequence has")
        page_size = k_cache.shape[1]
        if page_size < MIN_PAGE_SIZE or page_size & (page_size - 1):
            raise ValueError(f"{NAME}: the page size (k_cache.shape[1]) must be a power of two >= {MIN_PAGE_SIZE}, "
                             f"got {page_size}")
    elif k_cache.shape[0] != batch:
        raise ValueError(f"{NAME}: a contiguous cache has one entry per sequence: k_cache.shape[0] is "
                         f"{k_cache.shape[0]}, q's batch {batch} (pass block_table for a paged cache)")
    if not isinstance(causal, bool):
        raise TypeError(f"{NAME}: causal must be True or False, got {causal!r}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else _validate.positive(scale, NAME, "scale")
    if isinstance(num_splits, str) and num_splits == "auto":
        splits = 0
    else:
        splits = _validate.integer(num_splits, NAME, "num_splits")
        if splits < 1:
            raise ValueError(f"{NAME}: num_splits must be 'auto' or an int >= 1, got {splits}")
        if splits > 1 and batch > planner.SPLIT_MAX_BATCH:
            raise ValueError(f"{NAME}: num_splits > 1 takes batches of up to {planner.SPLIT_MAX_BATCH}, got "
                             f"{batch}: pass 'auto' (which runs such batches unsplit) or split the batch")
    if batch > planner.MAX_GRID_Y:
        raise ValueError(f"{NAME}: batch {batch} exceeds {planner.MAX_GRID_Y}; split the batch into several calls")
    return scale, splits


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                           cache_seqlens: Optional[torch.Tensor] = None, block_table: Optional[torch.Tensor] = None,
                           causal: bool = True, scale: Optional[float] = None,
                           num_splits: Union[int, str] = "auto", return_lse: bool = False):
    """Attention of a few new queries per sequence over a KV cache (flash-decoding; forward only).

    Named and shaped after flash-attn's ``flash_attn_with_kvcache``, so serving code can switch
    (differences: ``scale`` for ``softmax_scale``, ``return_lse`` for ``return_softmax_lse``,
    ``num_splits="auto"`` for 0, ``causal`` True by default, ``cache_seqlens`` a tensor; no
    appending of new keys, rotary embeddings, windows or softcapping). The keys of each sequence
    are cut into splits that run in parallel and are merged through their log-sum-exp, so a batch
    of one long sequence still fills the GPU.

    Parameters
    ----------
    q : Tensor, shape (B, Sq, Hq, D)
        float16 or bfloat16; any strides. ``Sq`` new queries per sequence (1 when decoding, a few
        when verifying speculated tokens).
    k_cache, v_cache : Tensor
        Same dtype and device as ``q``, same shape, any strides (unit stride along D reads fastest).
        Contiguous cache: (B, S_max, Hkv, D). Paged cache: (num_blocks, page_size, Hkv, D) with
        ``block_table``; ``page_size`` a power of two >= 16. ``Hq`` a multiple of ``Hkv`` (GQA;
        ``Hkv = 1`` is MQA): the query heads of a KV head are read together, so each K/V byte is
        read once. ``D`` any head dim up to 256, as flash-attn's (64, 128 and 256 run as they are;
        others are padded inside to a power of two of at least 16, and move 16 bytes at a time
        where their rows are whole 16-byte vectors, as 72 or 40 in bf16).
    cache_seqlens : Tensor, shape (B,), int32, optional
        Keys of each sequence; None means every sequence has S_max keys. Values are read on the
        device only (no host sync); values outside [0, capacity] are clamped to it.
    block_table : Tensor, shape (B, max_blocks_per_seq), int32, optional
        Pages of each sequence, in order; entries past a sequence's length are never read.
        Requires ``cache_seqlens``. Capacity: ``max_blocks_per_seq * page_size`` keys.
    causal : bool
        True: query ``i`` sees keys ``j <= seqlen - Sq + i`` (bottom-right aligned: the queries
        are the last ``Sq`` positions, as in flash-attn). False: every query sees all ``seqlen`` keys.
    scale : float, optional
        Multiplies ``q @ k^T``; finite and > 0; ``1 / sqrt(D)`` by default.
    num_splits : int or "auto"
        Splits of each sequence's keys. "auto": planned from the batch, KV heads, the longest
        possible sequence and the SM count, each sequence's share decided on the device from its
        length (``onlinesoftmax.ops.decode.plan.last_plan().describe()`` says what ran). An int
        forces it; 1 writes the output in one launch, without the merge.
    return_lse : bool
        Also return the log-sum-exp.

    Returns
    -------
    out : Tensor, shape (B, Sq, Hq, D), dtype of ``q``, contiguous (inside an autocast region q,
        k_cache and v_cache are taken in the region's dtype, as scaled_dot_product_attention takes
        them: a float32 q of a float32 layer before it, say)
    lse : Tensor, shape (B, Hq, Sq), float32 (only with ``return_lse=True``)
        Natural-log log-sum-exp of each query's scaled, masked scores: flash-attn's
        ``softmax_lse`` layout. Merge with other partial attentions through :func:`merge_attention`.

    Notes
    -----
    A query with no visible key (an empty sequence, or causal with ``seqlen < Sq``) gives zeros
    and lse ``-inf``, never NaN. Scores, softmax statistics and accumulation are fp32. Results are
    bitwise reproducible (no atomics; partials merged in a fixed order). No host synchronization
    and no allocation whose size depends on tensor values: CUDA-graph capturable, and traceable by
    ``torch.compile(fullgraph=True)`` (a custom op). CPU tensors run a PyTorch implementation, or
    the Triton kernels when ``TRITON_INTERPRET=1``.

    Forward only: with inputs that require grad (under grad mode), the output carries a
    ``grad_fn`` whose backward raises, as torch does for ops without a derivative, so inference
    code that leaves grad mode on still works and a training step fails loudly instead of
    silently training on a non-differentiable output.

    Raises
    ------
    TypeError
        Non-tensor inputs, dtypes other than float16/bfloat16 or mixed, non-int32 ``cache_seqlens``
        or ``block_table``, a non-bool ``causal``, a non-numeric ``scale`` or ``num_splits``.
    ValueError
        Wrong ranks or shapes, head dims that differ or are unsupported, ``Hq`` not a multiple of
        ``Hkv``, ``block_table`` without ``cache_seqlens``, a page size that is not a power of two
        >= 16, tensors on different or unsupported devices, a scale that is not finite and
        positive, ``num_splits`` < 1, a batch over 65535 (or over 1024 with ``num_splits`` > 1).

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> q = torch.randn(2, 1, 8, 64, dtype=torch.bfloat16)
    >>> k_cache = v_cache = torch.randn(2, 100, 2, 64, dtype=torch.bfloat16)
    >>> lens = torch.tensor([100, 37], dtype=torch.int32)
    >>> onlinesoftmax.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens).shape
    torch.Size([2, 1, 8, 64])
    """
    if _autocast.active_for(q):
        # scaled_dot_product_attention's policy over the cache (see _autocast); caches already in
        # the region's dtype are not copied.
        return _autocast.call_lower_precision(_attention_with_kvcache, (q, k_cache, v_cache), cache_seqlens,
                                              block_table, causal, scale, num_splits, return_lse)
    return _attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                   return_lse)


def _attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse):
    # The checks run once a signature (a decode step calls this once a layer a token; on the CPU
    # machine, launches recorded, they were a quarter of the call: 25.7 -> 19.1 us); a signature
    # holds everything they look at.
    # No hash() of the key here: torch.compile cannot trace it (torch 2.11); the lookup raises instead.
    # While torch.compile traces, no lookup by shape: it would specialize every dim to its traced
    # value (a dynamic batch compiled again at each new size).
    signature = None if torch.compiler.is_compiling() else _signature(q, k_cache, v_cache, cache_seqlens,
                                                                        block_table, causal, scale, num_splits)
    try:
        checked = _CHECKED.get(signature) if signature is not None else None
    except TypeError:  # an unhashable option: _check says what is wrong with it, or accepts it
        signature = checked = None
    if checked is None:
        checked = _check(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits)
        if signature is not None:
            _device.remember(_CHECKED, signature, checked)
    scale, splits = checked
    out, lse = _run(NAME, (q, k_cache, v_cache),
                    (q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, splits, bool(return_lse)))
    return (out, lse) if return_lse else out


def merge_attention(outs: Union[torch.Tensor, Sequence[torch.Tensor]],
                    lses: Union[torch.Tensor, Sequence[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge N attentions over disjoint key sets into one, through their log-sum-exp.

    ``out = sum_i exp(lse_i - lse) out_i`` with ``lse = log(sum_i exp(lse_i))``: the associative
    (m, d) operator of the online softmax, in log-sum-exp form, computed in fp32.

    Parameters
    ----------
    outs : Tensor of shape (N, ..., D), or a sequence of N tensors of shape (..., D)
        Partial attention outputs, each normalized over its own keys; float16, bfloat16 or float32.
    lses : Tensor of shape (N, ...), or a sequence of N tensors of shape (...)
        Their natural-log log-sum-exp (``return_lse=True`` of :func:`attention_with_kvcache` or
        :func:`onlinesoftmax.attention`, in the matching layout); any float dtype. ``-inf`` marks
        a partial that saw no key.

    Returns
    -------
    out : Tensor, shape (..., D), dtype of ``outs``, contiguous
    lse : Tensor, shape (...), float32

    Notes
    -----
    A partial with lse ``-inf`` contributes nothing and its output is not read (it may hold
    anything, NaN included); when every partial is empty the result is zeros and ``-inf``, never
    NaN. A NaN lse, or a NaN in the output of a partial that has keys, propagates (NaN out and
    lse for that row); an lse of ``+inf`` gives NaN. The partials are folded in one fixed order:
    bitwise reproducible. Triton on CUDA (and under ``TRITON_INTERPRET=1``), PyTorch on CPU;
    a custom op under ``torch.compile``. Forward only, as :func:`attention_with_kvcache`.

    Raises
    ------
    TypeError
        Non-tensor inputs, unsupported dtypes.
    ValueError
        No partials, shapes that do not match (``lses.shape != outs.shape[:-1]``, or partials of
        different shapes), tensors on different or unsupported devices.

    Examples
    --------
    >>> import torch, onlinesoftmax
    >>> outs, lses = torch.randn(2, 3, 4, 64), torch.randn(2, 3, 4)
    >>> out, lse = onlinesoftmax.merge_attention(outs, lses)
    >>> out.shape, lse.shape
    (torch.Size([3, 4, 64]), torch.Size([3, 4]))
    """
    outs = _stacked(outs, "outs")
    lses = _stacked(lses, "lses")
    if outs.dim() < 2 or outs.shape[0] == 0:
        raise ValueError(f"{MERGE_NAME}: outs must hold at least one partial of shape (..., D), got shape "
                         f"{tuple(outs.shape)}")
    if lses.shape != outs.shape[:-1]:
        raise ValueError(f"{MERGE_NAME}: lses must have the shape of outs without its last dim: outs "
                         f"{tuple(outs.shape)}, lses {tuple(lses.shape)}")
    _validate.float_dtype(outs, MERGE_NAME, MERGE_DTYPES)
    _validate.float_dtype(lses, MERGE_NAME, MERGE_DTYPES)
    _validate.device(outs, MERGE_NAME)
    _validate.same_device(MERGE_NAME, outs=outs, lses=lses)
    return _run(MERGE_NAME, (outs, lses), (outs, lses))


def _stacked(value, name: str) -> torch.Tensor:
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{MERGE_NAME}: {name} is empty: pass at least one partial")
        for t in value:
            _validate.tensor(t, MERGE_NAME, f"every entry of {name}")
        if len({t.shape for t in value}) > 1:
            raise ValueError(f"{MERGE_NAME}: the partials in {name} must share one shape, got "
                             f"{[tuple(t.shape) for t in value]}")
        return torch.stack(list(value))
    return _validate.tensor(value, MERGE_NAME, name)
