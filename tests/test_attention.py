"""attention: outputs, log-sum-exp and gradients against float64 and SDPA, both load paths forced.

CI runs the Triton kernels under TRITON_INTERPRET=1 at small sizes (the interpreter uses blocks
of 16 and 32, so lengths like 17, 37, 50 and 130 cross several blocks and end mid-block); the GPU
runs the same tests on CUDA tensors plus the long lengths and every head dim at full size.
"""

from __future__ import annotations

import math

import pytest
import torch

import onlinesoftmax
from onlinesoftmax import cpu
from onlinesoftmax.bench import attention_suite
from onlinesoftmax.ops.attention import explain as attention_explain, launch as attention_module, op as attention_op, plan

from conftest import (DEVICE, ON_GPU, TOLERANCE, TRITON_RUNS, assert_matches, gpu_only, make_logits,
                      needs_triton, relative_error)

attention = onlinesoftmax.attention
MODES = ("none", "top_left", "bottom_right")
CAUSAL_ARG = {"none": False, "top_left": "top_left", "bottom_right": "bottom_right"}


def reference(q, k, v, mode, scale=None):
    """float64 (out, lse) from the full score matrix; rows without visible keys give 0 and -inf."""
    q, k, v = q.double(), k.double(), v.double()
    n_queries, n_keys, head_dim = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    seen = torch.ones(n_queries, n_keys, dtype=torch.bool, device=q.device)
    if mode != "none":
        offset = n_keys - n_queries if mode == "bottom_right" else 0
        seen = torch.arange(n_keys, device=q.device)[None, :] <= torch.arange(n_queries, device=q.device)[:, None] + offset
    has_keys = seen.any(-1)[:, None]
    # All-masked rows get finite dummy scores, then zero weight: no NaN in the values or gradients.
    s = torch.where(has_keys, s.masked_fill(~seen, float("-inf")), 0.0)
    p = torch.softmax(s, -1) * has_keys
    lse = torch.where(has_keys[:, 0], torch.logsumexp(s, -1), float("-inf"))
    return p @ v, lse


def make_qkv(gen, batch, heads_q, heads_kv, n_queries, n_keys, head_dim, dtype, requires_grad=False):
    q = make_logits((batch, heads_q, n_queries, head_dim), dtype, gen, scale=1.0, outliers=False)
    k = make_logits((batch, heads_kv, n_keys, head_dim), dtype, gen, scale=1.0, outliers=False)
    v = make_logits((batch, heads_kv, n_keys, head_dim), dtype, gen, scale=1.0, outliers=False)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def reference_grads(q, k, v, d_out, mode, scale=None):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, _ = reference(*leaves, mode, scale)
    out.backward(d_out.double())
    return [t.grad for t in leaves]


def force_descriptor(monkeypatch, plan_override, use_descriptor: bool):
    monkeypatch.setattr(attention_module, "descriptor_ok", lambda *tensors: use_descriptor)
    # Where the layout allows it, the plan still picks per kernel (the forward prefers pointer
    # loads on the H100); forcing descriptors on covers every kernel's TMA path.
    plan_override("attention", ATTENTION_USE_DESCRIPTOR=dict.fromkeys(plan.ATTENTION_USE_DESCRIPTOR, True),
                  ATTENTION_BACKWARD_POINTER_MAX_WORK=0)


def expected_path():
    return "triton" if TRITON_RUNS else "torch"


def check_all(q, k, v, mode, dtype, what, gen, scale=None):
    """Forward, lse and gradients of the public function against float64."""
    out, lse = attention(q, k, v, causal=CAUSAL_ARG[mode], scale=scale, return_lse=True)
    ref_out, ref_lse = reference(q, k, v, mode, scale)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_matches(out, ref_out, dtype, f"{what} out")
    # The lse never passes through the half-precision output: it is held to the fp32 tolerance.
    assert_matches(lse, ref_lse, torch.float32, f"{what} lse")
    d_out = torch.randn(out.shape, generator=gen).to(dtype=dtype, device=out.device)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), d_out)
    for name, got, ref in zip("qkv", (dq, dk, dv), reference_grads(q, k, v, d_out, mode, scale)):
        assert_grad_matches(got, ref, dtype, f"{what} d{name}")


def assert_grad_matches(got, ref, dtype, what):
    # A query that sees a single key has P = 1 and dq = 0 exactly; a relative error means nothing
    # there, so such gradients are held to an absolute bound of the dtype's tolerance.
    if ref.norm() == 0:
        assert got.float().abs().max().item() <= TOLERANCE[dtype], f"{what}: expected zeros"
    else:
        assert_matches(got, ref, dtype, what)


# (batch, Hq, Hkv, Sq, Sk, D): why each is here.
SHAPES = {
    "self-17": (1, 2, 2, 17, 17, 32),  # odd length, shorter than one key block's worth of rows
    "gqa-37x50": (1, 4, 2, 37, 50, 64),  # GQA group 2, Sq < Sk, both end mid-block
    "mqa-50x37": (2, 3, 1, 50, 37, 32),  # MQA, Sq > Sk: bottom-right leaves 13 rows with no key
    "decode-1x40": (1, 2, 2, 1, 40, 64),  # one query (decoding): top-left sees 1 key, bottom-right all
    "len-130": (1, 1, 1, 130, 130, 32),  # several query and key blocks, 130 = 4 * 32 + 2
}


