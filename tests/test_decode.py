"""attention_with_kvcache (flash-decoding) and merge_attention against a float64 reference on the
gathered cache.

CI runs the Triton kernels under TRITON_INTERPRET=1 on CPU tensors, where the plan uses key blocks
of 32 and row blocks of 16, so small sizes cross several key blocks, row blocks, splits and both
page-table lookups (pages of 16 are read per key, pages of 32 and 64 per block). Cache entries
past each sequence's length, unused pages and block-table entries past a sequence's pages hold
NaN or out-of-range values: a kernel that reads them fails. On a GPU the same tests run on CUDA
tensors, plus CUDA-graph replay and realistic sizes.
"""

from __future__ import annotations

import math

import pytest
import torch

from onlinesoftmax import _device
from onlinesoftmax._launch import vector_width
from onlinesoftmax.ops.decode import attention_with_kvcache, merge_attention
from onlinesoftmax.ops.decode import op as decode_op
from onlinesoftmax.ops.decode import plan

from conftest import DEVICE, ON_GPU, TRITON_RUNS, assert_matches, compiled_for_sm90, gpu_only, relative_error

BAD_PAGE = 10**9  # block-table entries past a sequence's pages: reading one would fault or fail


def gathered(cache, block_table, b, n):
    """The first n keys of sequence b as (n, Hkv, D)."""
    if block_table is None:
        return cache[b, :n]
    keys = torch.arange(n, device=cache.device)
    return cache[block_table[b, keys // cache.shape[1]].long(), keys % cache.shape[1]]


def reference(q, k_cache, v_cache, lens, block_table, causal, scale=None):
    """float64 (out (B, Sq, Hq, D), lse (B, Hq, Sq)); queries without visible keys give 0 and -inf."""
    batch, n_queries, heads_q, head_dim = q.shape
    group = heads_q // k_cache.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((batch, heads_q, n_queries), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(batch):
        n = int(lens[b]) if lens is not None else k_cache.shape[1]
        k = gathered(k_cache, block_table, b, n).double().repeat_interleave(group, 1)  # (n, Hq, D)
        v = gathered(v_cache, block_table, b, n).double().repeat_interleave(group, 1)
        s = torch.einsum("qhd,nhd->hqn", q[b].double(), k) * scale
        keys, queries = torch.arange(n, device=q.device), torch.arange(n_queries, device=q.device)
        seen = keys[None, :] <= n - n_queries + queries[:, None] if causal else torch.ones(
            n_queries, n, dtype=torch.bool, device=q.device)
        has_keys = seen.any(-1)[:, None]
        s = torch.where(has_keys, s.masked_fill(~seen, float("-inf")), 0.0)
        out[b] = torch.einsum("hqn,nhd->qhd", torch.softmax(s, -1) * has_keys, v)
        lse[b] = torch.where(has_keys[:, 0], torch.logsumexp(s, -1), float("-inf"))
    return out, lse


def make_inputs(gen, batch, n_queries, heads_q, heads_kv, head_dim, lens, dtype=torch.bfloat16, page_size=0,
                capacity=None, seqlens=True):
    """q, caches, cache_seqlens and block_table (shuffled pages); NaN wherever no key is."""
    capacity = capacity or max(max(lens), 1)
    q = torch.randn((batch, n_queries, heads_q, head_dim), generator=gen).to(dtype)
    if page_size:
        max_blocks = _device.cdiv(capacity, page_size)
        num_blocks = batch * max_blocks + 3  # spare pages no sequence uses
        shape = (num_blocks, page_size, heads_kv, head_dim)
        k_cache, v_cache = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
        table = torch.randperm(num_blocks, generator=gen)[:batch * max_blocks].view(batch, max_blocks).int()
        used = torch.zeros(num_blocks, page_size, dtype=torch.bool)
        for b, n in enumerate(lens):
            keys = torch.arange(n)
            used[table[b, keys // page_size].long(), keys % page_size] = True
            table[b, _device.cdiv(n, page_size):] = BAD_PAGE
        for cache in (k_cache, v_cache):
            cache[~used] = float("nan")
    else:
        shape = (batch, capacity, heads_kv, head_dim)
        k_cache, v_cache = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
        for b, n in enumerate(lens):
            k_cache[b, n:] = float("nan")
            v_cache[b, n:] = float("nan")
        table = None
    cache_seqlens = torch.tensor(lens, dtype=torch.int32) if seqlens else None
    return [t.to(DEVICE) if t is not None else None for t in (q, k_cache, v_cache, cache_seqlens, table)]


def check(inputs, causal=True, num_splits="auto", scale=None, what=""):
    q, k_cache, v_cache, lens, table = inputs
    out, lse = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table, causal=causal,
                                      scale=scale, num_splits=num_splits, return_lse=True)
    ref_out, ref_lse = reference(q, k_cache, v_cache, lens, table, causal, scale)
    assert out.dtype == q.dtype and out.shape == q.shape and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    assert_matches(out, ref_out, q.dtype, f"{what} out")
    assert_matches(lse, ref_lse, torch.float32, f"{what} lse")
    return out, lse


def expected_path(path):
    assert path in plan.PATHS
    return path if TRITON_RUNS else "torch"


LAYOUTS = {"contiguous": 0, "page16": 16, "page32": 32}


# Uneven lengths: 0 (no key), 1, the full capacity, and lengths that end mid-block and mid-page.
@pytest.mark.parametrize("num_splits", ["auto", 1, 2, 3, 7])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_uneven_lengths(layout, num_splits, gen):
    inputs = make_inputs(gen, 4, 3, 8, 2, 64, [150, 0, 1, 77], page_size=LAYOUTS[layout], capacity=160)
    check(inputs, causal=True, num_splits=num_splits, what=f"{layout} splits={num_splits}")
    chosen = plan.last_plan()
    forced = {1: "direct"}.get(num_splits, "split" if num_splits != "auto" else chosen.path)
    assert chosen.path == expected_path(forced)
    if TRITON_RUNS and LAYOUTS[layout]:
        assert chosen.page_lookup == ("per key" if LAYOUTS[layout] < chosen.block_n else "per block")


# Sq 1 (decoding), 3 and 5 (verifying speculated tokens), with and without the causal mask; a
# sequence shorter than Sq leaves its first queries without a visible key when causal.
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("n_queries", [1, 3, 5])
def test_queries_and_mask(n_queries, causal, gen):
    inputs = make_inputs(gen, 3, n_queries, 4, 2, 64, [70, 2, 33], page_size=16, capacity=96)
    check(inputs, causal=causal, num_splits=3, what=f"Sq={n_queries} causal={causal}")


# Group 1 (MHA), 4 and 8 (MQA with 8 query heads); group 8 with 5 queries is 40 rows: three row
# blocks of 16 under the interpreter.
@pytest.mark.parametrize("heads_q, heads_kv, n_queries", [(2, 2, 3), (8, 2, 3), (8, 1, 5)],
                         ids=["group1", "group4", "mqa-group8"])
def test_gqa_groups(heads_q, heads_kv, n_queries, gen):
    inputs = make_inputs(gen, 2, n_queries, heads_q, heads_kv, 64, [90, 41], page_size=32, capacity=96)
    check(inputs, num_splits=2, what=f"{heads_q}/{heads_kv}")
    if TRITON_RUNS:
        chosen = plan.last_plan()
        assert chosen.row_blocks == _device.cdiv(heads_q // heads_kv * n_queries, chosen.block_m)
        if heads_q == 8 and heads_kv == 1 and not ON_GPU:
            assert chosen.row_blocks == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256, 80, 72, 40, 36, 200, 8, 1])
def test_head_dims_and_dtypes(head_dim, dtype, gen):
    """64, 128 and 256; 80 padded to 128 inside (masked along the head dim); head dims that are no
    multiple of 16: rows of whole 16-byte vectors (72, 40, 200), of 8-byte ones (36), and head dims
    under tl.dot's 16 (8, 1)."""
    inputs = make_inputs(gen, 2, 2, 4, 2, head_dim, [45, 70], dtype=dtype, page_size=16, capacity=80)
    check(inputs, num_splits=2, what=f"D={head_dim} {dtype}")


def test_auto_balances_a_long_and_short_batch(gen):
    """'auto' takes the split path here and gives the long sequence more splits than the short one,
    every split reading whole key blocks."""
    inputs = make_inputs(gen, 3, 1, 4, 2, 64, [900, 40, 0], page_size=64, capacity=960)
    check(inputs, num_splits="auto", what="auto")
    chosen = plan.last_plan()
    assert chosen.path == expected_path("split")
    if TRITON_RUNS:
        assert chosen.num_splits == 0 and chosen.target_splits > 0 and chosen.slots >= 3


def test_uniform_lengths_take_the_direct_path(gen):
    """Without cache_seqlens every sequence has S_max keys; a batch that fills the GPU (the
    interpreter's 4 SMs, or the device's) needs no split."""
    heads_kv = 2
    resident = _device.sm_count(DEVICE) * plan.PROGRAMS_PER_SM
    batch = max(16, -(-plan.DIRECT_MIN_WAVES * resident // heads_kv))
    inputs = make_inputs(gen, batch, 1, 4, heads_kv, 64, [400] * batch, seqlens=False)
    check(inputs, num_splits="auto", what="uniform")
    assert plan.last_plan().path == expected_path("direct")
    if TRITON_RUNS and not ON_GPU:
        # Either rule says so: the batch fills the GPU, or its splits could not be shorter than a
        # wave's share of the keys (the partials' budget against the K/V bytes).
        reason = plan.last_plan().reason
        assert "uniform lengths" in reason or "under two splits" in reason, reason


def test_no_visible_key_gives_zeros_and_minus_inf(gen):
    """Empty sequences, and causal queries beyond a short sequence's keys: zeros and -inf, no NaN,
    in the direct path and in the merge."""
    for num_splits in (1, 3):
        inputs = make_inputs(gen, 3, 4, 4, 2, 64, [0, 2, 0], page_size=16, capacity=48)
        out, lse = check(inputs, causal=True, num_splits=num_splits, what=f"empty splits={num_splits}")
        assert not out.isnan().any() and not lse.isnan().any()
        assert (out[0] == 0).all() and (lse[0] == float("-inf")).all()
        assert (out[1, :2] == 0).all() and (lse[1, :, :2] == float("-inf")).all() and (lse[1, :, 2:] > -1e30).all()


def test_lengths_past_the_cache_are_clamped(gen):
    q, k_cache, v_cache, _, table = make_inputs(gen, 2, 1, 4, 2, 64, [64, 64], page_size=16, capacity=64)
    lens = torch.tensor([1000, -5], dtype=torch.int32, device=DEVICE)
    out, lse = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table, num_splits=2,
                                      return_lse=True)
    ref_out, ref_lse = reference(q, k_cache, v_cache, [64, 0], table, True)
    assert_matches(out, ref_out, torch.bfloat16, "clamped out")
    assert_matches(lse, ref_lse, torch.float32, "clamped lse")


def test_return_lse_false_and_scale(gen):
    inputs = make_inputs(gen, 2, 2, 4, 2, 64, [50, 21], capacity=64)
    q, k_cache, v_cache, lens, _ = inputs
    out = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, num_splits=2)
    assert isinstance(out, torch.Tensor)
    with_lse, _ = check(inputs, num_splits=2, what="default scale")
    assert torch.equal(out, with_lse)
    check(inputs, num_splits=2, scale=0.3, what="scale 0.3")


def test_deterministic(gen):
    inputs = make_inputs(gen, 2, 3, 8, 2, 64, [200, 130], page_size=32, capacity=224)
    q, k_cache, v_cache, lens, table = inputs
    runs = [attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table, num_splits=5,
                                   return_lse=True) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_strided_inputs(gen):
    """q sliced out of a wider tensor, K and V two halves of one (B, S, 2, Hkv, D) cache."""
    batch, heads_q, heads_kv, head_dim = 2, 4, 2, 64
    q_wide = torch.randn((batch, 2, heads_q + 3, head_dim), generator=gen).bfloat16().to(DEVICE)
    kv = torch.randn((batch, 80, 2, heads_kv, head_dim), generator=gen).bfloat16().to(DEVICE)
    q, k_cache, v_cache = q_wide[:, :, 1:1 + heads_q], kv[:, :, 0], kv[:, :, 1]
    lens = torch.tensor([80, 33], dtype=torch.int32, device=DEVICE)
    check((q, k_cache, v_cache, lens, None), num_splits=3, what="strided")


@pytest.mark.parametrize("row_width, vec", [(80, 8), (76, 4), (74, 2), (73, 1)])
def test_strided_head_dim_72(row_width, vec, gen):
    """Head dim 72 in rows of ``row_width`` elements (a cache with room for more): the kernels take
    the strides as known multiples of the largest vector that divides them all (``vec`` bf16
    elements; 1: no hint). The tensors keep some offset from their allocation's start."""
    batch, heads_q, heads_kv, head_dim = 2, 4, 2, 72
    q_wide = torch.randn((batch, 1, heads_q, row_width), generator=gen).bfloat16().to(DEVICE)
    kv = torch.randn((batch, 60, 2, heads_kv, row_width), generator=gen).bfloat16().to(DEVICE)
    q, k_cache, v_cache = q_wide[..., :head_dim], kv[:, :, 0, :, :head_dim], kv[:, :, 1, :, -head_dim:]
    assert vector_width(head_dim, q, k_cache, v_cache) == vec
    lens = torch.tensor([60, 29], dtype=torch.int32, device=DEVICE)
    check((q, k_cache, v_cache, lens, None), num_splits=2, what=f"D72 in rows of {row_width}")


# Compiles the split kernel for sm_90 without a GPU (scripts/probes/kernel_resources.py) at head
# dims whose rows are whole 16-byte vectors but no multiple of 16 elements (bf16).
_VECTOR_PROBE = """
import json, sys, torch
sys.path.insert(0, "scripts/probes")
import kernel_resources as kr
out = []
for case, run in kr.decode_cases(torch.bfloat16, [(1, 32, 8, 32768, 72), (4, 32, 8, 4096, 40)]):
    with kr.recorded_launches(132) as calls:
        run()
    for fn, args, meta in calls:
        if fn.__name__ == "decode_split_kernel":
            usage = kr.resource_usage(fn, args, meta, 90)
            accesses = usage["accesses"]
            narrow = sum(n for (op, width), n in accesses.items() if op.startswith("LDG") and width < 16)
            out.append((case, meta["VEC"], usage["STACK"], narrow, accesses.get(("LDGSTS", 16), 0)))
print(json.dumps(out))
"""


def test_split_kernel_loads_whole_vectors_at_head_dims_off_16():
    """Head dim 72 compiled to 2-byte loads (144 a thread: Triton specializes strides on
    divisibility by 16 alone, so it could not prove a row of 72 bf16 16-byte aligned), 254
    registers and a stack; told the strides are multiples of 8 elements, the split kernel loads q
    16 bytes at a time and K and V through the pipeline's 16-byte asynchronous copies, as at head
    dim 128 (its one narrower load: the sequence's length)."""
    kernels = compiled_for_sm90(_VECTOR_PROBE)
    assert len(kernels) == 2, kernels
    for case, vec, stack, narrow, wide_copies in kernels:
        assert vec == 8 and stack == 0 and narrow <= 1 and wide_copies > 0, (case, vec, stack, narrow, wide_copies)


def test_forward_only(gen):
    q, k_cache, v_cache, lens, _ = make_inputs(gen, 1, 1, 2, 2, 64, [20])
    q.requires_grad_()
    out = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)
    with torch.no_grad():
        assert torch.equal(out.detach(), attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens))
    with pytest.raises(RuntimeError, match="forward-only"):
        out.sum().backward()
    outs, lses = torch.randn(2, 3, 8, requires_grad=True), torch.randn(2, 3)
    merged, _ = merge_attention(outs.to(DEVICE), lses.to(DEVICE))
    with pytest.raises(RuntimeError, match="forward-only"):
        merged.sum().backward()


