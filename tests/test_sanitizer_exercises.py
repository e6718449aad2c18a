"""Every Triton kernel variant launched once at small sizes on a CUDA GPU, for compute-sanitizer.

    compute-sanitizer --tool memcheck python -m pytest -q -m sanitizer tests/test_sanitizer_exercises.py
    compute-sanitizer --tool racecheck python -m pytest -q -m sanitizer tests/test_sanitizer_exercises.py

The sanitizer instruments the kernels; each test also checks what the launches return (against
float64 torch, or for finite outputs where the op's own tests check the values), so a launch that
reads or writes the wrong memory fails here without the sanitizer too. The op test modules check
results thoroughly; these exist to put every variant (strategy, selection, load path, register
cap, warp specialization) in front of the sanitizer in one short process. Skipped without a CUDA
GPU: the interpreter's kernels are NumPy, with nothing to sanitize.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import onlinesoftmax
from onlinesoftmax import cpu
from onlinesoftmax._device import next_power_of_2
from onlinesoftmax.ops.attention import launch as attention_launch
from onlinesoftmax.ops.attention import plan as attention_plan
from onlinesoftmax.ops.cross_entropy import plan as ce_plan
from onlinesoftmax.ops.softmax import plan as softmax_plan
from onlinesoftmax.ops.topk import launch as topk_launch

if not torch.cuda.is_available():
    pytest.skip("the sanitizer exercises need a CUDA GPU", allow_module_level=True)
pytestmark = pytest.mark.sanitizer

DEVICE = torch.device("cuda")


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _all_finite(*tensors: torch.Tensor) -> bool:
    torch.cuda.synchronize()
    return all(bool(torch.isfinite(t).all()) for t in tensors)


# --------------------------------------------------------------------------------------------
# softmax, log_softmax, logsumexp: every strategy and algorithm, forward and backward
# --------------------------------------------------------------------------------------------

def _softmax_step(ours, ref, x: torch.Tensor, dim: int, **options):
    """One forward and backward of ``ours`` on x against float64 ``ref``: (forward plan, backward
    plan, a message where either result is off, else None)."""
    y = ours(x, dim, **options)
    forward_plan = softmax_plan.last_plan()
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    y64 = ref(x64, dim)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    err, grad_err = _rel(y, y64), _rel(dx, dx64)
    bad = None if err < 2e-2 and grad_err < 2e-2 else (
        f"{ours.__name__} {tuple(x.shape)} dim={dim}: err {err:.1e}, grad err {grad_err:.1e}")
    return forward_plan, softmax_plan.last_plan(), bad



SOFTMAX_OPS = ((onlinesoftmax.softmax, torch.softmax), (onlinesoftmax.log_softmax, torch.log_softmax))
SOFTMAX_CASES = [("row_on_chip", "auto"), ("split_row_on_chip", "auto"), ("looped", "online"), ("looped", "safe"),
                 ("split_row", "online"), ("split_row", "safe")]

# Small split_row_on_chip chunks (1024 / 512 fp32 elements), so that the long rows below take 13
# (forward) and 25 (backward) programs each, which meet at their row's counter; row_on_chip holds
# every 2-byte row in its own dtype (the plan does so for bf16 rows of 32768 and fp16 log_softmax's only).
SMALL_CHUNKS = dict(SPLIT_ON_CHIP_TILE_BYTES={"forward": 4096, "backward": 2048},
                    SPLIT_ON_CHIP_WARP_BYTES={"forward": 1024, "backward": 1024},
                    ROW_ON_CHIP_HOLD_INPUT_MIN_COLS={torch.bfloat16: 1, torch.float16: 1},
                    ROW_ON_CHIP_HOLD_INPUT_MIN_ROWS_PER_SM={}, ROW_ON_CHIP_HOLD_INPUT_GRANULE_ROWS={})


@pytest.mark.parametrize("strategy,algorithm", SOFTMAX_CASES, ids=[f"{s}-{a}" for s, a in SOFTMAX_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_softmax_strategies(dtype, strategy, algorithm):
    gen = torch.Generator().manual_seed(0)
    bad = []
    with onlinesoftmax.override_plan("softmax", **SMALL_CHUNKS):
        for cols in (37, 3 * softmax_plan.STREAM_BLOCK[dtype.itemsize] + 17):
            if strategy == "row_on_chip" and next_power_of_2(cols) > softmax_plan.ROW_ON_CHIP_MAX_COLS[dtype.itemsize]:
                continue
            for dim, shape in ((-1, (3, cols)), (0, (cols, 3))):
                x = (torch.randn(shape, generator=gen) * 3).to(dtype).to(DEVICE).requires_grad_()
                for ours, ref in SOFTMAX_OPS:
                    forward_plan, _, off = _softmax_step(ours, ref, x, dim, algorithm=algorithm, strategy=strategy)
                    assert forward_plan.strategy == strategy
                    bad += [off] if off else []
                lse = onlinesoftmax.logsumexp(x.detach(), dim, strategy=strategy)
                lse_err = (lse.double() - torch.logsumexp(x.detach().double(), dim)).norm().item()
                if not lse_err < 1e-1:
                    bad.append(f"logsumexp {shape} dim={dim}: error {lse_err:.1e}")
    torch.cuda.synchronize()
    assert not bad, bad


@pytest.mark.parametrize("dtype, warps", [(torch.bfloat16, 8), (torch.float16, 4)], ids=str)
def test_softmax_backward_chunks_of_fewer_warps(dtype, warps):
    # The 2-byte softmax backward's chunks of 8192 elements on 8 warps in bf16, 4 in fp16
    # (SPLIT_ON_CHIP_SOFTMAX_BACKWARD_*), forced on few rows: 3 rows of four chunks, the last one partial.
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 3 * 8192 + 16, generator=gen) * 3).to(dtype).to(DEVICE).requires_grad_()
    with onlinesoftmax.override_plan("softmax", SPLIT_ON_CHIP_SOFTMAX_BACKWARD_MIN_ROWS_PER_SM=0,
                                     SPLIT_ON_CHIP_FEW_PROGRAMS_TILE_BYTES={"forward": 8192, "backward": 16384}):
        _, backward_plan, off = _softmax_step(onlinesoftmax.softmax, torch.softmax, x, -1,
                                              strategy="split_row_on_chip")
    assert (backward_plan.strategy, backward_plan.num_warps, backward_plan.num_chunks) == (
        "split_row_on_chip", warps, 4)
    assert off is None, off


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_softmax_rows_of_unit_stride(dtype):
    # Rows read along the rows (plan.unit_rows), forward and backward: the channels of (2, 19, 64, 64),
    # and dim 0 of (7, 3000), whose last program is part full.
    gen = torch.Generator().manual_seed(0)
    bad = []
    tiles = {32: 4096, 8: 4096}  # (the forward's at 32 and both at 8 forced: widths the plan leaves off)
    with onlinesoftmax.override_plan("softmax", ROW_UNIT_MIN_PROGRAMS_PER_SM=0, ROW_UNIT_FORWARD_MIN_WIDTH=0,
                                     ROW_UNIT_TILE_ELEMENTS={4: tiles, 2: tiles},
                                     EAGER_HOST_US=softmax_plan.EAGER_ROUTE_OFF):
        for shape, dim in (((2, 19, 64, 64), 1), ((7, 3000), 0)):
            x = (torch.randn(shape, generator=gen) * 3).to(dtype).to(DEVICE).requires_grad_()
            for ours, ref in SOFTMAX_OPS:
                forward_plan, backward_plan, off = _softmax_step(ours, ref, x, dim)
                assert forward_plan.unit_rows and backward_plan.unit_rows
                bad += [off] if off else []
    assert not bad, bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_softmax_row_on_chip_head_and_tail(dtype):
    # Rows held as a power-of-two head and a tail tile, forced on every row (off 16-byte boundaries
    # too): the tail's masked loads and stores end at the tensor's last element.
    gen = torch.Generator().manual_seed(0)
    always = {direction: {4: 1.0, 2: 1.0} for direction in ("forward", "backward")}
    anywhere = {direction: {4: 1 << 20, 2: 1 << 20} for direction in ("forward", "backward")}
    bad = []
    with onlinesoftmax.override_plan("softmax", ROW_ON_CHIP_TAIL_BELOW_FILL=always, ROW_ON_CHIP_TAIL_MIN_COLS=16,
                                     ROW_ON_CHIP_TAIL_MAX_HEAD=anywhere, ROW_ON_CHIP_TAIL_MISALIGNED_MAX_HEAD=anywhere):
        for cols in (37, 4097, 8200, 17000):
            for dim, shape in ((-1, (3, cols)), (0, (cols, 3))):
                x = (torch.randn(shape, generator=gen) * 3).to(dtype).to(DEVICE).requires_grad_()
                for ours, ref in SOFTMAX_OPS:
                    forward_plan, backward_plan, off = _softmax_step(ours, ref, x, dim, strategy="row_on_chip")
                    assert forward_plan.tail_cols > 0 and backward_plan.tail_cols > 0
                    bad += [off] if off else []
    torch.cuda.synchronize()
    assert not bad, bad


# --------------------------------------------------------------------------------------------
# softmax_topk: single and split launches, every selection and second read, the backward
# --------------------------------------------------------------------------------------------

def _topk_selections(k: int, strided: bool):
    """The plan's selection; contiguous runs also force every other one k allows (the running
    list, one or two kept per lane, each with either second read)."""
    if strided:
        return [(None, None)]
    return [(None, None), (0, None)] + [(keep, second_read) for keep in (1, 2) if k <= (16, 64)[keep - 1]
                                        for second_read in ("chunk", "lanes")]


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("strategy,num_chunks", [("single", None), ("split", 3)], ids=["single", "split"])
@pytest.mark.parametrize("k", [1, 5, 50, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_topk_selections(dtype, k, strategy, num_chunks, strided):
    # K lists of 2 / 8 / 64 / 256 over 6 rows of 700 columns in blocks of 64 (rows end mid-block),
    # with a NaN row, an all -inf row and a row holding several of its top k in one lane of 64,
    # which makes the lane selections read again.
    gen = torch.Generator().manual_seed(0)
    for lane_keep, second_read in _topk_selections(k, strided):
        base = torch.randn(700, 6, generator=gen).to(dtype).to(DEVICE)
        x2 = base.t() if strided else base.t().contiguous()
        x2[1, 10] = float("nan")
        x2[2] = float("-inf")
        x2[4, 3:300:64] = 30.0
        values, indices, lse, lse_low = topk_launch.launch_forward(x2, k, 0.9, strategy, 64, num_chunks,
                                                                   lane_keep=lane_keep, second_read=second_read)
        dv = torch.randn_like(values, dtype=torch.float32)
        dx = topk_launch.launch_backward(x2, lse, lse_low, indices, dv, torch.randn_like(lse), 0.9, strategy, 64,
                                         num_chunks)
        what = f"lane_keep={lane_keep} second_read={second_read}"
        assert _all_finite(values[3:], dx[3:]), what
        assert bool((indices >= 0).all()) and bool((indices < 700).all()), what


# --------------------------------------------------------------------------------------------
# attention: every head dim, causal mode and load path, forward and backward
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_descriptor", [True, False], ids=["descriptors", "pointers"])
@pytest.mark.parametrize("mode", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("head_dim", [32, 80, 136, 144, 160, 176, 192, 256])
def test_attention_load_paths(head_dim, mode, use_descriptor):
    # Head dims 32, 80 (the forward in two parts, the backward padded to 128), 136, 144, 160 and 176
    # (both directions in two parts: 128 + 16 past the head dim, 128 + 16, 128 + 32, 128 + 64 past
    # it; short rows on pointer loads at 144-192, the forward in two parts at 192) and 256; GQA (4
    # query heads on 2 KV heads); 70 queries and 45 keys end mid-block, and bottom-right causal
    # leaves the first queries no visible key.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 70, head_dim, generator=gen).bfloat16().to(DEVICE)
    k, v = (torch.randn(1, 2, 45, head_dim, generator=gen).bfloat16().to(DEVICE) for _ in range(2))
    out, lse = attention_launch.launch_forward(q, k, v, mode, head_dim ** -0.5, use_descriptor=use_descriptor)
    grads = attention_launch.launch_backward(torch.randn_like(out), q, k, v, out, lse, mode, head_dim ** -0.5,
                                             use_descriptor=use_descriptor)
    assert _all_finite(out, *grads)


@pytest.mark.parametrize("use_descriptor", [True, False], ids=["descriptors", "pointers"])
@pytest.mark.parametrize("mode", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("n_queries,n_keys", [(60, 45), (100, 90)])
def test_attention_fused_backward(n_queries, n_keys, head_dim, mode, use_descriptor):
    # The fused backward (keys in one block) under each row of its table (up to 64 and up to 128
    # keys and queries): GQA, lengths ending mid-block.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, n_queries, head_dim, generator=gen).bfloat16().to(DEVICE)
    k, v = (torch.randn(1, 2, n_keys, head_dim, generator=gen).bfloat16().to(DEVICE) for _ in range(2))
    out, lse = attention_launch.launch_forward(q, k, v, mode, head_dim ** -0.5, use_descriptor=use_descriptor)
    grads = attention_launch.launch_backward(torch.randn_like(out), q, k, v, out, lse, mode, head_dim ** -0.5,
                                             use_descriptor=use_descriptor)
    assert attention_plan.last_attention_plan().kernel == "backward_fused"
    assert _all_finite(out, *grads)


@pytest.mark.parametrize("mode", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("head_dim,n_keys", [(64, 200), (128, 256)], ids=["rows-D64", "warp-specialized-D128"])
def test_attention_forward_row_paths(head_dim, n_keys, mode):
    # The forward's row descriptors (head dim 64, keys ending mid-block) and its warp-specialized
    # loop (head dim 128, keys in whole blocks; the last query block reads past its head), checked
    # against the blockwise torch evaluation on the GPU.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 70, head_dim, generator=gen).bfloat16().to(DEVICE)
    k, v = (torch.randn(2, 2, n_keys, head_dim, generator=gen).bfloat16().to(DEVICE) for _ in range(2))
    out, lse = attention_launch.launch_forward(q, k, v, mode, head_dim ** -0.5)
    chosen = attention_plan.last_attention_plan()
    ref, _ = cpu.attention_forward(q, k, v, mode, head_dim ** -0.5)
    error = _rel(out.float(), ref.float())
    what = f"rows={chosen.row_descriptors} warp-specialized={chosen.warp_specialize} rel err {error:.1e}"
    assert _all_finite(out, lse[lse > float("-inf")]), what
    assert error < 2e-2, what


# --------------------------------------------------------------------------------------------
# cross_entropy: every strategy, in place and separate, rows starting inside 16-byte vectors
# --------------------------------------------------------------------------------------------

CROSS_ENTROPY_CASES = [("stream", False), ("on_chip", True), ("split_on_chip", True), ("two_pass", True),
                       ("separate", True)]


@pytest.mark.parametrize("strategy,inplace", CROSS_ENTROPY_CASES,
                         ids=["stream-backward", "on_chip", "split_on_chip", "two_pass", "separate"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cross_entropy_strategies(dtype, strategy, inplace):
    # 20011 columns: several tiles a row, every row starting at another alignment (edges); one row
    # in five ignored.
    _check_cross_entropy(dtype, 37, 20011 if strategy != "on_chip" else 3001, strategy, inplace)


@pytest.mark.parametrize("cols", [16384, 20480, 65537])
def test_cross_entropy_plain_rows_under_a_register_cap(cols):
    # bf16 rows in two_pass's programs under PLAIN_MAX_REGISTERS: its loop over whole tiles, then one
    # over half tiles for the rest (none at 16384, one at 20480); 65537: rows with edges, 32 warps.
    _check_cross_entropy(torch.bfloat16, 37, cols, "two_pass", True)
    chosen = ce_plan.last_plan()
    assert chosen.max_registers and chosen.tail < chosen.block


@pytest.mark.parametrize("cols", [19, 2, 300], ids=["groups", "narrow", "one-group"])
@pytest.mark.parametrize("inplace", [False, True], ids=["kept", "in-place"])
def test_cross_entropy_short_rows_and_reductions_over_programs(cols, inplace):
    # The rows kernel (tiles of 32 columns in groups, of 2, of 512 in one group) over 40000 rows: the
    # count and reduce launches past their one program's steps (programs that meet in the last).
    _check_cross_entropy(torch.bfloat16, 40000, cols, "rows", inplace)
    chosen = ce_plan.last_plan()
    assert chosen.strategy == "rows" and chosen.column_groups == ce_plan.ROWS_COLUMN_GROUPS.get(chosen.block, 1)


@pytest.mark.parametrize("cols", [19, 2, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cross_entropy_rows_of_unit_stride(dtype, cols):
    # torch's class dim 1 at N = 1 (the classes strided, the rows of unit stride): the rows kernel's
    # loads along the rows, at their own tiles, over 40000 rows.
    _check_cross_entropy(dtype, 40000, cols, "rows", False, rows_unit=True)
    chosen = ce_plan.last_plan()
    assert chosen.strategy == "rows" and chosen.rows_unit


def _check_cross_entropy(dtype, rows, cols, strategy, inplace, rows_unit=False):
    """Loss and gradient of (rows, cols) logits, one row in five ignored, against float64 torch;
    ``rows_unit``: logits of strides (1, rows)."""
    gen = torch.Generator().manual_seed(0)
    if rows_unit:
        x = (3 * torch.randn(cols, rows, generator=gen)).to(dtype).to(DEVICE).t()
    else:
        x = (3 * torch.randn(rows, cols, generator=gen)).to(dtype).to(DEVICE)
    target = torch.randint(0, cols, (rows,), generator=gen)
    target[::5] = -100
    target = target.to(DEVICE)
    ref_x = x.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_x, target)
    ref.backward()
    leaf = x.clone().requires_grad_()
    loss = onlinesoftmax.cross_entropy(leaf, target, strategy=strategy, inplace_backward=inplace)
    loss.backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert abs(loss.item() - ref.item()) <= tol * abs(ref.item())
    assert _rel(leaf.grad, ref_x.grad) < tol


@pytest.mark.parametrize("order", ["first", "last", "overlap"])
@pytest.mark.parametrize("dtype,cols", [(torch.float32, 16392), (torch.bfloat16, 65544), (torch.bfloat16, 50257)],
                         ids=["float32-16392", "bfloat16-65544", "bfloat16-50257"])
def test_cross_entropy_last_part_in_the_last_program(dtype, cols, order):
    # The stream forward's and the backward's last program a row taking the row's last part (a
    # narrower tile at the tensor's end too), at few rows and in each of the stream's orders.
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(3, cols, generator=gen)).to(dtype).to(DEVICE)
    target = torch.tensor([cols - 1, 0, -100], device=DEVICE)
    ref_x = x.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_x, target)
    ref.backward()
    leaf = x.clone().requires_grad_()
    with onlinesoftmax.override_plan("cross_entropy", STREAM_TAIL_MIN_ROWS_PER_SM=0,
                                     STREAM_TAIL_ORDER={4: order, 2: order}):
        loss = onlinesoftmax.cross_entropy(leaf, target)
        chosen = ce_plan.last_plan()
        loss.backward()
    assert chosen.strategy == "stream" and chosen.tail < chosen.block and chosen.tail_order == order
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert abs(loss.item() - ref.item()) <= tol * abs(ref.item())
    assert _rel(leaf.grad, ref_x.grad) < tol


@pytest.mark.parametrize("rows,cols", [(3, 20011), (37, 301), (1, 5), (600, 1025)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cross_entropy_probability_targets(dtype, rows, cols):
    # Probability targets' kernels: several steps a row cut into chunks and merged (20011), several
    # rows a program (301, 5), rows on 16-byte vectors with partial edges (20011, 1025), the "mean"
    # from the last of 600 programs; every option, the targets' gradient too. Against float64
    # torch (z term by hand).
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(rows, cols, generator=gen)).to(dtype).to(DEVICE)
    p = torch.softmax(torch.randn(rows, cols, generator=gen), -1).to(dtype).to(DEVICE)
    weight = (torch.rand(cols, generator=gen) + 0.5).to(DEVICE)
    ref_x, ref_p = x.double().requires_grad_(), p.double().requires_grad_()
    y = 8.0 * torch.tanh(ref_x / 8.0) / 0.9
    ref = (torch.nn.functional.cross_entropy(y, ref_p, weight=weight.double(), label_smoothing=0.1, reduction="none")
           + 1e-3 * torch.logsumexp(y, -1) ** 2).mean()
    ref.backward()
    leaf, target = x.clone().requires_grad_(), p.clone().requires_grad_()
    loss = onlinesoftmax.cross_entropy(leaf, target, weight=weight, label_smoothing=0.1, z_loss=1e-3, softcap=8.0,
                                       temperature=0.9)
    loss.backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert abs(loss.item() - ref.item()) <= tol * abs(ref.item())
    assert _rel(leaf.grad, ref_x.grad) < tol and _rel(target.grad, ref_p.grad) < tol


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_shard_merge(reduction):
    # The sharded ops' merges without a process group: three shards of the classes (the middle one
    # empty) reduced to their statistics, stacked as the all_gather returns them, and merged into
    # the loss by the vocabulary-parallel kernel (1500 rows: two blocks of its one program); a long
    # row's chunk partials merged into the (m, d) pair a sharded softmax sends. Against float64 torch.
    from cross_entropy_cases import reference

    from onlinesoftmax.ops.cross_entropy import shards as ce_shards
    from onlinesoftmax.ops.softmax import launch as softmax_launch

    gen = torch.Generator().manual_seed(0)
    rows, cols = 1500, 3001
    x = (3 * torch.randn(rows, cols, generator=gen)).to(DEVICE)
    target = torch.randint(0, cols, (rows,), generator=gen)
    target[::5] = -100
    target = target.to(DEVICE)
    weight = (torch.rand(cols, generator=gen) + 0.5).to(DEVICE)
    options = (-100, reduction, 0.1, 1e-3, 0.0, 1.0)
    stats = torch.stack([ce_shards.shard_stats(x[:, a:b], target, weight, a, cols, options, True, False)
                         for a, b in ((0, 1200), (1200, 1200), (1200, cols))])
    loss, lse, _, _ = ce_shards.merge_shard_loss(stats, target, weight, cols, options, torch.float32)
    # The references on the CPU: racecheck reports torch's own float64 reduction kernels.
    x64, target_cpu = x.cpu().double(), target.cpu()
    ref = reference(x64, target_cpu, reduction=reduction, label_smoothing=0.1, z_loss=1e-3,
                    weight=weight.cpu().double())
    assert _rel(loss.cpu(), ref) < 1e-5
    valid = target_cpu != -100
    assert _rel(lse.cpu()[valid], torch.logsumexp(x64, -1)[valid]) < 1e-6
    long_rows = 3 * torch.randn(4, 200003, generator=gen)
    m, d = softmax_launch.row_normalizers(long_rows.to(DEVICE)).cpu()
    assert _rel(m + torch.log(d), torch.logsumexp(long_rows.double(), -1)) < 1e-6


@pytest.mark.parametrize("rows", [3, 300], ids=["chunks_folded", "one_chunk"])
def test_sharded_topk_and_softmax_merges(rows):
    # The sharded softmax_topk's and softmax's kernels without a process group: three shards (the
    # middle one empty) reduced to their payloads (3 rows: chunks folded into one partial a row),
    # stacked as the all_gather returns them, merged; the softmax normalized from the ranks' pairs
    # read in the gather's layout. Indices against the one-device op, values against float64 on
    # the CPU.
    from onlinesoftmax.distributed.topk import shard_payload
    from onlinesoftmax.ops.softmax import launch as softmax_launch

    gen = torch.Generator().manual_seed(0)
    cols, k = 70001, 50
    x = 3 * torch.randn(rows, cols, generator=gen)
    cuts = ((0, 30000), (30000, 30000), (30000, cols))
    shards = [x[:, a:b].contiguous().to(DEVICE) for a, b in cuts]
    payloads = torch.stack([shard_payload(shard, k, 0.7)[0] for shard in shards])
    values, indices, lse = topk_launch.launch_shard_merge(payloads, rows, k, torch.float32)
    _, ref_indices = onlinesoftmax.softmax_topk(x.to(DEVICE), k, temperature=0.7)
    assert torch.equal(indices, ref_indices)
    probs = torch.softmax((x * (1.0 / 0.7)).double(), -1)
    assert _rel(values.cpu(), probs.gather(-1, indices.cpu())) < 1e-5
    assert _rel(lse.cpu(), torch.logsumexp((x * (1.0 / 0.7)).double(), -1)) < 1e-6
    pairs = torch.stack([softmax_launch.row_normalizers(shard) for shard in shards])
    y = softmax_launch.normalize_rows(shards[2], pairs, False)
    assert _rel(y.cpu(), torch.softmax(x.double(), -1)[:, 30000:]) < 1e-5


# --------------------------------------------------------------------------------------------
# attention_with_kvcache: the direct and split paths and their merge, contiguous and paged caches
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_splits", [1, 3, "auto"], ids=lambda n: f"splits_{n}")
@pytest.mark.parametrize("page_size", [0, 16], ids=["contiguous", "page16"])
@pytest.mark.parametrize("head_dim", [64, 128, 72, 8])
def test_decode_paths(head_dim, page_size, num_splits):
    # GQA 8 / 2, 3 new queries, uneven lengths (none, mid-page, the capacity); every key past a
    # sequence's length and every unused page NaN. Out and lse against float64 on the gathered cache
    # (tests/test_decode.py's helpers).
    from test_decode import check, make_inputs

    gen = torch.Generator().manual_seed(0)
    inputs = make_inputs(gen, 3, 3, 8, 2, head_dim, [0, 37, 300], page_size=page_size, capacity=300)
    check(inputs, causal=True, num_splits=num_splits, what=f"D{head_dim} page {page_size} splits {num_splits}")


# --------------------------------------------------------------------------------------------
# The work log's ladder (numba-cuda)
# --------------------------------------------------------------------------------------------

def _ladder():
    if importlib.util.find_spec("numba") is None:
        pytest.skip("numba-cuda is not installed (pip install -e '.[ladder]')")
    from onlinesoftmax import ladder

    if ladder.SIMULATED:
        pytest.skip("numba.cuda is the simulator in this process (NUMBA_ENABLE_CUDASIM): nothing to sanitize")
    return ladder


def _ladder_error(out: torch.Tensor, ref: torch.Tensor) -> str | None:
    finite = torch.isfinite(ref)
    err = ((out.double()[finite] - ref[finite]).norm() / ref[finite].norm()).item()
    nan_ok = torch.equal(torch.isnan(out), torch.isnan(ref))
    return None if err <= 1e-5 and nan_ok else f"rel err {err:.1e}, NaN placement {'ok' if nan_ok else 'WRONG'}"


def test_ladder_row_steps():
    # Every row step in both builds (IEEE and fastmath): non-power-of-two rows, rows shorter than
    # the block, rows with -inf entries and an all -inf row.
    ladder = _ladder()
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 1000, generator=gen) * 3).to(DEVICE)
    x[::3, :100] = float("-inf")
    x[5] = float("-inf")
    short = torch.randn(6, 70, generator=gen).to(DEVICE)
    bad = []
    for name, fn, _ in ladder.ROW_STEPS:
        for fastmath in (False, True):
            problem = _ladder_error(fn(x, fastmath=fastmath), torch.softmax(x.double(), -1))
            if problem:
                bad.append(f"{name} fastmath={fastmath} 37x1000: {problem}")
        problem = _ladder_error(fn(short), torch.softmax(short.double(), -1))
        if problem:
            bad.append(f"{name} 6x70: {problem}")
    torch.cuda.synchronize()
    assert not bad, bad


@pytest.mark.parametrize("n,partial_blocks", [(100_003, None), (100_003, 3), (70, None)])
def test_ladder_vector(n, partial_blocks):
    # Step 5 (three kernels over one vector) with fewer partials than threads and more; half -inf.
    ladder = _ladder()
    v = (torch.randn(n, generator=torch.Generator().manual_seed(0)) * 3).to(DEVICE)
    v[: n // 2] = float("-inf")
    out = ladder.softmax_vector_three_kernels(v, partial_blocks=partial_blocks)
    problem = _ladder_error(out, torch.softmax(v.double(), -1))
    assert problem is None, problem