@pytest.mark.parametrize("dtype, use_descriptor", [(torch.bfloat16, True), (torch.float16, False)],
                         ids=["bf16-descriptor", "fp16-pointer"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_matches_float64(shape, mode, dtype, use_descriptor, gen, monkeypatch, plan_override):
    force_descriptor(monkeypatch, plan_override, use_descriptor)
    q, k, v = make_qkv(gen, *SHAPES[shape], dtype, requires_grad=True)
    check_all(q, k, v, mode, dtype, f"{shape} {mode}", gen)
    chosen = plan.last_attention_plan()
    assert chosen.path == expected_path()
    if TRITON_RUNS:
        # A short row that reads through pointers keeps them on the GPU (D32 causal up to 1024 keys).
        short = (chosen.kernel == "backward_dkdv" and ON_GPU
                 and plan.short_config(chosen.kernel, SHAPES[shape][5], mode != "none", max(SHAPES[shape][3:5])))
        pointers = bool(short) and short[4:] == ("pointer",)
        assert chosen.use_descriptor == (use_descriptor and not pointers)
        assert chosen.kernel == expected_backward(SHAPES[shape])


def expected_backward(shape) -> str:
    """The backward kernel the tables give a (batch, Hq, Hkv, Sq, Sk, D) shape: fused where a row
    of its head dim's bound takes its length and programs (the interpreter's own limit under it)."""
    batch, _, heads_kv, n_queries, n_keys, head_dim = shape
    bound = min((r[0] for r in plan.ATTENTION_BACKWARD_FUSED if head_dim <= r[0]), default=None)
    rows = [r[1:3] for r in plan.ATTENTION_BACKWARD_FUSED if r[0] == bound]
    if not ON_GPU and bound is not None:
        rows = [plan.ATTENTION_INTERPRETER_CONFIGS["backward_fused"][:2]]
    fits = any(max(n_queries, n_keys) <= most and (not programs or batch * heads_kv <= programs)
               for most, programs in rows)
    return "backward_fused" if fits else "backward_dkdv"


FUSED_SHAPES = [name for name, shape in SHAPES.items() if expected_backward(shape) == "backward_fused"]


@pytest.mark.parametrize("use_descriptor", [True, False], ids=["descriptor", "pointer"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", FUSED_SHAPES)
def test_fused_and_split_backward_agree(shape, mode, use_descriptor, gen, monkeypatch, plan_override):
    """Where the fused backward runs by default, the split one (forced) gives the same gradients
    within rounding, and both match float64 (test_matches_float64 checks the default in both dtypes)."""
    force_descriptor(monkeypatch, plan_override, use_descriptor)
    q, k, v = make_qkv(gen, *SHAPES[shape], torch.bfloat16, requires_grad=True)
    out = attention(q, k, v, causal=CAUSAL_ARG[mode])
    d_out = torch.randn(out.shape, generator=gen).to(dtype=out.dtype, device=out.device)
    fused = torch.autograd.grad(out, (q, k, v), d_out)
    assert plan.last_attention_plan().kernel == ("backward_fused" if TRITON_RUNS else "backward_dkdv")
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_FUSED=()):
        out = attention(q, k, v, causal=CAUSAL_ARG[mode])
        split = torch.autograd.grad(out, (q, k, v), d_out)
        assert plan.last_attention_plan().kernel == "backward_dkdv"
    for name, a, b, ref in zip("qkv", fused, split, reference_grads(q, k, v, d_out, mode)):
        assert_grad_matches(a, ref, torch.bfloat16, f"{shape} {mode} fused d{name}")
        assert_grad_matches(b, ref, torch.bfloat16, f"{shape} {mode} split d{name}")
        assert_grad_matches(a, b.double(), torch.bfloat16, f"{shape} {mode} fused against split d{name}")


# (batch, Hq, Hkv, Sq, Sk, D) for the forward's row-descriptor paths. Key counts are multiples of
# every BLOCK_N (the interpreter's 32, the GPU's 128) where the warp-specialized loop must run;
# query counts end mid-block, so the last query block reads the next head's rows (and the tensor's
# end), which must never reach the output.
ROW_SHAPES = {
    "ws-gqa-40x256": (2, 4, 2, 40, 256, 64),
    "ws-mha-130x128": (1, 3, 3, 130, 128, 128),
    "rows-tail-40x200": (2, 2, 1, 40, 200, 64),  # keys end mid-block: rows only for whole blocks
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(ROW_SHAPES), ids=list(ROW_SHAPES))
def test_forward_row_descriptors(shape, mode, gen, plan_override):
    """The forward's 2-D row descriptors, and its warp-specialized single loop (forced at every
    head dim and for causal masks too) where the keys fill whole blocks; the interpreter runs the
    same code unspecialized."""
    config = plan.ATTENTION_FORWARD_WARP_SPECIALIZED[128][0]  # the GPU's; the interpreter keeps its own blocks
    plan_override("attention", ATTENTION_FORWARD_WARP_SPECIALIZED={64: (config, config), 128: (config, config)},
                  ATTENTION_SHORT_CONFIGS=dict.fromkeys(plan.ATTENTION_SHORT_CONFIGS, ()))  # short shapes, the tables' paths
    q, k, v = make_qkv(gen, *ROW_SHAPES[shape], torch.bfloat16, requires_grad=True)
    out, lse = attention(q, k, v, causal=CAUSAL_ARG[mode], return_lse=True)
    chosen = plan.last_attention_plan()
    ref_out, ref_lse = reference(q, k, v, mode)
    assert_matches(out, ref_out, torch.bfloat16, f"{shape} {mode} out")
    assert_matches(lse, ref_lse, torch.float32, f"{shape} {mode} lse")
    if TRITON_RUNS:
        assert chosen.kernel == "forward" and chosen.row_descriptors
        assert chosen.warp_specialize == shape.startswith("ws"), chosen


def test_row_descriptors_need_merged_heads(gen):
    """A (B, S, H, D) tensor seen as (B, H, S, D) has no rows of whole heads: no row descriptors."""
    q, k, v = make_qkv(gen, 1, 2, 2, 16, 64, 64, torch.bfloat16)
    assert attention_module.rows_ok(q, k, v)
    transposed = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not attention_module.rows_ok(transposed)
    out = attention(transposed, k, v)
    assert not plan.last_attention_plan().row_descriptors
    assert_matches(out, reference(q, k, v, "none")[0], torch.bfloat16, "transposed q")


def test_single_row_views_keep_their_head_stride(gen):
    """A one-query (or one-key) head viewed from (B, S, H, D): its row stride is H * D while heads
    are D apart, so rows of heads do not follow each other and the row descriptors must not be used."""
    # Head dim 128 and 128 keys: where the layout allows, the warp-specialized forward (Q by rows).
    q, k, v = make_qkv(gen, 2, 4, 2, 1, 128, 128, torch.bfloat16)
    q_view = torch.empty(2, 1, 4, 128, dtype=q.dtype, device=q.device).transpose(1, 2).copy_(q)
    assert q_view.stride() == (512, 128, 512, 1) and not attention_module.rows_ok(q_view)
    k_one = torch.empty(2, 1, 2, 128, dtype=k.dtype, device=k.device).transpose(1, 2).copy_(k[:, :, :1])
    assert not attention_module.rows_ok(k_one)
    for mode in MODES:
        assert_matches(attention(q_view, k, v, causal=CAUSAL_ARG[mode]), reference(q, k, v, mode)[0],
                       torch.bfloat16, f"one query, {mode}")
        assert_matches(attention(q_view, k_one, k_one, causal=CAUSAL_ARG[mode]), reference(q, k_one, k_one, mode)[0],
                       torch.bfloat16, f"one key, {mode}")


# Head dims off the tuned ones, as models have them (Stable Diffusion's 40 and 160, 72, 112), below
# the tensor cores' depth of 16 (8), off the 16-byte rows TMA needs (36: pointer loads), and the
# untuned ones the forward splits (48, 144), and 176, a multiple of 16 whose parts (128 + 64) run past it.
UNTUNED_HEAD_DIMS = (8, 36, 40, 48, 72, 112, 144, 160, 176)
# The forward's parts where a head dim is two powers of two (plan.head_dim_parts), or from 65 up
# runs past them with rows of whole 16-byte vectors (72 and 176, contiguous); the rest are padded.
FORWARD_PARTS = {72: (64, 16), 80: (64, 16), 96: (64, 32), 144: (128, 16), 160: (128, 32), 176: (128, 64),
                 192: (128, 64)}
# ... and the backward's dK/dV and dQ kernels', above 128 (plan.ATTENTION_BACKWARD_SPLIT_HEAD_DIMS).
BACKWARD_PARTS = {144: (128, 16), 160: (128, 32), 176: (128, 64), 192: (128, 64)}


@pytest.mark.parametrize("head_dim", attention_op.TUNED_HEAD_DIMS + UNTUNED_HEAD_DIMS)
def test_every_head_dim(head_dim, gen):
    # Split dims: the forward computes them in two parts, the backward those above 128 too; the
    # rest pad to the next power of two (at least 16) with the padding masked.
    q, k, v = make_qkv(gen, 1, 2, 1, 20, 23, head_dim, torch.bfloat16, requires_grad=True)
    check_all(q, k, v, "top_left", torch.bfloat16, f"D={head_dim}", gen)
    if TRITON_RUNS:
        padded = plan.padded_head_dim(head_dim)
        backward = plan.last_attention_plan()
        assert (backward.block_d, backward.block_d2) == BACKWARD_PARTS.get(head_dim, (padded, 0))
        with torch.no_grad():
            attention(q, k, v)
        forward = plan.last_attention_plan()
        assert (forward.block_d, forward.block_d2) == FORWARD_PARTS.get(head_dim, (padded, 0))
        assert ("computed as" in forward.describe()) == (head_dim in FORWARD_PARTS)


def _views_of_rows(gen, head_dim, row_length, transpose, offset=0, heads=(4, 2), lengths=(37, 50)):
    """q, k, v of head dim ``head_dim`` as columns [offset, offset + head_dim) of rows ``row_length``
    long, in BHSD or (transpose) BSHD order; ``heads`` (Hq, Hkv), ``lengths`` (Sq, Sk), batch 2."""
    def one(n_heads, n):
        shape = (2, n, n_heads, row_length) if transpose else (2, n_heads, n, row_length)
        wide = make_logits(shape, torch.bfloat16, gen, scale=1.0, outliers=False)[..., offset:offset + head_dim]
        return (wide.transpose(1, 2) if transpose else wide).requires_grad_()
    return one(heads[0], lengths[0]), one(heads[1], lengths[1]), one(heads[1], lengths[1])


@pytest.mark.parametrize("head_dim, row_length, transpose, vec", [
    (40, 40, False, 8), (40, 40, True, 8), (40, 44, False, 4), (40, 42, True, 2), (72, 72, False, 8),
    (8, 8, False, 8), (36, 36, False, 4), (33, 33, False, 1), (48, 48, False, 1), (40, 48, False, 8),
    (44, 48, False, 4), (44, 48, True, 4)])
def test_head_dims_of_whole_vectors(head_dim, row_length, transpose, vec, gen):
    """A head dim that is no multiple of 16 elements reaches the kernels with the vector width its
    rows and strides allow (VEC, kernels.on_vectors, which rounds every stride down to VEC's
    multiple: given a stride that is not one, addresses go wrong, which the comparison catches).
    Rows of 48 under a head dim of 44: 16-byte strides, but outputs whose rows are not, which the
    kernels must not write through TMA descriptors (the interpreter asserts on such a descriptor)."""
    q, k, v = _views_of_rows(gen, head_dim, row_length, transpose)
    assert attention_module.vector_width(head_dim, q, k, v) == vec
    if head_dim * 2 % 16:
        assert not attention_module.descriptor_ok(q, k, v)
    for mode in MODES:
        check_all(q, k, v, mode, torch.bfloat16, f"D{head_dim} rows of {row_length} {mode}", gen)


@pytest.mark.parametrize("row_length, offset, splits", [(176, 0, True), (192, 16, True), (184, 0, False),
                                                       (192, 1, False)])
def test_multiple_of_16_past_its_parts(row_length, offset, splits, gen):
    """Head dim 176 (128 + 64, 16 columns past it) is a multiple of 16: VEC stays 1 and the
    compiler learns its rows are whole 16-byte vectors from Triton's specialization of the head dim
    and strides, so the kernels split it where every stride is a multiple of 16 elements and every
    pointer 16-byte aligned (rows of 176 or 192, at column 0 or 16), and pad it where not (rows of
    184: stride 184; column 1: a pointer 2 bytes off)."""
    q, k, v = _views_of_rows(gen, 176, row_length, False, offset, lengths=(21, 30))
    assert attention_module.vector_width(176, q, k, v) == 1
    assert attention_module.rows_of_whole_vectors(176, 1, q, k, v) == splits
    parts = plan.head_dim_parts(176) if splits else (256, 0)
    for mode in MODES:
        check_all(q, k, v, mode, torch.bfloat16, f"D176 rows of {row_length} at column {offset} {mode}", gen)
        if TRITON_RUNS:
            backward = plan.last_attention_plan()
            assert (backward.block_d, backward.block_d2) == parts, backward.describe()
            with torch.no_grad():
                attention(q, k, v, causal=CAUSAL_ARG[mode])
            forward = plan.last_attention_plan()
            assert (forward.block_d, forward.block_d2) == parts, forward.describe()


def test_random_head_dims_and_layouts(gen):
    """Shapes no list names: head dims drawn from 8-256, rows up to 16 elements wider than the head
    dim at an offset, BHSD or BSHD, GQA, a mask each; forward and gradients against float64 (the
    vector width, the split and the TMA checks all follow from the layout). Drawn from the test's
    printed seed."""
    draw = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))

    def pick(options):
        return options[int(torch.randint(0, len(options), (1,), generator=draw))]

    for case in range(8):
        # Half of them odd multiples of 8 (rows of whole 16-byte vectors that are no multiple of 16
        # elements: the vector width and the split from 65 up hang on those).
        head_dim = pick([int(torch.randint(8, 257, (1,), generator=draw)), 8 * pick(range(1, 32, 2))])
        width, offset = head_dim + pick([0, 0, 4, 8, 16]), pick([0, 0, 8])
        transpose, heads, mode = pick([False, True]), pick([(2, 2), (4, 1)]), pick(MODES)
        lengths = tuple(int(torch.randint(1, 40, (1,), generator=draw)) for _ in range(2))
        q, k, v = _views_of_rows(gen, head_dim, width + offset, transpose, offset, heads, lengths)
        what = (f"case {case}: D{head_dim} at column {offset} of rows of {width + offset}, "
                f"{'BSHD' if transpose else 'BHSD'}, H{heads[0]}/{heads[1]}, {lengths[0]}x{lengths[1]}, {mode}")
        check_all(q, k, v, mode, torch.bfloat16, what, gen)


# (batch, Hq, Hkv, Sq, Sk) at the split head dims: GQA, lengths ending mid-block, keys filling whole blocks.
SPLIT_SHAPES = {"gqa-37x50": (2, 4, 2, 37, 50), "rows-40x64": (2, 2, 1, 40, 64)}


def split_cases(head_dims, loads, pointer_dims, whole_block_dims):
    """(shape, head dim, loads) of the split tests: every head dim through every descriptor path on
    the GQA shape that ends mid-block, and through pointer loads at ``pointer_dims``; the shape of
    whole key blocks through the descriptors at ``whole_block_dims`` (its pointer loads are the GQA
    shape's, without the masked tail). Every part shape runs each kernel at least once a load path;
    the interpreter's time (CI's budget) decides the rest."""
    return ([("gqa-37x50", d, path) for d in head_dims for path in loads
             if path != "pointer" or d in pointer_dims]
            + [("rows-40x64", d, path) for d in whole_block_dims for path in loads if path != "pointer"])


# Parts (64, 16) past the head dim at 72 (80 fills the same parts), (64, 32) at 96, (128, 16) at
# 144, (128, 64) at 192.
SPLIT_FORWARD_CASES = split_cases((72, 96, 144, 192), ("pointer", "head-descriptors", "row-descriptors"),
                                  pointer_dims=(72, 96, 144, 192), whole_block_dims=(96, 192))


@pytest.mark.parametrize("shape, head_dim, loads", SPLIT_FORWARD_CASES, ids=["-".join(map(str, c)) for c in SPLIT_FORWARD_CASES])
def test_split_head_dim_forward(shape, head_dim, loads, gen, monkeypatch, plan_override):
    """The forward's two head-dim parts through each load path, every mask, against float64 and
    against the padded computation of the same inputs; the gradients of its output under one mask
    (test_split_head_dim_backward runs the backward's parts under every mask)."""
    # The layout checks are replaced before the override, which forgets the calls prepared under the real ones.
    if loads == "pointer":
        monkeypatch.setattr(attention_module, "descriptor_ok", lambda *tensors: False)
    if loads == "head-descriptors":
        monkeypatch.setattr(attention_module, "heads_follow_rows", lambda *tensors: False)
    plan_override("attention", ATTENTION_USE_DESCRIPTOR=dict.fromkeys(plan.ATTENTION_USE_DESCRIPTOR, True),
                  ATTENTION_SHORT_CONFIGS=dict.fromkeys(plan.ATTENTION_SHORT_CONFIGS, ()),
                  ATTENTION_BACKWARD_POINTER_MAX_WORK=0)
    q, k, v = make_qkv(gen, *SPLIT_SHAPES[shape], head_dim, torch.bfloat16, requires_grad=True)
    d_out = make_logits(q.shape, torch.bfloat16, gen, scale=1.0, outliers=False)
    for mode in MODES:
        what = f"{shape} D{head_dim} {loads} {mode}"
        out, lse = attention(q, k, v, causal=CAUSAL_ARG[mode], return_lse=True)
        forward = plan.last_attention_plan()
        ref_out, ref_lse = reference(q, k, v, mode)
        assert_matches(out, ref_out, torch.bfloat16, f"{what} out")
        assert_matches(lse, ref_lse, torch.float32, f"{what} lse")
        if mode == "bottom_right":
            grads = torch.autograd.grad(out, (q, k, v), d_out)
            for name, got, want in zip("qkv", grads, reference_grads(q, k, v, d_out, mode)):
                assert_grad_matches(got, want, torch.bfloat16, f"{what} d{name}")
        if TRITON_RUNS:
            assert forward.block_d2 > 0 and forward.use_descriptor == (loads != "pointer")
            # On the GPU rows of a head dim that is no multiple of 16 go through pointers.
            assert forward.row_descriptors == (loads == "row-descriptors" and (
                not ON_GPU or head_dim % plan.ATTENTION_FORWARD_ROW_DESCRIPTORS_DIVISOR == 0))
    if TRITON_RUNS:
        split = attention(q, k, v, causal=True)
        with onlinesoftmax.override_plan("attention", ATTENTION_FORWARD_SPLIT_HEAD_DIMS=(),
                                         ATTENTION_FORWARD_SPLIT_VECTORS_FROM=attention_op.MAX_HEAD_DIM + 1):
            padded = attention(q, k, v, causal=True)
            assert plan.last_attention_plan().block_d2 == 0
        assert_matches(split, padded.double(), torch.bfloat16, "split against padded")


# Parts (64, 16) past the head dim at 72, (64, 32) at 96, (128, 16) past it at 136 (144's parts),
# (128, 32) at 160, (128, 64) at 192.
SPLIT_BACKWARD_CASES = split_cases((72, 96, 136, 160, 192), ("pointer", "descriptors"),
                                   pointer_dims=(72, 136, 192), whole_block_dims=(96, 160))


@pytest.mark.parametrize("shape, head_dim, loads", SPLIT_BACKWARD_CASES,
                         ids=["-".join(map(str, c)) for c in SPLIT_BACKWARD_CASES])
def test_split_head_dim_backward(shape, head_dim, loads, gen, monkeypatch, plan_override):
    """The dK/dV and dQ kernels' two head-dim parts through both load paths, every mask: gradients
    against float64, and under one mask against the padded backward of the same inputs. The split is forced where
    the plan pads (72 = 64 + 16 and 96 = 64 + 32 measured slower split) to run the kernels' every
    part shape; 136 (128 + 16, 8 columns past it) splits for its rows of whole 16-byte vectors."""
    if loads == "pointer":
        monkeypatch.setattr(attention_module, "descriptor_ok", lambda *tensors: False)
    plan_override("attention", ATTENTION_USE_DESCRIPTOR=dict.fromkeys(plan.ATTENTION_USE_DESCRIPTOR, True),
                  ATTENTION_SHORT_CONFIGS=dict.fromkeys(plan.ATTENTION_SHORT_CONFIGS, ()), ATTENTION_BACKWARD_FUSED=(),
                  ATTENTION_BACKWARD_POINTER_MAX_WORK=0,
                  ATTENTION_BACKWARD_SPLIT_HEAD_DIMS=dict.fromkeys(("backward_dkdv", "backward_dq"), (96, 144, 160, 192)),
                  ATTENTION_BACKWARD_SPLIT_VECTORS_FROM=dict.fromkeys(("backward_dkdv", "backward_dq"), 65))
    q, k, v = make_qkv(gen, *SPLIT_SHAPES[shape], head_dim, torch.bfloat16, requires_grad=True)
    d_out = make_logits(q.shape, torch.bfloat16, gen, scale=1.0, outliers=False)
    for mode in MODES:
        what = f"{shape} D{head_dim} {loads} {mode}"
        out = attention(q, k, v, causal=CAUSAL_ARG[mode])
        grads = torch.autograd.grad(out, (q, k, v), d_out)
        backward = plan.last_attention_plan()
        for name, got, want in zip("qkv", grads, reference_grads(q, k, v, d_out, mode)):
            assert_grad_matches(got, want, torch.bfloat16, f"{what} d{name}")
        if TRITON_RUNS:
            assert backward.kernel == "backward_dkdv" and backward.use_descriptor == (loads != "pointer")
            assert (backward.block_d, backward.block_d2) == plan.head_dim_parts(head_dim), what
            if mode != "bottom_right":
                continue
            with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_SPLIT_HEAD_DIMS=dict.fromkeys(
                    ("backward_dkdv", "backward_dq"), ()), ATTENTION_BACKWARD_SPLIT_VECTORS_FROM=dict.fromkeys(
                    ("backward_dkdv", "backward_dq"), attention_op.MAX_HEAD_DIM + 1)):
                padded = torch.autograd.grad(attention(q, k, v, causal=CAUSAL_ARG[mode]), (q, k, v), d_out)
                assert plan.last_attention_plan().block_d2 == 0
            for name, got, want in zip("qkv", grads, padded):
                assert_matches(got, want.double(), torch.bfloat16, f"{what} d{name} split against padded")