def test_compile_fullgraph(gen):
    inputs = make_inputs(gen, 2, 3, 4, 2, 64, [60, 17], page_size=16, capacity=64)
    q, k_cache, v_cache, lens, table = inputs

    def step(q, k_cache, v_cache, lens, table):
        out, lse = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table,
                                          num_splits=2, return_lse=True)
        return merge_attention(torch.stack([out, out]), torch.stack([lse.transpose(1, 2)] * 2))

    compiled = torch.compile(step, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    for got, want in zip(compiled(*inputs), step(*inputs)):
        assert torch.equal(got, want)


def test_torch_path_matches_float64(gen):
    """The PyTorch implementation (CPU tensors without the interpreter), run directly with a gather
    block smaller than the sequences so the online rescaling across blocks happens."""
    q, k_cache, v_cache, lens, table = (t.cpu() if t is not None else None for t in
                                        make_inputs(gen, 3, 3, 8, 2, 64, [70, 0, 2], page_size=16, capacity=80))
    old = decode_op.CPU_KEY_BLOCK
    try:
        decode_op.CPU_KEY_BLOCK = 16
        for causal in (True, False):
            out, lse = decode_op.decode_torch(q, k_cache, v_cache, lens, table, causal, 0.125, True)
            ref_out, ref_lse = reference(q, k_cache, v_cache, lens, table, causal, 0.125)
            assert_matches(out, ref_out, torch.bfloat16, f"torch path causal={causal}")
            assert_matches(lse, ref_lse, torch.float32, f"torch path lse causal={causal}")
    finally:
        decode_op.CPU_KEY_BLOCK = old


def test_plan_tables_and_description():
    # The H100's plan for issue 24's first row: splits sized from B, Hkv, the longest possible
    # sequence and the SM count, never from the lengths' values.
    text = plan.explain(1, 32, 8, 1, 128, 131072)
    assert "split" in text and "132 SMs" in text and "decided on the device" in text
    assert "direct" in plan.explain(1, 32, 8, 1, 128, 256)  # too short to split
    paged = plan.decode_plan(64, 32, 8, 1, 128, 4096, 16, torch.bfloat16, True, 0, True, 132, False)
    assert paged.page_lookup == "per key" and paged.block_n == 64 and paged.num_stages == plan.NUM_STAGES["per key"]
    forced = plan.decode_plan(2, 8, 2, 1, 64, 4096, 0, torch.bfloat16, True, 7, True, 132, False)
    assert forced.path == "split" and forced.slots == 14 and "num_splits=7" in forced.describe()
    with _device.override_plan("decode", MIN_SPLIT_KEYS=4096):
        assert plan.explain(1, 32, 8, 1, 128, 4096).splitlines()[1].startswith("  path: direct")


# --------------------------------------------------------------------------------------------
# merge_attention
# --------------------------------------------------------------------------------------------


def partial_attentions(gen, n_parts, dtype, batch=2, heads=3, n_queries=4, head_dim=64):
    """N attentions of the same queries over disjoint key sets, and the attention over their union."""
    q = torch.randn((batch, n_queries, heads, head_dim), generator=gen).to(dtype)
    lengths = [int(torch.randint(1, 40, (1,), generator=gen)) for _ in range(n_parts)]
    k, v = (torch.randn((batch, sum(lengths), heads, head_dim), generator=gen).to(dtype) for _ in range(2))
    outs, lses, start = [], [], 0
    for n in lengths:
        out, lse = reference(q, k[:, start:start + n], v[:, start:start + n], None, None, False)
        outs.append(out.to(dtype))
        lses.append(lse.transpose(1, 2).float())  # (B, Sq, Hq): the rows of out
        start += n
    full, full_lse = reference(q, k, v, None, None, False)
    return outs, lses, full, full_lse.transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("n_parts", [1, 2, 5])
def test_merge_matches_the_union(n_parts, dtype, gen):
    outs, lses, full, full_lse = partial_attentions(gen, n_parts, dtype)
    out, lse = merge_attention(torch.stack(outs).to(DEVICE), torch.stack(lses).to(DEVICE))
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.shape == full.shape
    assert_matches(out, full, dtype, "merged out")
    assert_matches(lse, full_lse, torch.float32, "merged lse")
    from_lists = merge_attention([o.to(DEVICE) for o in outs], [x.to(DEVICE) for x in lses])
    assert torch.equal(from_lists[0], out) and torch.equal(from_lists[1], lse)
    assert plan.last_merge_plan().path == ("triton" if TRITON_RUNS else "torch")


def test_merge_in_several_partial_blocks(gen):
    """More partials than one tile holds: the merge folds them a block at a time."""
    outs, lses, full, full_lse = partial_attentions(gen, 7, torch.float32)
    with _device.override_plan("decode", MERGE_TILE_ELEMENTS=128):
        out, lse = merge_attention(torch.stack(outs).to(DEVICE), torch.stack(lses).to(DEVICE))
        if TRITON_RUNS:
            assert plan.last_merge_plan().block_p < 7
    assert_matches(out, full, torch.float32, "merged out")
    assert_matches(lse, full_lse, torch.float32, "merged lse")


@pytest.mark.parametrize("use_torch", [False, True], ids=["kernel", "torch"])
def test_merge_empty_and_nan(use_torch, gen):
    """-inf partials weigh nothing (their outputs, NaN here, are not read); all-empty rows give
    zeros and -inf; a NaN lse, or NaN in a weighed output, propagates to that row only."""
    merge = (lambda o, x: decode_op.merge_torch(o.cpu(), x.cpu())) if use_torch else merge_attention
    outs = torch.randn((3, 4, 16), generator=gen).to(DEVICE)
    lses = torch.randn((3, 4), generator=gen).to(DEVICE)
    lses[1, 0] = float("-inf")
    outs[1, 0] = float("nan")  # an empty partial's output may hold anything
    lses[:, 1] = float("-inf")  # every partial empty
    outs[:, 1] = float("nan")
    lses[2, 2] = float("nan")  # NaN lse
    outs[0, 3, 5] = float("nan")  # NaN in a partial that has keys
    out, lse = merge(outs, lses)
    keep = torch.tensor([0, 2])
    ref_out, ref_lse = decode_op.merge_torch(outs[keep, :1].cpu().double(), lses[keep, :1].cpu().double())
    assert torch.allclose(out[0].cpu().double(), ref_out[0], atol=1e-5) and not out[0].isnan().any()
    assert abs(lse[0].item() - ref_lse[0].item()) < 1e-5
    assert (out[1] == 0).all() and lse[1].item() == float("-inf")
    assert out[2].isnan().all() and math.isnan(lse[2].item())
    assert out[3, 5].isnan() and not out[3, :5].isnan().any() and not math.isnan(lse[3].item())


def test_merge_minimal_shapes(gen):
    """(N, D) partials (one row) and an empty row set."""
    outs, lses = torch.randn((2, 32), generator=gen).to(DEVICE), torch.randn((2,), generator=gen).to(DEVICE)
    out, lse = merge_attention(outs, lses)
    assert out.shape == (32,) and lse.shape == ()
    assert_matches(lse, torch.logsumexp(lses.double(), 0), torch.float32, "one row lse")
    empty_out, empty_lse = merge_attention(torch.zeros((2, 0, 3, 32), device=DEVICE), torch.zeros((2, 0, 3), device=DEVICE))
    assert empty_out.shape == (0, 3, 32) and empty_lse.shape == (0, 3)


def test_merge_strided_and_half_lse(gen):
    outs, lses, full, full_lse = partial_attentions(gen, 3, torch.bfloat16)
    wide = torch.stack(outs).to(DEVICE).transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous
    out, lse = merge_attention(wide, torch.stack(lses).to(DEVICE).bfloat16())
    assert_matches(out, full, torch.bfloat16, "strided out")
    assert relative_error(lse, full_lse) < 1e-2  # the lses themselves were rounded to bf16


def test_decode_partials_merge_into_the_whole(gen):
    """Two decode calls over the halves of each sequence's keys, merged, give the call over all."""
    q, k_cache, v_cache, _, _ = make_inputs(gen, 2, 1, 4, 2, 64, [96, 96])
    halves = [attention_with_kvcache(q, k_cache[:, part], v_cache[:, part], causal=False, return_lse=True)
              for part in (slice(0, 48), slice(48, 96))]
    out, lse = merge_attention([h[0] for h in halves], [h[1].transpose(1, 2) for h in halves])
    whole, whole_lse = attention_with_kvcache(q, k_cache, v_cache, causal=False, return_lse=True)
    assert_matches(out, whole.double(), torch.bfloat16, "merged halves")
    assert_matches(lse, whole_lse.transpose(1, 2), torch.float32, "merged halves lse")


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def _args(q=(1, 1, 4, 64), cache=(1, 32, 2, 64), dtype=torch.float16, **kwargs):
    return (torch.zeros(q, dtype=dtype), torch.zeros(cache, dtype=dtype), torch.zeros(cache, dtype=dtype)), kwargs


LENS = torch.tensor([8], dtype=torch.int32)
TABLE = torch.zeros((1, 2), dtype=torch.int32)


@pytest.mark.parametrize("args, error, words", [
    (_args(q=(1, 4, 64)), ValueError, "4-D"),
    (_args(cache=(1, 32, 128)), ValueError, "4-D"),
    (_args(dtype=torch.float32), TypeError, "cast"),
    (((torch.zeros(1, 1, 4, 64, dtype=torch.float16), torch.zeros(1, 32, 2, 64, dtype=torch.bfloat16),
       torch.zeros(1, 32, 2, 64, dtype=torch.bfloat16)), {}), TypeError, "share a dtype"),
    (((torch.zeros(1, 1, 4, 64, dtype=torch.float16), torch.zeros(1, 32, 2, 64, dtype=torch.float16),
       torch.zeros(1, 16, 2, 64, dtype=torch.float16)), {}), ValueError, "one shape"),
    (_args(q=(1, 1, 4, 32)), ValueError, "head dims differ"),
    (_args(q=(1, 1, 4, 264), cache=(1, 32, 2, 264)), ValueError, "head dim 264"),
    (_args(q=(1, 1, 4, 0), cache=(1, 32, 2, 0)), ValueError, "head dim 0"),
    (_args(q=(1, 1, 3, 64)), ValueError, "multiple"),
    (_args(q=(2, 1, 4, 64)), ValueError, "one entry per sequence"),
    (_args(cache_seqlens=LENS.long()), TypeError, "int32"),
    (_args(cache_seqlens=torch.tensor([8, 8], dtype=torch.int32)), ValueError, r"shape \(batch,\)"),
    (_args(block_table=TABLE), ValueError, "needs cache_seqlens"),
    (_args(cache=(4, 24, 2, 64), cache_seqlens=LENS, block_table=TABLE), ValueError, "power of two"),
    (_args(cache=(4, 8, 2, 64), cache_seqlens=LENS, block_table=TABLE), ValueError, "power of two >= 16"),
    (_args(cache=(4, 16, 2, 64), cache_seqlens=LENS, block_table=TABLE[0]), ValueError, "max_blocks_per_seq"),
    (_args(cache=(4, 16, 2, 64), cache_seqlens=LENS, block_table=TABLE.float()), TypeError, "int32"),
    (_args(causal="bottom_right"), TypeError, "causal"),
    (_args(scale=-1.0), ValueError, "scale"),
    (_args(scale=float("inf")), ValueError, "scale"),
    (_args(num_splits=0), ValueError, "num_splits"),
    (_args(num_splits="many"), TypeError, "num_splits"),
    (_args(num_splits=2.0), TypeError, "num_splits"),
    ((([1.0],) + _args()[0][1:], {}), TypeError, "torch.Tensor"),
    (((torch.zeros(1, 1, 4, 64, dtype=torch.float16, device="meta"),
       torch.zeros(1, 32, 2, 64, dtype=torch.float16, device="meta"),
       torch.zeros(1, 32, 2, 64, dtype=torch.float16, device="meta")), {}), ValueError, "CUDA and CPU"),
    (_args(cache_seqlens=LENS.to("meta")), ValueError, "one device"),
    (_args(cache_seqlens=[8]), TypeError, "torch.Tensor"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_errors(args, error, words):
    tensors, kwargs = args
    with pytest.raises(error, match=words):
        attention_with_kvcache(*tensors, **kwargs)


def test_checks_are_remembered_only_for_calls_that_passed():
    # The public function checks a signature once; a call that differs from a passing one in any
    # checked respect (a dtype, an option's value or type) is checked again, and fails every time.
    (q, k_cache, v_cache), kwargs = _args(cache_seqlens=LENS)
    attention_with_kvcache(q, k_cache, v_cache, **kwargs)
    signature = decode_op._signature(q, k_cache, v_cache, LENS, None, True, None, "auto")
    assert decode_op._CHECKED.get(signature) == (0.125, 0)
    for bad, error in ((dict(cache_seqlens=LENS.long()), TypeError), (dict(scale=-1.0), ValueError),
                       (dict(causal=1), TypeError), (dict(num_splits=0), ValueError),
                       (dict(scale=torch.tensor(0.5)), TypeError)):
        for _ in range(2):
            with pytest.raises(error):
                attention_with_kvcache(q, k_cache, v_cache, **{**kwargs, **bad})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type")
def test_error_mixed_devices():
    (q, k_cache, v_cache), _ = _args()
    with pytest.raises(ValueError, match="one device"):
        attention_with_kvcache(q.cuda(), k_cache, v_cache)


@pytest.mark.parametrize("outs, lses, error, words", [
    (torch.zeros(2, 3, 8), torch.zeros(2, 4), ValueError, "without its last dim"),
    (torch.zeros(0, 3, 8), torch.zeros(0, 3), ValueError, "at least one"),
    (torch.zeros(8), torch.zeros(()), ValueError, "at least one"),
    ([], [], ValueError, "empty"),
    ([torch.zeros(3, 8), torch.zeros(4, 8)], [torch.zeros(3), torch.zeros(4)], ValueError, "share one shape"),
    (torch.zeros(2, 3, 8, dtype=torch.float64), torch.zeros(2, 3), TypeError, "float64"),
    (torch.zeros(2, 3, 8), torch.zeros(2, 3, dtype=torch.int64), TypeError, "int64"),
    ("outs", torch.zeros(2, 3), TypeError, "torch.Tensor"),
])
def test_merge_errors(outs, lses, error, words):
    with pytest.raises(error, match=words):
        merge_attention(outs, lses)


# --------------------------------------------------------------------------------------------
# GPU only
# --------------------------------------------------------------------------------------------


@gpu_only
@pytest.mark.parametrize("page_size", [0, 16, 64])
def test_cuda_graph_replay(page_size, gen):
    """Captured once, replayed with new lengths and new cache contents: no host read of the
    lengths, no allocation that depends on them. On Hopper the merge is launched programmatically
    dependent, scheduled while the split kernel runs; without its wait the contiguous case fails."""
    batch, capacity = 4, 4096
    q, k_cache, v_cache, lens, table = make_inputs(gen, batch, 2, 32, 8, 128, [capacity] * batch,
                                                   page_size=page_size, capacity=capacity)
    attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)  # compile outside
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)
    torch.cuda.current_stream().wait_stream(stream)
    for new_lens in ([4096, 1, 0, 2500], [17, 4000, 64, 3333]):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=gen).to(q.dtype))
        graph.replay()
        torch.cuda.synchronize()
        expected = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)
        assert torch.equal(out, expected)
        assert_matches(out, reference(q, k_cache, v_cache, lens.tolist(), table, True)[0], torch.bfloat16,
                       f"graph replay {new_lens}")