@pytest.mark.parametrize("n_queries, n_keys", [(20, 33), (33, 20), (24, 24)])
def test_causal_true_is_sdpa_is_causal(n_queries, n_keys, gen):
    """causal=True is SDPA's is_causal (top-left) for any Sq, Sk; bottom-right is its tril shifted by Sk - Sq."""
    q, k, v = make_qkv(gen, 2, 4, 2, n_queries, n_keys, 64, torch.float16)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    qd, kd, vd = q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
    assert_matches(attention(q, k, v, causal=True), sdpa(qd, kd, vd, is_causal=True), torch.float16, "top_left")
    assert_matches(attention(q, k, v, causal="top_left"), sdpa(qd, kd, vd, is_causal=True), torch.float16, "top_left")
    if n_queries <= n_keys:  # SDPA gives NaN rows where bottom-right leaves a row no key
        tril = torch.ones(n_queries, n_keys, dtype=torch.bool, device=q.device).tril(n_keys - n_queries)
        assert_matches(attention(q, k, v, causal="bottom_right"), sdpa(qd, kd, vd, attn_mask=tril), torch.float16,
                       "bottom_right")
    assert_matches(attention(q, k, v), sdpa(qd, kd, vd), torch.float16, "non-causal")


def test_scale_argument(gen):
    q, k, v = make_qkv(gen, 1, 2, 2, 19, 21, 32, torch.float16, requires_grad=True)
    check_all(q, k, v, "none", torch.float16, "scale=0.3", gen, scale=0.3)


def test_rows_without_keys_are_zero(gen):
    """Bottom-right with Sq > Sk leaves the first Sq - Sk rows no key: output 0, lse -inf, zero dq."""
    q, k, v = make_qkv(gen, 1, 2, 2, 40, 9, 32, torch.bfloat16, requires_grad=True)
    out, lse = attention(q, k, v, causal="bottom_right", return_lse=True)
    assert torch.equal(out[:, :, :31].float().cpu(), torch.zeros(1, 2, 31, 32))
    assert torch.isneginf(lse[:, :, :31]).all() and torch.isfinite(lse[:, :, 31:]).all()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert torch.equal(dq[:, :, :31].float().cpu(), torch.zeros(1, 2, 31, 32))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


def test_zero_keys_and_empty(gen):
    q, k, v = make_qkv(gen, 1, 2, 1, 5, 0, 64, torch.float16, requires_grad=True)
    out, lse = attention(q, k, v, return_lse=True)
    assert torch.equal(out.float().cpu(), torch.zeros(1, 2, 5, 64)) and torch.isneginf(lse).all()
    (dq,) = torch.autograd.grad(out, (q,), torch.ones_like(out))
    assert torch.equal(dq.float().cpu(), torch.zeros(1, 2, 5, 64))
    q, k, v = make_qkv(gen, 0, 2, 1, 5, 7, 64, torch.float16)
    assert attention(q, k, v).shape == (0, 2, 5, 64)
    q, k, v = make_qkv(gen, 1, 2, 1, 0, 7, 64, torch.float16)
    assert attention(q, k, v, causal=True).shape == (1, 2, 0, 64)


@pytest.mark.parametrize("layout", ["bshd-transposed", "head-dim-strided"])
def test_strided_inputs(layout, gen):
    """A (B, S, H, D) buffer viewed as (B, H, S, D) is read in place through pointer loads (its batch and
    head dims do not merge into one TMA dim); so is a head dim with stride 2."""
    q, k, v = make_qkv(gen, 2, 4, 2, 21, 29, 32, torch.bfloat16)
    if layout == "bshd-transposed":
        views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    else:
        views = []
        for t in (q, k, v):
            big = torch.zeros(*t.shape[:3], 2 * t.shape[3], dtype=t.dtype, device=t.device)
            big[..., ::2] = t
            views.append(big[..., ::2])
    views = [t.requires_grad_() for t in views]
    check_all(*views, "top_left", torch.bfloat16, layout, gen)
    assert not attention_module.descriptor_ok(*views)
    assert attention_module.descriptor_ok(q, k, v)
    if TRITON_RUNS:
        assert not plan.last_attention_plan().use_descriptor


# (batch, Hq, Hkv, Sq, Sk, mode, programs an SM asked for): MQA (group 4) and GQA (group 3) past
# the fused backward's lengths, ending mid-block. 0: the whole group a program; 1 << 20: more than
# any split gives, every head its own program; 2: between (the interpreter's 4 SMs split MQA's
# group of 4 in two).
GROUP_SPLIT_CASES = {"mqa-whole-group": (1, 4, 1, 130, 70, "bottom_right", 0),
                     "mqa-two-per-sm": (1, 4, 1, 70, 130, "top_left", 2),
                     "mqa-every-head": (1, 4, 1, 97, 130, "none", 1 << 20),
                     "gqa-every-head": (1, 6, 2, 70, 130, "top_left", 1 << 20)}


@needs_triton
@pytest.mark.parametrize("case", list(GROUP_SPLIT_CASES), ids=list(GROUP_SPLIT_CASES))
def test_dkdv_group_split(case, gen, plan_override):
    # The dK/dV kernel's GQA group shared by several programs, each summing its slice of the query
    # heads into float32 partials: against float64, and bit for bit the same on a second call.
    batch, heads_q, heads_kv, n_queries, n_keys, mode, per_sm = GROUP_SPLIT_CASES[case]
    # Split wherever the programs fall short of per_sm an SM (the plan's lower bound lifted).
    plan_override("attention", ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS=(per_sm, per_sm),
                  ATTENTION_BACKWARD_GROUP_SPLIT_BELOW=1 << 20)
    q, k, v = make_qkv(gen, batch, heads_q, heads_kv, n_queries, n_keys, 64, torch.bfloat16, requires_grad=True)
    check_all(q, k, v, mode, torch.bfloat16, case, gen)
    chosen = plan.last_attention_plan()
    assert chosen.kernel == "backward_dkdv"
    group = heads_q // heads_kv
    programs = -(-n_keys // chosen.block_n) * batch * heads_kv
    assert chosen.group_split == plan.dkdv_group_split(group, programs, mode != "none", q.device,
                                                       n_queries=n_queries, block_d=chosen.block_d,
                                                       blocks=chosen.blocks)
    assert chosen.group_split == {0: 1, 1 << 20: group}.get(per_sm, chosen.group_split)
    if TRITON_RUNS and not ON_GPU and per_sm == 2:
        assert chosen.group_split == 2
    d_out = torch.randn(q.shape, generator=gen).to(torch.bfloat16).to(DEVICE)
    first = torch.autograd.grad(attention(q, k, v, causal=CAUSAL_ARG[mode]), (k, v), d_out)
    second = torch.autograd.grad(attention(q, k, v, causal=CAUSAL_ARG[mode]), (k, v), d_out)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@needs_triton
def test_backward_heavy_first_grid(gen, plan_override):
    # Both causal backward kernels on the grid with every head's heaviest block first (axes
    # swapped), the dK/dV kernel's group split over every head (the partials' rows): against the
    # float64 reference. (The default plan takes the order for the dK/dV kernel of causal GQA, which
    # the GQA cases of the other tests run; the dQ kernel's is this test's alone.) 150 keys: past the
    # fused backward's one block, on the GPU's tables too.
    plan_override("attention", ATTENTION_BACKWARD_HEAVY_FIRST={"backward_dkdv": 1, "backward_dq": 1},
                  ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS=(1 << 20, 1 << 20),
                  ATTENTION_BACKWARD_GROUP_SPLIT_BELOW=1 << 20)
    q, k, v = make_qkv(gen, 2, 4, 1, 70, 150, 64, torch.bfloat16, requires_grad=True)
    check_all(q, k, v, "bottom_right", torch.bfloat16, "heavy first", gen)
    chosen = plan.last_attention_plan()
    assert chosen.kernel == "backward_dkdv" and chosen.heavy_first and chosen.group_split == 4


def test_backward_heavy_first_plan():
    # The dK/dV kernel's order for causal GQA only (the default table); the dQ kernel's for none;
    # never without a mask or past the grid's 65535 blocks on its second axis.
    assert plan.backward_heavy_first("backward_dkdv", True, 4, 100)
    assert not plan.backward_heavy_first("backward_dkdv", True, 1, 100)  # MHA
    assert not plan.backward_heavy_first("backward_dkdv", False, 4, 100)
    assert not plan.backward_heavy_first("backward_dkdv", True, 4, 65536)
    assert not plan.backward_heavy_first("backward_dq", True, 8, 100)
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_HEAVY_FIRST={"backward_dq": 1}):
        assert plan.backward_heavy_first("backward_dq", True, 1, 100)
        assert not plan.backward_heavy_first("backward_dkdv", True, 4, 100)


def test_dkdv_group_split_plan():
    # Split only below ..._BELOW programs an SM; then the smallest divisor of the group that reaches
    # ..._PROGRAMS an SM (causal asks for its own count), else the whole group.
    sms = onlinesoftmax._device.sm_count(DEVICE)
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_GROUP_SPLIT_BELOW=1,
                                     ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS=(2, 4)):
        assert plan.dkdv_group_split(1, 1, False, DEVICE) == 1  # MHA: nothing to share
        assert plan.dkdv_group_split(8, sms, True, DEVICE) == 1  # an SM's worth already
        assert plan.dkdv_group_split(8, sms - 1, False, DEVICE) == 4  # 2 of 8 fall short of 2 an SM
        assert plan.dkdv_group_split(6, -(-2 * sms // 3), False, DEVICE) == 3
        assert plan.dkdv_group_split(8, -(-sms // 2), True, DEVICE) == 8  # causal: 4 an SM
        assert plan.dkdv_group_split(7, 1, False, DEVICE) == 7  # no divisor reaches it: every head its own
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_GROUP_SPLIT_BELOW=4):
        assert plan.dkdv_group_split(8, 2 * sms, False, DEVICE) == 2  # (4, 8) an SM: 2 of 8 reach 4
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_GROUP_SPLIT_PROGRAMS=(0, 0)):
        assert plan.dkdv_group_split(16, 1, True, DEVICE) == 1


def test_dkdv_wave_split_plan():
    # Past one program an SM, long calls split their group where a model of the dK/dV kernel's time
    # gains: non-causal, its waves of programs (the divisor with the fewest a split, if it saves 8%);
    # causal, the heaviest program's path against the work spread over the slots (every head, if 34%).
    def split(group, programs, causal=False, n_queries=6432, block_d=64, blocks=101):
        return plan.dkdv_group_split(group, programs, causal, DEVICE, 132, n_queries, block_d, blocks)
    # B1 H28/4 S6432 D48 (404 programs, 396 slots at 3 an SM): 2 waves whole, 8 of a seventh split 7 ways.
    assert split(7, 404) == 7
    assert split(7, 396) == 1  # one full wave
    # Within one wave the SMs count: 256 programs are two an SM split or not; 144 leave 12 SMs two
    # (B1 H28/4 S2276 D72), split 7 ways 8 programs on the busiest SMs, a seventh each.
    assert split(8, 256, block_d=128, blocks=64) == 1
    assert split(7, 144, block_d=128, blocks=36, n_queries=2276) == 7
    assert split(7, 404, n_queries=2047) == 1  # short rows: the partials would cost more
    assert split(8, 512, blocks=128) == 8  # 512 programs: 2 waves whole, 11 of an eighth (1.375)
    assert split(4, 376, block_d=128, blocks=47) == 2  # 2 an SM: 2 waves whole, 3 of a half
    assert split(8, 1024, block_d=128, blocks=128) == 1  # 3.9 waves: full enough
    assert split(8, 2784, blocks=58) == 1  # 7.03 waves: past ATTENTION_BACKWARD_WAVE_SPLIT_WAVES
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_WAVE_SPLIT_WAVES=8):
        assert split(8, 2784, blocks=58) == 8  # 8 waves whole, 57 of an eighth
    assert split(7, 404, block_d=80) == 1  # no programs-an-SM entry: no waves to count
    # Causal: 4 KV heads of 101 key blocks, a group of 7: the first block's 707 units against 364
    # spread over the slots; every head its own program, 101.
    assert split(7, 404, causal=True) == 7
    assert split(8, 632, causal=True, blocks=79) == 1  # B1 H64/8 S5000 D64: 511 spread against 632
    assert split(8, 256, causal=True, block_d=128, blocks=64) == 8  # B2 H16/2 S4096 D128: 252 against 512
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_WAVE_SPLIT_COST=(0.5, 0.52)):
        assert split(7, 404) == 1  # 8/7 waves against 2: 0.57, above the cost asked
        assert split(7, 404, causal=True) == 7  # 364 / 707 = 0.515
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_WAVE_SPLIT_COST=(0.5, 0.5)):
        assert split(7, 404, causal=True) == 1


def test_backward_is_deterministic(gen):
    # GQA with a group of 3: dK and dV sum over three query heads, in a fixed order, without atomics.
    q, k, v = make_qkv(gen, 1, 6, 2, 45, 45, 32, torch.bfloat16, requires_grad=True)
    d_out = torch.randn(1, 6, 45, 32, generator=gen).to(torch.bfloat16).to(DEVICE)
    first = torch.autograd.grad(attention(q, k, v, causal=True), (q, k, v), d_out)
    second = torch.autograd.grad(attention(q, k, v, causal=True), (q, k, v), d_out)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@gpu_only
def test_override_plan_launches_its_own_kernels(gen):
    # A call signature first run under the default tables, then under other block sizes: the second
    # must launch kernels compiled for its own plan. (Keyed by the signature alone, it launched the
    # first plan's kernels on the second plan's grids, and the rows those left unwritten kept the
    # pooled outputs of the call before: the other inputs' results here.)
    q, k, v = make_qkv(gen, 2, 4, 4, 256, 256, 64, torch.bfloat16, requires_grad=True)
    d_out = torch.randn(q.shape, generator=gen).to(torch.bfloat16).to(DEVICE)
    torch.autograd.grad(attention(q * 2, k, v, causal=True), (q, k, v), d_out)
    default = {kernel: plan.attention_plan(kernel, 64, torch.bfloat16, True, q.device, 256, 256, True)
               for kernel in plan.ATTENTION_KERNELS}
    other = {"forward": (128, 64, 4, 2), "backward_dkdv": (64, 128, 8, 2), "backward_dq": (128, 64, 8, 2)}
    assert all((default[kernel].block_m, default[kernel].block_n) != other[kernel][:2] for kernel in other)
    tables = dict(plan.ATTENTION_CONFIGS, **{kernel: ((1 << 30, config, config),) for kernel, config in other.items()})
    with onlinesoftmax.override_plan("attention", ATTENTION_CONFIGS=tables, ATTENTION_FORWARD_WARP_SPECIALIZED={},
                                     ATTENTION_SHORT_CONFIGS=dict.fromkeys(plan.ATTENTION_SHORT_CONFIGS, ())):
        out = attention(q, k, v, causal=True)
        assert plan.last_attention_plan().block_m == other["forward"][0]
        grads = torch.autograd.grad(out, (q, k, v), d_out)
        assert plan.last_attention_plan().block_n == other["backward_dkdv"][1]
    ref_out, _ = reference(q, k, v, "top_left")
    assert_matches(out, ref_out, torch.bfloat16, "out under other tables")
    for name, got, want in zip("qkv", grads, reference_grads(q, k, v, d_out, "top_left")):
        assert_matches(got, want, torch.bfloat16, f"d{name} under other tables")


def test_register_caps_reach_gpu_plans_only(monkeypatch):
    # The GPU's plans carry each cap to Triton as maxnreg; the interpreter's carry none.
    assert plan.ATTENTION_MAX_REGISTERS
    for (kernel, block_d, causal), cap in plan.ATTENTION_MAX_REGISTERS.items():
        monkeypatch.setattr(plan, "interpreter_active", lambda: False)
        on_gpu = plan.attention_plan(kernel, block_d, torch.bfloat16, causal, torch.device("cuda"), 4096, 4096, True)
        other = plan.attention_plan(kernel, block_d, torch.bfloat16, not causal, torch.device("cuda"), 4096, 4096, True)
        assert on_gpu.compile_options == {"maxnreg": cap} and f"at most {cap} registers" in on_gpu.describe()
        assert other.max_registers == plan.ATTENTION_MAX_REGISTERS.get((kernel, block_d, not causal), 0)
        monkeypatch.setattr(plan, "interpreter_active", lambda: True)
        interpreted = plan.attention_plan(kernel, block_d, torch.bfloat16, causal, torch.device("cpu"), 4096, 4096, True)
        assert interpreted.compile_options == {}