@gpu_only
@pytest.mark.parametrize("n_queries", [1, 4])
@pytest.mark.parametrize("page_size", [0, 16, 64])
def test_realistic_sizes_gpu(page_size, n_queries, gen):
    """B 4, Hq/Hkv 32/8, D 128, lengths up to 32K: the plan's full-size tiles. Within twice the
    error of the same math in bf16 torch (both against float64), as flash-attention's tests judge."""
    lens = [32768, 1, 17000, 4095]
    q, k_cache, v_cache, cache_seqlens, table = make_inputs(gen, 4, n_queries, 32, 8, 128, lens,
                                                            page_size=page_size, capacity=32768)
    out, lse = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=table,
                                      return_lse=True)
    ref_out, ref_lse = reference(q, k_cache, v_cache, lens, table, True)
    bf16_out = torch.zeros_like(q)
    for b, n in enumerate(lens):  # the same attention in bf16 torch: scores and softmax in bf16
        k = gathered(k_cache, table, b, n).repeat_interleave(4, 1).transpose(0, 1)
        v = gathered(v_cache, table, b, n).repeat_interleave(4, 1).transpose(0, 1)
        mask = torch.arange(n, device=DEVICE)[None, :] <= n - n_queries + torch.arange(n_queries, device=DEVICE)[:, None]
        bf16_out[b] = torch.nn.functional.scaled_dot_product_attention(
            q[b].transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1).nan_to_num()  # rows without keys: 0
    assert plan.last_plan().path == "split"
    assert relative_error(out, ref_out) <= 2 * relative_error(bf16_out, ref_out) + 1e-3
    assert_matches(lse, ref_lse, torch.float32, "lse")