def test_split_backward_plans(monkeypatch):
    """The backward splits the head dims of plan.ATTENTION_BACKWARD_SPLIT_HEAD_DIMS, and from
    ATTENTION_BACKWARD_SPLIT_VECTORS_FROM those of whole 16-byte vectors, on the rows of their own
    head dim; and its dK/dV kernel never runs a split loop at one stage on the GPU, which Triton 3.6
    compiles to an out-of-bounds shared read (a one-stage table row is raised to two)."""
    monkeypatch.setattr(plan, "interpreter_active", lambda: False)
    cuda = torch.device("cuda")
    for kernel in ("backward_dkdv", "backward_dq"):
        for head_dim, whole_vectors, parts in ((160, False, (128, 32)), (152, True, (128, 32)), (136, False, (256, 0)),
                                               (112, False, (128, 0)), (256, False, (256, 0)),
                                               (136, True, (128, 16))):
            chosen = plan.attention_plan(kernel, head_dim, torch.bfloat16, True, cuda, 4096, 4096, True,
                                         whole_vectors=whole_vectors)
            assert (chosen.block_d, chosen.block_d2) == parts, (kernel, head_dim, whole_vectors)
            row = next(r for r in plan.ATTENTION_CONFIGS[kernel] if (head_dim if parts[1] else parts[0]) <= r[0])
            own = None if parts[1] else plan.ATTENTION_HEAD_DIM_CONFIGS.get(kernel, {}).get(head_dim)
            expected = own[1] if own else row[2]  # a padded head dim measured on its own: its own config
            assert (chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages) == expected, (kernel, head_dim)
    # A padded head dim measured on its own takes its own config (ATTENTION_HEAD_DIM_CONFIGS).
    for kernel, configs in plan.ATTENTION_HEAD_DIM_CONFIGS.items():
        for head_dim, own in configs.items():
            for causal in (False, True):
                chosen = plan.attention_plan(kernel, head_dim, torch.bfloat16, causal, cuda, 4096, 4096, True)
                assert (chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages) == own[causal]
    one_stage = dict(plan.ATTENTION_CONFIGS, backward_dkdv=((256, (32, 64, 4, 1), (32, 64, 4, 1)),))
    with onlinesoftmax.override_plan("attention", ATTENTION_CONFIGS=one_stage):
        assert plan.attention_plan("backward_dkdv", 160, torch.bfloat16, False, cuda, 4096, 4096, True).num_stages == 2
        assert plan.attention_plan("backward_dkdv", 256, torch.bfloat16, False, cuda, 4096, 4096, True).num_stages == 1


def test_forward_keys_ending_mid_block_by_loads(monkeypatch):
    # Head dims padded to 128, non-causal, keys ending mid-block (no warp-specialized loop): the 128
    # row's config with row descriptors, the pointer table's where the layout allows none; whole
    # key blocks stay warp-specialized, causal rows keep the 128 row's causal config.
    monkeypatch.setattr(plan, "interpreter_active", lambda: False)
    cuda = torch.device("cuda")

    def config(head_dim, causal, n_keys, rows_ok):
        chosen = plan.attention_plan("forward", head_dim, torch.bfloat16, causal, cuda, n_keys, n_keys, True, rows_ok)
        return (chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages), chosen

    row = next(r for r in plan.ATTENTION_CONFIGS["forward"] if r[0] == 128)
    for head_dim in (112, 128):
        tiles, chosen = config(head_dim, False, 541, True)
        assert tiles == row[1] and chosen.row_descriptors and not chosen.warp_specialize
        tiles, chosen = config(head_dim, False, 541, False)
        assert tiles == plan.ATTENTION_FORWARD_POINTER_CONFIGS[128][0] != row[1] and not chosen.row_descriptors
        assert config(head_dim, True, 541, True)[0] == row[2]
    assert config(128, False, 1024, True)[1].warp_specialize


def test_kernels_of_few_programs_take_smaller_query_blocks(monkeypatch):
    # ATTENTION_FEW_PROGRAMS: where a kernel's 128-query blocks leave at most `most` programs an SM,
    # the forward at split head dims and the dQ kernel take 64-query blocks on 4 warps (the key
    # block and stages kept); more programs, other head dims, a mask without a row, short rows and a
    # plan without its batch x query heads keep the tables' config.
    monkeypatch.setattr(plan, "interpreter_active", lambda: False)
    cuda = torch.device("cuda")

    def tiles(kernel, head_dim, causal, query_heads, n_queries=2195, sms=132):
        chosen = plan.attention_plan(kernel, head_dim, torch.bfloat16, causal, cuda, n_queries, n_queries, True,
                                     kernel == "forward", whole_vectors=True, query_heads=query_heads, sms=sms)
        return chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages

    def smaller(config):
        return (64, config[1], 4, config[3])

    rows = {(kernel, causal): {d: most for mask, dims, most in table if mask == causal for d in dims}
            for kernel, table in plan.ATTENTION_FEW_PROGRAMS.items() for causal in (False, True)}
    forward = next(r for r in plan.ATTENTION_CONFIGS["forward"] if r[0] == 96)
    dq = next(r for r in plan.ATTENTION_CONFIGS["backward_dq"] if r[0] == 128)
    assert 96 not in rows["forward", False] and rows["forward", True][72] > rows["forward", True][96]
    for kernel, head_dim, causal, table in (("forward", 72, True, forward[2]), ("forward", 80, True, forward[2]),
                                            ("forward", 96, True, forward[2]), ("forward", 72, False, forward[1]),
                                            ("backward_dq", 72, True, dq[2]), ("backward_dq", 128, False, dq[1])):
        most = rows[kernel, causal][head_dim]
        assert tiles(kernel, head_dim, causal, 8) == smaller(table) != table
        # 18 query blocks a head: `most` programs an SM, then one program more
        assert tiles(kernel, head_dim, causal, most * 132 // 18) == smaller(table)
        assert tiles(kernel, head_dim, causal, most * 132 // 18 + 1) == table
        assert tiles(kernel, head_dim, causal, None) == table
        with onlinesoftmax.override_plan("attention", ATTENTION_FEW_PROGRAMS={}):
            assert tiles(kernel, head_dim, causal, 8) == table
    assert tiles("forward", 96, False, 8) == forward[1]
    assert tiles("forward", 128, True, 8)[0] == 128 and tiles("forward", 256, True, 8)[0] == 128
    short = plan.short_config("backward_dq", 128, True, 2048)
    assert short is not None and tiles("backward_dq", 128, True, 8, n_queries=2048) == short[:4]


def test_short_sequences_take_their_own_configs(monkeypatch):
    # ATTENTION_SHORT_CONFIGS rows apply up to their length (keys for the forward, the longer of
    # queries and keys for the backward) and at their head dim only, with the forward's loads;
    # an entry of None leaves its mask to the tables.
    monkeypatch.setattr(plan, "interpreter_active", lambda: False)
    short = {"forward": ((512, 64, (128, 64, 4, 2, "ws"), (128, 64, 4, 2, "pointer")),),
             "backward_dkdv": ((256, 64, (64, 128, 8, 2), (64, 128, 8, 1)),),
             "backward_dq": ((256, 64, None, (128, 64, 8, 2)),)}  # None: the tables
    cuda = torch.device("cuda")
    with onlinesoftmax.override_plan("attention", ATTENTION_SHORT_CONFIGS=short):
        ws = plan.attention_plan("forward", 64, torch.bfloat16, False, cuda, 4096, 512, True, True)
        assert (ws.block_m, ws.block_n, ws.num_warps, ws.warp_specialize) == (128, 64, 4, True)
        ragged = plan.attention_plan("forward", 64, torch.bfloat16, False, cuda, 4096, 500, True, True)
        assert (ragged.block_m, ragged.warp_specialize, ragged.row_descriptors) == (128, False, True)
        pointer = plan.attention_plan("forward", 64, torch.bfloat16, True, cuda, 512, 512, True, True)
        assert (pointer.block_m, pointer.row_descriptors, pointer.warp_specialize) == (128, False, False)
        dkdv = plan.attention_plan("backward_dkdv", 64, torch.bfloat16, True, cuda, 200, 256, True)
        assert (dkdv.block_m, dkdv.block_n, dkdv.num_stages) == (64, 128, 1)
        for kernel, head_dim, n_queries, n_keys in (("forward", 64, 128, 513), ("forward", 128, 128, 128),
                                                    ("backward_dkdv", 64, 257, 128), ("backward_dq", 64, 128, 128)):
            chosen = plan.attention_plan(kernel, head_dim, torch.bfloat16, False, cuda, n_queries, n_keys, True)
            row = next(r for r in plan.ATTENTION_CONFIGS[kernel] if head_dim <= r[0])
            # (rows_ok is False here: a forward through pointers takes its own table's config where it has one)
            pointer = plan.ATTENTION_FORWARD_POINTER_CONFIGS.get(row[0], (None,))[0] if kernel == "forward" else None
            assert (chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages) == (pointer or row[1])
    # A backward row's "pointer" turns the descriptors off up to its length and mask, unless the
    # caller forced the load path (batch_heads None); work far above ATTENTION_BACKWARD_POINTER_MAX_WORK.
    pointer_rows = dict.fromkeys(plan.ATTENTION_SHORT_CONFIGS, ())
    pointer_rows["backward_dkdv"] = ((256, 80, (64, 32, 4, 2, "pointer"), None),)
    with onlinesoftmax.override_plan("attention", ATTENTION_SHORT_CONFIGS=pointer_rows):
        for causal, length, batch_heads, descriptors in ((False, 256, 1 << 20, False), (False, 256, None, True),
                                                          (True, 256, 1 << 20, True), (False, 257, 1 << 20, True)):
            chosen = plan.attention_plan("backward_dkdv", 80, torch.bfloat16, causal, cuda, length, length, True,
                                         batch_heads=batch_heads)
            assert chosen.use_descriptor == descriptors, (causal, length, batch_heads)
            assert ((chosen.block_m, chosen.block_n) == (64, 32)) == (not causal and length == 256)


def test_padded_head_dims_read_their_padded_dims_short_rows():
    # A head dim padded whole (40 to 64, 24 to 32) without rows of its own takes its padded dim's
    # short rows; one with rows of its own (80's forward), one split in two parts, and any with
    # ATTENTION_SHORT_CONFIGS_PADDED off do not.
    rows = {"forward": ((512, 64, (64, 32, 4, 3, "pointer"), None), (512, 80, None, (16, 16, 4, 1))),
            "backward_dkdv": ((128, 32, (32, 64, 4, 2, "pointer"), None),), "backward_dq": ()}
    with onlinesoftmax.override_plan("attention", ATTENTION_SHORT_CONFIGS=rows):
        assert plan.short_config("forward", 40, False, 233) == (64, 32, 4, 3, "pointer")
        assert plan.short_config("forward", 64, False, 233) == (64, 32, 4, 3, "pointer")
        assert plan.short_config("forward", 40, False, 513) is None
        assert plan.short_config("forward", 40, True, 233) is None  # the padded dim's row has no causal config
        assert plan.short_config("backward_dkdv", 24, False, 128) == (32, 64, 4, 2, "pointer")
        assert plan.short_config("forward", 40, False, 233, split=True) is None
        assert plan.short_config("forward", 80, False, 233) is None  # 80's own row (causal only), not 128's
        assert plan.short_config("forward", 80, True, 233) == (16, 16, 4, 1)
        chosen = plan.attention_plan("forward", 40, torch.bfloat16, False, torch.device("cuda"), 233, 233, False,
                                     interpreting=False)
        assert (chosen.block_m, chosen.block_n, chosen.use_descriptor) == (64, 32, False)
    with onlinesoftmax.override_plan("attention", ATTENTION_SHORT_CONFIGS=rows, ATTENTION_SHORT_CONFIGS_PADDED=False):
        assert plan.short_config("forward", 40, False, 233) is None
        assert plan.short_config("forward", 64, False, 233) == (64, 32, 4, 3, "pointer")


# (batch, query heads, KV heads, queries, keys, head dim): groups of 2 and 4, queries beyond and
# below the keys (bottom-right rows that see no key), keys that end mid-block, a padded head dim.
KV_STATIONARY_SHAPES = ((2, 4, 2, 13, 13, 32), (1, 8, 2, 20, 9, 16), (2, 8, 2, 5, 30, 32), (1, 4, 1, 17, 17, 24))


@pytest.mark.skipif(not TRITON_RUNS, reason="the Triton kernels (interpreter or GPU)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", KV_STATIONARY_SHAPES, ids=["x".join(map(str, s)) for s in KV_STATIONARY_SHAPES])
@pytest.mark.parametrize("per_sm", [1, 4], ids=["few_slots", "many_slots"])
def test_kv_stationary_forward(shape, per_sm, dtype, gen, plan_override):
    """The forward with one program a KV head, or its tiles over several (ATTENTION_FORWARD_KV_STATIONARY,
    here taking every short GQA call; ``per_sm`` programs an SM of the interpreter's 4 set the
    split, and with many the causal tiles take the keys in two halves, skipping the second where
    their rows end before it), against float64 in every mask, on (B, S, H, D) views; the backward
    of its out and lse (the split kernels, unchanged) under one mask."""
    batch, heads_q, heads_kv, n_queries, n_keys, head_dim = shape
    halves = per_sm > 1
    plan_override("attention", ATTENTION_FORWARD_KV_STATIONARY=(
        (32, 1, dict.fromkeys((16, 24, 32), per_sm), (2, 2), 0, (16, 4, 2, False), (16, 4, 2, halves), False),))
    tiles = heads_q // heads_kv * -(-n_queries // 16)
    split = plan.kv_stationary_split(batch * heads_kv, tiles, per_sm * onlinesoftmax._device.sm_count(DEVICE))
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
               for t in make_qkv(gen, batch, heads_q, heads_kv, n_queries, n_keys, head_dim, dtype))
    d_out = make_logits(q.shape, dtype, gen, scale=1.0, outliers=False)
    for mode in MODES:
        what = f"{shape} {mode}"
        out, lse = attention(q, k, v, causal=CAUSAL_ARG[mode], return_lse=True)
        chosen = plan.last_attention_plan()
        assert chosen.kv_stationary and chosen.block_d == (32 if head_dim == 24 else head_dim), what
        assert chosen.group_split == split and (split > 1 or per_sm == 1), what
        assert chosen.key_halves == (halves and mode != "none" and n_keys > 16), what
        ref_out, ref_lse = reference(q, k, v, mode)
        assert_matches(out, ref_out, dtype, f"{what} out")
        assert_matches(lse, ref_lse, torch.float32, f"{what} lse")
        if mode == "bottom_right":
            grads = torch.autograd.grad(out, (q, k, v), d_out)
            for name, got, want in zip("qkv", grads, reference_grads(q, k, v, d_out, mode)):
                assert_grad_matches(got, want, dtype, f"{what} d{name}")


@gpu_only
@pytest.mark.parametrize("n_keys, head_dim", [(128, 128), (100, 64), (126, 256)])
@pytest.mark.parametrize("kv_heads", ["fewest", "one_wave"])
def test_kv_stationary_at_its_sizes_gpu(n_keys, head_dim, kv_heads, gen):
    """The committed table's rows on the GPU, every mask: just enough KV heads for them (each one's
    tiles over several programs, at head dims 64 and 128) and as many as the SMs hold at once (one
    program each, the wave model's choice there)."""
    row = next(row for row in plan.ATTENTION_FORWARD_KV_STATIONARY if head_dim in row[2])
    sms = onlinesoftmax._device.sm_count(DEVICE)
    batch = math.ceil(row[4] * sms / 8) if kv_heads == "fewest" else row[2][head_dim] * sms // 8
    q, k, v = make_qkv(gen, batch, 32, 8, n_keys, n_keys, head_dim, torch.bfloat16)
    for mode in MODES:
        out, lse = attention(q, k, v, causal=CAUSAL_ARG[mode], return_lse=True)
        chosen = plan.last_attention_plan()
        # (head dim 256: one program an SM, 4 tiles a KV head, which the model keeps whole)
        split = kv_heads == "fewest" and head_dim < 256
        assert chosen.kv_stationary and (chosen.group_split > 1) == split, (mode, chosen)
        ref_out, ref_lse = reference(q, k, v, mode)
        assert_matches(out, ref_out, torch.bfloat16, f"B{batch} S{n_keys} D{head_dim} {mode} out")
        assert_matches(lse, ref_lse, torch.float32, f"B{batch} S{n_keys} D{head_dim} {mode} lse")


@gpu_only
@pytest.mark.parametrize("n_keys", [128, 129, 206, 320, 321])
@pytest.mark.parametrize("heads", [(3, 3), (4, 2)], ids=["mha", "gqa2"])
def test_head_dim_256_short_rows_gpu(heads, n_keys, gen):
    """Head dim 256 over 129-320 keys runs its short row (128 x 32 blocks through pointers), 128 and
    321 keys the tables' forward; every mask, forward, lse and gradients against float64."""
    q, k, v = make_qkv(gen, 2, *heads, n_keys, n_keys, 256, torch.bfloat16, requires_grad=True)
    short = 128 < n_keys <= 320
    for mode in MODES:
        with torch.no_grad():
            attention(q, k, v, causal=CAUSAL_ARG[mode])
        chosen = plan.last_attention_plan()
        assert chosen.kernel == "forward" and ((chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages)
                                               == (128, 32, 8, 3)) == short, (mode, chosen)
        assert not (short and (chosen.row_descriptors or chosen.use_descriptor)), (mode, chosen)
        check_all(q, k, v, mode, torch.bfloat16, f"S{n_keys} D256 {heads} {mode}", gen)


@gpu_only
@pytest.mark.parametrize("n_keys", [600, 1024, 1025])
@pytest.mark.parametrize("head_dim", [176, 192])
def test_head_dims_176_192_causal_short_rows_gpu(head_dim, n_keys, gen):
    """Head dims 176 and 192 causal up to 1024 keys keep the short rows' forward (64 x 32 blocks
    through pointers), non-causal past 512 and causal past 1024 the tables'; every mask, forward,
    lse and gradients against float64 (GQA group 2)."""
    q, k, v = make_qkv(gen, 1, 4, 2, n_keys, n_keys, head_dim, torch.bfloat16, requires_grad=True)
    for mode in MODES:
        with torch.no_grad():
            attention(q, k, v, causal=CAUSAL_ARG[mode])
        chosen = plan.last_attention_plan()
        short = mode != "none" and n_keys <= 1024
        assert chosen.kernel == "forward" and ((chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages)
                                               == (64, 32, 4, 3)) == short, (mode, chosen)
        assert not (short and (chosen.row_descriptors or chosen.use_descriptor)), (mode, chosen)
        check_all(q, k, v, mode, torch.bfloat16, f"S{n_keys} D{head_dim} {mode}", gen)


@gpu_only
@pytest.mark.parametrize("mode", ["none", "top_left"])
def test_dkdv_wave_split_gpu(mode, gen):
    """The dK/dV group split the plan takes past one program an SM (ATTENTION_BACKWARD_WAVE_SPLIT_*)
    on long GQA rows at a head dim padded to 64: gradients against float64, bit for bit again."""
    sms = onlinesoftmax._device.sm_count(DEVICE)
    # 2048 queries, 32 key blocks a KV head: a KV head's programs more than the slots hold (a second wave).
    heads_kv = plan.ATTENTION_BACKWARD_DKDV_PER_SM[64] * sms // 32 + 1
    q, k, v = make_qkv(gen, 1, 7 * heads_kv, heads_kv, 2048, 2048, 48, torch.bfloat16, requires_grad=True)
    check_all(q, k, v, mode, torch.bfloat16, f"H{7 * heads_kv}/{heads_kv} S2048 D48 {mode}", gen)
    chosen = plan.last_attention_plan()
    assert chosen.kernel == "backward_dkdv" and chosen.group_split == 7, chosen
    d_out = torch.randn(q.shape, generator=gen).to(torch.bfloat16).to(DEVICE)
    first = torch.autograd.grad(attention(q, k, v, causal=CAUSAL_ARG[mode]), (k, v), d_out)
    second = torch.autograd.grad(attention(q, k, v, causal=CAUSAL_ARG[mode]), (k, v), d_out)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_kv_stationary_plan():
    # Grouped-query forwards of 65-128 keys and at most 128 queries at head dims 64 and 128 (groups
    # of 2 or more, causal 4) and 256 (groups of 4), with at least 0.9 KV heads an SM (119 on 132
    # SMs), their tiles split over programs where KV heads are few; anything else keeps the tables' plan.
    cuda = torch.device("cuda")

    def stationary(keys=128, head_dim=128, group=4, kv_heads=2048, queries=128, causal=False, tables_specialized=False):
        return plan.kv_stationary_plan(head_dim, torch.bfloat16, causal, cuda, queries, keys, group, kv_heads, sms=132,
                                       tables_specialized=tables_specialized)

    chosen = stationary()
    assert (chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages) == (64, 128, 4, 2)
    assert stationary(keys=65).block_n == 128 and stationary(head_dim=64).block_d == 64
    assert stationary(queries=1).block_m == 64
    assert stationary(group=2) is not None and stationary(group=2, causal=True) is None
    assert stationary(head_dim=256).block_m == 128 and stationary(head_dim=256, group=2) is None
    assert stationary(causal=True).key_halves and not chosen.key_halves
    assert stationary(head_dim=256, causal=True).block_m == 128 and not stationary(head_dim=256, causal=True).key_halves
    assert stationary(tables_specialized=True) is not None and stationary(head_dim=256, tables_specialized=True) is None
    for off in (dict(keys=129), dict(keys=64), dict(head_dim=96), dict(group=1), dict(kv_heads=118), dict(queries=129)):
        assert stationary(**off) is None, off
    # The measured splits (B x 32/8 heads at S128 D128: 8 tiles a KV head, two programs an SM).
    for batch, split in ((16, 2), (32, 1), (48, 2), (60, 1), (256, 1)):
        assert stationary(kv_heads=batch * 8).group_split == split, batch
    assert stationary(kv_heads=2048, group=2).group_split == 1
    assert stationary(kv_heads=2048, head_dim=64).group_split == 1 and stationary(kv_heads=128, head_dim=64).group_split == 3
    assert "one program a KV head" in attention_explain.explain(256, 32, 8, 128, 128, 128)
    assert "2 programs a KV head" in attention_explain.explain(16, 32, 8, 128, 128, 128)


def test_short_rows_of_split_head_dims():
    # Non-causal D80 and D96 (computed in two parts) at a few key blocks take the short rows' pointer
    # configs (measured on the H200): D80 up to 256 keys at 64 x 32 and up to 512 at 64 x 64, D96 up
    # to 160 at 64 x 32 and up to 512 at 128 x 32; past those the tables' row (128 x 64, row
    # descriptors where the layout allows).
    cuda = torch.device("cuda")
    for head_dim, keys, blocks in ((80, 135, (64, 32)), (80, 256, (64, 32)), (80, 384, (64, 64)),
                                   (80, 512, (64, 64)), (80, 513, (128, 64)), (96, 135, (64, 32)),
                                   (96, 160, (64, 32)), (96, 161, (128, 32)), (96, 512, (128, 32)),
                                   (96, 513, (128, 64))):
        chosen = plan.attention_plan("forward", head_dim, torch.bfloat16, False, cuda, keys, keys, True, rows_ok=True,
                                     interpreting=False)
        assert (chosen.block_m, chosen.block_n) == blocks, (head_dim, keys)
        assert chosen.row_descriptors == (blocks == (128, 64)), (head_dim, keys)
        assert (chosen.block_d, chosen.block_d2) == (64, head_dim - 64)


def test_fused_backward_plan(monkeypatch):
    """Among the rows of the first head-dim bound >= D, the first whose length (the longer of
    queries and keys) and program count (batch x KV heads; 0: any) fit gives the fused plan, with
    BLOCK_N the keys' power of two (16 at least); none fitting, a head dim above every bound, CPU
    without the interpreter, or the table emptied: None, and the split backward runs."""
    monkeypatch.setattr(plan, "interpreter_active", lambda: False)
    cuda = torch.device("cuda")
    table = ((64, 128, 100, 64, 8, 2), (64, 32, 0, 16, 4, 2), (128, 64, 0, 32, 4, 3))

    def fused(head_dim, n_queries, n_keys, programs=1, device=cuda):
        return plan.fused_backward_plan(head_dim, torch.bfloat16, True, device, n_queries, n_keys, programs=programs)

    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_FUSED=table):
        for head_dim, n_queries, n_keys, programs, config in (
                (32, 128, 3, 100, (64, 8, 2)), (64, 5, 128, 1, (64, 8, 2)), (64, 32, 32, 101, (16, 4, 2)),
                (96, 64, 64, 10**6, (32, 4, 3)), (128, 1, 1, 1, (32, 4, 3))):
            chosen = fused(head_dim, n_queries, n_keys, programs)
            assert chosen.kernel == "backward_fused" and (chosen.block_m, chosen.num_warps, chosen.num_stages) == config
            assert chosen.block_n == max(16, 1 << (n_keys - 1).bit_length()) and chosen.block_d >= head_dim
        # Past every row of its bound (the 128 rows do not take a head dim of 64), or above every bound.
        for head_dim, n_queries, n_keys, programs in ((64, 33, 33, 101), (64, 129, 8, 1), (80, 65, 8, 1),
                                                      (256, 8, 8, 1)):
            assert fused(head_dim, n_queries, n_keys, programs) is None
        assert fused(64, 8, 8, device=torch.device("cpu")) is None
    with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_FUSED=()):
        assert fused(64, 8, 8) is None