@gpu_only
@pytest.mark.slow
@pytest.mark.parametrize("num_splits", ["auto", 1])
@pytest.mark.parametrize("page_size", [0, 256], ids=["contiguous", "page256"])
def test_more_than_2_31_elements(page_size, num_splits, gen):
    """K and V caches of 5 x 2^20 x 4 x 128 bf16 (more than 2^31 elements each): the last
    sequence's keys all sit past 2^31; paged, the same memory with the pages in reverse order, so
    the first sequence reads them."""
    batch, capacity, heads_q, heads_kv, head_dim = 5, 2**20, 8, 4, 128
    cuda_gen = torch.Generator(device="cuda").manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    k_cache, v_cache = (torch.randn((batch, capacity, heads_kv, head_dim), device="cuda", generator=cuda_gen,
                                    dtype=torch.bfloat16) for _ in range(2))
    assert k_cache.numel() > 2**31
    q = torch.randn((batch, 1, heads_q, head_dim), device="cuda", generator=cuda_gen, dtype=torch.bfloat16)
    lens = [capacity, 3000, capacity - 77, 1, capacity]
    table = None
    if page_size:
        k_cache, v_cache = (c.view(-1, page_size, heads_kv, head_dim) for c in (k_cache, v_cache))
        table = torch.arange(k_cache.shape[0], device="cuda", dtype=torch.int32).flip(0).view(batch, -1)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=table,
                                      num_splits=num_splits, return_lse=True)
    assert not out.isnan().any() and not lse.isnan().any()
    for b in (0, 2, batch - 1):  # (paged: the first reads the pages past 2^31; contiguous: the last)
        rows = slice(b, b + 1)
        caches = (k_cache, v_cache) if page_size else (k_cache[rows], v_cache[rows])
        ref_out, ref_lse = reference(q[rows], *caches, lens[rows], None if table is None else table[rows], True)
        assert_matches(out[rows], ref_out, torch.bfloat16, f"sequence {b} out")
        assert_matches(lse[rows], ref_lse, torch.float32, f"sequence {b} lse")