def test_lse_merges_partial_attentions(gen):
    """Two attentions over disjoint halves of the keys, merged through their lse, give the full one."""
    q, k, v = make_qkv(gen, 1, 2, 2, 18, 40, 64, torch.float16)
    out_a, lse_a = attention(q, k[:, :, :23], v[:, :, :23], return_lse=True)
    out_b, lse_b = attention(q, k[:, :, 23:], v[:, :, 23:], return_lse=True)
    lse = torch.logaddexp(lse_a, lse_b)
    merged = torch.exp(lse_a - lse)[..., None] * out_a.float() + torch.exp(lse_b - lse)[..., None] * out_b.float()
    ref_out, ref_lse = reference(q, k, v, "none")
    assert_matches(merged, ref_out, torch.float16, "merged out")
    assert_matches(lse, ref_lse, torch.float32, "merged lse")


def test_compile_fullgraph(gen):
    q, k, v = make_qkv(gen, 1, 4, 2, 19, 19, 32, torch.float16, requires_grad=True)
    backend = "inductor" if ON_GPU else "aot_eager"
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, causal=True, return_lse=True), fullgraph=True,
                             backend=backend)
    out, lse = compiled(q, k, v)
    eager_out, eager_lse = attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    d_out = torch.randn(out.shape, generator=gen).to(torch.float16).to(DEVICE)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    eager_grads = torch.autograd.grad(eager_out, (q, k, v), d_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))


@pytest.mark.parametrize("mode", MODES)
def test_cpu_path_matches_float64(mode, gen):
    """The blockwise torch implementation (CPU tensors without the interpreter), run directly, with a
    key block smaller than Sk so the online rescaling across blocks happens."""
    q, k, v = make_qkv(gen, 1, 4, 2, 30, 37, 32, torch.bfloat16)
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    old = cpu.ATTENTION_KEY_BLOCK
    try:
        cpu.ATTENTION_KEY_BLOCK = 16
        out, lse = cpu.attention_forward(q, k, v, mode, 1 / math.sqrt(32))
        d_out = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
        grads = cpu.attention_backward(d_out, q, k, v, out, lse, mode, 1 / math.sqrt(32))
    finally:
        cpu.ATTENTION_KEY_BLOCK = old
    ref_out, ref_lse = reference(q, k, v, mode)
    assert_matches(out, ref_out, torch.bfloat16, "cpu out")
    assert_matches(lse, ref_lse, torch.bfloat16, "cpu lse")
    for name, got, ref in zip("qkv", grads, reference_grads(q, k, v, d_out, mode)):
        assert_grad_matches(got, ref, torch.bfloat16, f"cpu d{name}")


def _qkv(shape_q=(1, 2, 8, 64), shape_kv=(1, 2, 8, 64), dtype=torch.float16):
    return (torch.zeros(shape_q, dtype=dtype), torch.zeros(shape_kv, dtype=dtype), torch.zeros(shape_kv, dtype=dtype))


@pytest.mark.parametrize("args, kwargs, error, words", [
    (_qkv(dtype=torch.float32), {}, TypeError, "cast"),
    ((_qkv()[0], _qkv()[1].bfloat16(), _qkv()[2]), {}, TypeError, "share a dtype"),
    (_qkv((1, 3, 8, 64), (1, 2, 8, 64)), {}, ValueError, "multiple"),
    (_qkv((1, 2, 8, 257), (1, 2, 8, 257)), {}, ValueError, "head dim 257"),
    (_qkv((1, 2, 8, 4), (1, 2, 8, 4)), {}, ValueError, "head dim 4"),
    (_qkv((1, 2, 8, 64), (1, 2, 8, 32)), {}, ValueError, "head dims differ"),
    (_qkv((2, 2, 8, 64), (1, 2, 8, 64)), {}, ValueError, "batch"),
    ((_qkv()[0], _qkv()[1], torch.zeros(1, 2, 9, 64, dtype=torch.float16)), {}, ValueError, "same shape"),
    ((torch.zeros(2, 8, 64, dtype=torch.float16),) + _qkv()[1:], {}, ValueError, "4-D"),
    (_qkv(), {"causal": "bottom"}, ValueError, "bottom_right"),
    (_qkv(), {"scale": float("nan")}, ValueError, "scale"),
    (_qkv(), {"scale": -0.5}, ValueError, "> 0"),
    (_qkv(), {"scale": "0.1"}, TypeError, "scale"),
    (([1.0],) + _qkv()[1:], {}, TypeError, "torch.Tensor"),
    (_qkv((65536, 1, 1, 32), (65536, 1, 1, 32)), {}, ValueError, "split the batch"),
])
def test_errors(args, kwargs, error, words):
    with pytest.raises(error, match=words):
        attention(*args, **kwargs)


@gpu_only
@pytest.mark.parametrize("head_dim", attention_op.TUNED_HEAD_DIMS + UNTUNED_HEAD_DIMS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n_queries, n_keys", [(1000, 1000), (4097, 4097), (1, 4097), (4097, 1000), (1000, 2048)])
def test_long_sequences_gpu(n_queries, n_keys, mode, head_dim, gen, plan_override):
    """Full-size blocks, the configured launch parameters and TMA (pointer loads where a row is no
    multiple of 16 bytes, or a short row says "pointer"), at lengths that end mid-block (the
    backward's TMA at every other size: these are below ATTENTION_BACKWARD_POINTER_MAX_WORK)."""
    plan_override("attention", ATTENTION_BACKWARD_POINTER_MAX_WORK=0)
    q, k, v = make_qkv(gen, 1, 4, 2, n_queries, n_keys, head_dim, torch.bfloat16, requires_grad=True)
    check_all(q, k, v, mode, torch.bfloat16, f"{n_queries}x{n_keys} D={head_dim} {mode}", gen)
    backward = plan.last_attention_plan()
    short = plan.short_config(backward.kernel, head_dim, mode != "none", max(n_queries, n_keys), backward.block_d2 > 0)
    pointer_row = short is not None and short[4:] == ("pointer",)
    assert backward.use_descriptor == (head_dim * 2 % 16 == 0 and not pointer_row), backward.describe()


@gpu_only
@pytest.mark.parametrize("head_dim, n_keys", [(128, 2048), (256, 1024), (256, 1000)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_matches_sdpa_math_gpu(dtype, causal, head_dim, n_keys, gen):
    """Within the error of SDPA's math backend in the same dtype (both against float64); at head
    dims 128 and 256 with whole key blocks, the warp-specialized forward in each dtype and mask
    (1000 keys: the row-descriptor forward that covers partial key blocks)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = make_qkv(gen, 2, 8, 8, n_keys, n_keys, head_dim, dtype)
    ref, _ = reference(q, k, v, "top_left" if causal else "none")
    with sdpa_kernel(SDPBackend.MATH):
        math_out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    ours = attention(q, k, v, causal=causal)
    specialized = plan.ATTENTION_FORWARD_WARP_SPECIALIZED.get(head_dim)
    assert plan.last_attention_plan().warp_specialize == (
        specialized is not None and n_keys % specialized[causal][1] == 0)
    assert relative_error(ours, ref) <= max(TOLERANCE[dtype], 1.5 * relative_error(math_out, ref))


@gpu_only
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("heads", [(3, 3), (4, 1)], ids=["mha", "mqa4"])
def test_fused_backward_at_its_lengths_gpu(heads, mode, head_dim, gen):
    """The fused backward under each of its rows: lengths up to the row's limit, ending mid-block and
    unequal (bottom-right leaves queries without keys), against float64."""
    bound = min(r[0] for r in plan.ATTENTION_BACKWARD_FUSED if head_dim <= r[0])
    for _, most, _, *config in (r for r in plan.ATTENTION_BACKWARD_FUSED if r[0] == bound):
        for n_queries, n_keys in ((most, most), (most - 3, 17), (5, most - 1), (1, 1)):
            q, k, v = make_qkv(gen, 2, *heads, n_queries, n_keys, head_dim, torch.bfloat16, requires_grad=True)
            check_all(q, k, v, mode, torch.bfloat16, f"{n_queries}x{n_keys} D{head_dim} {heads} {mode}", gen)
            chosen = plan.last_attention_plan()
            assert chosen.kernel == "backward_fused", chosen
            if (n_queries, n_keys) == (most, most):
                assert [chosen.block_m, chosen.num_warps, chosen.num_stages] == config, chosen


@gpu_only
@pytest.mark.parametrize("shape, causal", [((1, 16, 16, 128, 64), False), ((11, 16, 1, 388, 80), True),
                                           ((2, 28, 4, 1000, 32), True), ((2, 8, 8, 1024, 128), False)])
def test_explain_names_the_launched_plans_gpu(shape, causal, gen):
    """``onlinesoftmax explain --op attention`` plans from the shape alone what the launchers plan
    from the tensors (contiguous ones): the forward's and the backward's first kernel, as launched."""
    batch, heads_q, heads_kv, seq, head_dim = shape
    text = attention_explain.explain(batch, heads_q, heads_kv, seq, seq, head_dim, torch.bfloat16, causal,
                                     sms=torch.cuda.get_device_properties(0).multi_processor_count)
    q, k, v = make_qkv(gen, batch, heads_q, heads_kv, seq, seq, head_dim, torch.bfloat16, requires_grad=True)
    out = attention(q, k, v, causal=causal)
    assert "  " + plan.last_attention_plan().describe() + "\n" in text, text
    out.backward(torch.randn_like(out))
    assert "  " + plan.last_attention_plan().describe() in text, text


@gpu_only
def test_small_backward_reads_through_pointers(gen):
    """At or below ATTENTION_BACKWARD_POINTER_MAX_WORK the backward takes pointer loads (a launch
    with device-side descriptors goes through Triton's slower Python launcher, host time a tiny step
    cannot hide); above it, TMA descriptors."""
    for (batch, heads, seq, head_dim), kernel, descriptors in (((1, 2, 128, 64), "backward_fused", False),
                                                               ((1, 2, 512, 64), "backward_dkdv", False),
                                                               ((2, 8, 2048, 128), "backward_dkdv", True)):
        q, k, v = make_qkv(gen, batch, heads, heads, seq, seq, head_dim, torch.bfloat16, requires_grad=True)
        attention(q, k, v, causal=True).backward(torch.randn(q.shape, dtype=q.dtype, device=q.device))
        chosen = plan.last_attention_plan()
        assert chosen.kernel == kernel and chosen.use_descriptor == descriptors, chosen


def test_backward_pointer_rule_is_the_plans(monkeypatch):
    """The plan weighs a backward's work (batch x heads x queries x keys x head dim) against
    ATTENTION_BACKWARD_POINTER_MAX_WORK on the GPU; the interpreter, the forward and a caller that
    gives no batch_heads (a forced load path) keep the layout's answer."""
    cuda = torch.device("cuda")
    limit = plan.ATTENTION_BACKWARD_POINTER_MAX_WORK
    monkeypatch.setattr(plan, "interpreter_active", lambda: False)
    for kernel in ("backward_dkdv", "backward_dq"):
        def uses_tma(batch_heads, seq=2048, head_dim=128, layout_ok=True):
            return plan.attention_plan(kernel, head_dim, torch.bfloat16, True, cuda, seq, seq, layout_ok,
                                       batch_heads=batch_heads).use_descriptor
        at_limit = limit // (2048 * 2048 * 128)
        assert not uses_tma(at_limit) and uses_tma(at_limit + 1)
        assert not uses_tma(at_limit + 1, layout_ok=False)
        assert uses_tma(None, seq=128, head_dim=64)  # forced: the layout's answer
    fused_limit = limit // (128 * 128 * 64)
    for batch_heads, tma in ((fused_limit, False), (fused_limit + 1, True), (None, True)):
        fused = plan.fused_backward_plan(64, torch.bfloat16, True, cuda, 128, 128, True, batch_heads=batch_heads)
        assert fused.kernel == "backward_fused" and fused.use_descriptor == tma
    forward = plan.attention_plan("forward", 64, torch.bfloat16, True, cuda, 128, 128, True, batch_heads=1)
    assert forward.use_descriptor == plan.ATTENTION_USE_DESCRIPTOR["forward"]
    monkeypatch.setattr(plan, "interpreter_active", lambda: True)
    assert plan.attention_plan("backward_dkdv", 64, torch.bfloat16, True, cuda, 128, 128, True,
                               batch_heads=1).use_descriptor


def test_broadcast_upstream_gradient(gen):
    """dO with stride 0 everywhere (what out.sum().backward() sends) takes the pointer loads and gives
    the gradients of the materialized dO (through TMA on the GPU)."""
    q, k, v = make_qkv(gen, 1, 2, 1, 20, 27, 32, torch.bfloat16, requires_grad=True)
    out = attention(q, k, v, causal=True)
    broadcast = torch.ones((), dtype=out.dtype, device=out.device).expand(out.shape)
    grads = torch.autograd.grad(out, (q, k, v), broadcast, retain_graph=True)
    if TRITON_RUNS:
        assert not plan.last_attention_plan().use_descriptor
    materialized = torch.autograd.grad(out, (q, k, v), broadcast.contiguous())
    for name, a, b in zip("qkv", grads, materialized):
        assert_grad_matches(a, b, torch.bfloat16, f"d{name}")


FLASH_CRITERION_LENGTHS = tuple(n for n in attention_suite.SWEEP_LENGTHS if n <= 8191)


@pytest.fixture
def release_cached_memory():
    """Hands the caching allocator's blocks back after the test: the S8191 cases' float32 score
    matrices (1 GiB each) stay reserved otherwise, and 14 workers sharing one GPU ran out."""
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def assert_flash_criterion(seq, head_dim, causal, heads, gen):
    """flash-attention's criterion: the max |error| of the output and of each gradient against
    float32 math is at most twice that of the same math in bf16, plus twice the bf16 rounding of
    the reference itself (its tests' atol)."""
    q, k, v = make_qkv(gen, 1, heads[0], heads[1], seq, seq, head_dim, torch.bfloat16, requires_grad=True)
    d_out = torch.randn((1, heads[0], seq, head_dim), generator=gen).to(DEVICE, torch.bfloat16)
    ours = attention(q, k, v, causal=causal)
    same = attention_suite.math_attention(q, k, v, causal)
    wide = [t.detach().float().requires_grad_() for t in (q, k, v)]
    exact = attention_suite.math_attention(*wide, causal)
    got = (ours, *torch.autograd.grad(ours, (q, k, v), d_out))
    low = (same, *torch.autograd.grad(same, (q, k, v), d_out))
    ref = (exact.detach(), *torch.autograd.grad(exact, wide, d_out.float()))
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), got, low, ref):
        error, bf16_error = (a.float() - c).abs().max().item(), (b.float() - c).abs().max().item()
        atol = 2 * (c.to(torch.bfloat16).float() - c).abs().max().item()
        assert error <= 2 * bf16_error + atol, (f"S{seq} D{head_dim} {heads} causal={causal} {name}: "
                                                f"{error:.3e} > 2 x {bf16_error:.3e} + {atol:.1e}")


@gpu_only
@pytest.mark.parametrize("heads", [(2, 2), (4, 1)], ids=["mha", "gqa4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", attention_suite.SWEEP_HEAD_DIMS)
@pytest.mark.parametrize("seq", FLASH_CRITERION_LENGTHS)
def test_flash_criterion_over_sweep_shapes_gpu(seq, head_dim, causal, heads, gen, release_cached_memory):
    """The criterion at the sweep's lengths, head dims, masks and head layouts."""
    assert_flash_criterion(seq, head_dim, causal, heads, gen)


@pytest.mark.skipif(ON_GPU or not TRITON_RUNS, reason="the interpreter's short lengths; the GPU runs the sweep's")
@pytest.mark.parametrize("heads", [(2, 2), (4, 1)], ids=["mha", "gqa4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq", [37, 130])
def test_flash_criterion_interpreted(seq, causal, heads, gen):
    """The criterion under the interpreter (its bf16 casts rounding to nearest, as the GPU's:
    conftest), so that the CPU run holds the backward to it too, at short lengths."""
    assert_flash_criterion(seq, 64, causal, heads, gen)


@gpu_only
@pytest.mark.slow
@pytest.mark.parametrize("shape, mode", [((4097, 8, 8, 256, 256), "none"), ((2049, 16, 4, 256, 256), "top_left")],
                         ids=["mha-kv-past", "gqa-causal-q-past"])
def test_more_than_2_31_elements(shape, mode, gen, release_cached_memory):
    """(batch, Hq, Hkv, S, D) whose q (and, MHA, k and v) hold more than 2^31 elements: the last
    batch sits where a 32-bit offset would wrap, and is checked against float64, forward and
    gradients. (batch x heads is at most 65535, a grid axis: so S x D > 2^15.)"""
    batch, heads_q, heads_kv, seq, head_dim = shape
    assert batch * heads_q * seq * head_dim > 2**31 and batch * heads_q <= attention_op.MAX_BATCH_HEADS
    cuda_gen = torch.Generator(device="cuda").manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    q = torch.randn((batch, heads_q, seq, head_dim), device="cuda", generator=cuda_gen, dtype=torch.bfloat16)
    k, v = (torch.randn((batch, heads_kv, seq, head_dim), device="cuda", generator=cuda_gen, dtype=torch.bfloat16)
            for _ in range(2))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = attention(q, k, v, causal=CAUSAL_ARG[mode])
    d_out = torch.randn(out.shape, device="cuda", generator=cuda_gen, dtype=torch.bfloat16)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    assert not out.isnan().any() and not any(g.isnan().any() for g in grads)
    last = slice(batch - 2, batch)
    tail = [t.detach()[last] for t in (q, k, v)]
    assert_matches(out.detach()[last], reference(*tail, mode)[0], torch.bfloat16, "out")
    for name, got, want in zip("qkv", grads, reference_grads(*tail, d_out[last], mode)):
        assert_grad_matches(got[last], want, torch.bfloat16, f"d{name}")
