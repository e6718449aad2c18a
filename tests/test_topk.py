"""softmax_topk: values and indices against float64 references, every launch path forced, ties,
-inf / NaN rows, k edge cases, gradients, torch.compile, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import onlinesoftmax
from onlinesoftmax import _device, cpu, reference
from onlinesoftmax.ops.topk import launch as topk_module, op as topk_op, plan
from onlinesoftmax._launch import aligned

from conftest import DEVICE, DTYPES, ON_GPU, TRITON_RUNS, assert_matches, gpu_only, make_logits, needs_triton

# (forced strategy, num_chunks, block, lane_keep[, second_read]): one program per row; several
# chunks merged by the second launch; a split with a single chunk (the merge folds nothing); a block
# larger than the row; the lanes keeping their best, or their two best, on one program per row and
# on chunks, reading the whole chunk again when they must (the default) or only the suspect lanes.
# Blocks are forced too, so rows of 300 span several blocks on the GPU as in the interpreter.
PATHS = [("single", None, 64, 0), ("split", 3, 64, 0), ("split", 1, 64, 0), ("single", None, 1024, 0),
         ("single", None, 64, 1), ("split", 3, 64, 1), ("single", None, 64, 2), ("split", 3, 64, 2),
         ("single", None, 64, 1, "lanes"), ("split", 3, 64, 1, "lanes"), ("single", None, 64, 2, "lanes"),
         ("split", 3, 64, 2, "lanes")]
PATH_IDS = ["single", "split3", "split1", "bigblock", "lanebest", "lanebest-split3", "lanetwo", "lanetwo-split3",
            "lanebest-rereadlanes", "lanebest-split3-rereadlanes", "lanetwo-rereadlanes", "lanetwo-split3-rereadlanes"]
MAIN = [0, 1, 4, 5, 6, 7, 8, 11]  # both strategies, each with every selection and second read
LANE_PATHS = [4, 5, 6, 7, 8, 9, 10, 11]


def expected(x2: torch.Tensor, k: int, temperature: float = 1.0, device="cpu"):
    """float64 probabilities and indices under our ranking: x / T in float32, lower index on ties."""
    scaled = x2.float().to(device) * (1.0 / temperature)
    scaled = torch.where(scaled == 0, 0.0, scaled)
    order = torch.sort(scaled, dim=-1, descending=True, stable=True).indices[:, :k]
    probs = torch.softmax(scaled.double(), -1)
    return probs.gather(-1, order), order, torch.logsumexp(scaled.double(), -1)


def run(x2, k, path, temperature=1.0):
    strategy, num_chunks, block, lane_keep, *second_read = path
    second_read = second_read[0] if second_read else "chunk"
    values, indices, lse, _ = topk_module.launch_forward(x2, k, temperature, strategy, block, num_chunks,
                                                         lane_keep=lane_keep, second_read=second_read)
    chosen = plan.last_topk_plan()
    assert chosen.strategy == strategy and chosen.lane_keep == lane_keep, chosen
    assert chosen.second_read == second_read, chosen
    if num_chunks is not None:
        assert chosen.num_chunks == num_chunks, chosen
    return values, indices, lse


# Every dtype on the four main paths; the corner paths in float32.
FULL = [0, 1, 4, 6]


@needs_triton
@pytest.mark.parametrize("path, dtype", [(PATHS[i], dtype) for i in FULL for dtype in DTYPES]
                         + [(PATHS[i], torch.float32) for i in range(len(PATHS)) if i not in FULL],
                         ids=[f"{PATH_IDS[i]}-{str(d)[6:]}" for i in FULL for d in DTYPES]
                         + [PATH_IDS[i] for i in range(len(PATHS)) if i not in FULL])
# k: 1 (greedy decode), 37 (not a power of two; 64 = the list = the block is in the next test)
@pytest.mark.parametrize("k", [1, 37])
def test_matches_reference(path, dtype, k, gen):
    # 300 columns: not a power of two, several blocks of 64 per chunk and a ragged last block.
    x2 = make_logits((3, 300), dtype, gen)
    values, indices, lse = run(x2, k, path, temperature=0.7)
    ref_values, ref_indices, ref_lse = expected(x2, k, 0.7)
    assert values.dtype == dtype and indices.dtype == torch.int64
    assert torch.equal(indices.cpu(), ref_indices)
    assert_matches(values, ref_values, dtype, "values")
    assert_matches(lse, ref_lse, torch.float32, "lse")


@needs_triton
def test_torch_topk_agrees_on_distinct_values(gen):
    # Without ties the fused result is exactly torch.topk(torch.softmax(x / T)); k = 64 makes the
    # candidate list as large as the interpreter's block.
    x = make_logits((2, 300), torch.float32, gen)
    values, indices = onlinesoftmax.softmax_topk(x, 64, temperature=1.5)
    ref_values, ref_indices = torch.topk(torch.softmax(x.double() / 1.5, -1), 64)
    assert torch.equal(indices.cpu(), ref_indices.cpu())
    assert_matches(values, ref_values, torch.float32, "values")


@needs_triton
@pytest.mark.parametrize("path", [PATHS[i] for i in MAIN], ids=[PATH_IDS[i] for i in MAIN])
def test_numpy_insertion_loop_agrees(path, gen):
    x2 = make_logits((2, 257), torch.float32, gen)
    values, indices, _ = run(x2, 7, path)
    for row in range(2):
        ref_values, ref_indices = reference.softmax_topk(x2[row].cpu().numpy(), 7)
        np.testing.assert_array_equal(indices[row].cpu().numpy(), ref_indices)
        # Below float32's normal range (1.2e-38) a subnormal holds fewer digits: compare those absolutely.
        np.testing.assert_allclose(values[row].cpu().numpy(), ref_values, rtol=1e-5, atol=np.finfo(np.float32).tiny)


@needs_triton
@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_ties_lower_index_wins(path):
    # Constant rows tie everywhere; the second row ties across the chunk boundaries, with -0.0
    # against +0.0; the third repeats the maximum late in the row.
    x2 = torch.zeros(3, 300, device=DEVICE)
    x2[1, ::2] = -0.0
    x2[1, 250:] = -1.0
    x2[2] = torch.arange(300, device=DEVICE) % 7
    values, indices, _ = run(x2, 9, path)
    assert torch.equal(indices[0].cpu(), torch.arange(9))
    assert torch.equal(indices[1].cpu(), torch.arange(9))
    assert torch.equal(indices[2].cpu(), torch.tensor([6, 13, 20, 27, 34, 41, 48, 55, 62]))
    assert torch.allclose(values[0].cpu(), torch.full((9,), 1 / 300))


@needs_triton
def test_block_merge_paths():
    # Ascending row: every block beats the list entirely (the block top-k path each time);
    # descending: nothing after the first block; a few late outliers: the one-by-one insertion.
    x2 = torch.stack([torch.arange(300.0), -torch.arange(300.0), torch.zeros(300)]).to(DEVICE)
    x2[2, [100, 170, 299]] = torch.tensor([1.0, 3.0, 2.0], device=DEVICE)
    values, indices, _ = run(x2, 12, PATHS[0])
    assert not plan.last_topk_plan().compact
    assert torch.equal(indices[0].cpu(), torch.arange(299, 287, -1))
    assert torch.equal(indices[1].cpu(), torch.arange(12))
    assert torch.equal(indices[2].cpu(), torch.tensor([170, 299, 100, 0, 1, 2, 3, 4, 5, 6, 7, 8]))


@needs_triton
def test_block_merge_paths_long_list():
    # k > plan.TOPK_COMPACT_ABOVE_K: survivors are compacted. Ascending: every block of 128 holds
    # more survivors than the 32-slot list (the block top-k path); the outliers are compacted,
    # three in one block, as are the descending row's first block and the constant row's ties.
    k = 20
    x2 = torch.stack([torch.arange(300.0), -torch.arange(300.0), torch.zeros(300)]).to(DEVICE)
    x2[2, [100, 110, 120, 170, 299]] = torch.tensor([1.0, 5.0, 4.0, 3.0, 2.0], device=DEVICE)
    values, indices, _ = run(x2, k, ("single", None, 128, False))
    assert plan.last_topk_plan().compact and plan.last_topk_plan().k_pow2 == 32
    assert torch.equal(indices[0].cpu(), torch.arange(299, 299 - k, -1))
    assert torch.equal(indices[1].cpu(), torch.arange(k))
    assert torch.equal(indices[2].cpu(), torch.tensor([110, 120, 170, 299, 100] + list(range(15))))
    ref_values, _, _ = expected(x2, k)
    assert_matches(values, ref_values, torch.float32, "values")


@needs_triton
@pytest.mark.parametrize("path", [PATHS[i] for i in MAIN], ids=[PATH_IDS[i] for i in MAIN])
def test_neg_inf_entries_and_nan_rows(path):
    x2 = torch.full((5, 150), float("-inf"), device=DEVICE)
    x2[0, [3, 140]] = torch.tensor([1.0, 2.0], device=DEVICE)  # 2 finite, k = 4: then -inf by index
    x2[2] = 1.0
    x2[2, 77] = float("nan")
    x2[3] = 1.0
    x2[3, 100] = float("inf")
    x2[4] = torch.linspace(-5, 5, 150, device=DEVICE)  # row 1 stays all -inf
    values, indices, lse = run(x2, 4, path)
    p = torch.softmax(torch.tensor([1.0, 2.0], dtype=torch.float64), 0)
    assert torch.equal(indices[0].cpu(), torch.tensor([140, 3, 0, 1]))
    assert torch.allclose(values[0].cpu().double(), torch.tensor([p[1], p[0], 0.0, 0.0], dtype=torch.float64))
    for row in (1, 2, 3):  # torch.softmax gives NaN rows: NaN values, all tie, indices 0..k-1
        assert torch.isnan(values[row]).all()
        assert torch.equal(indices[row].cpu(), torch.arange(4))
    assert torch.equal(indices[4].cpu(), torch.tensor([149, 148, 147, 146]))
    assert lse[1].item() == float("-inf") and torch.isnan(lse[2]) and lse[3].item() == float("inf")


@needs_triton
@pytest.mark.parametrize("path", [PATHS[i] for i in LANE_PATHS], ids=[PATH_IDS[i] for i in LANE_PATHS])
def test_lanes_read_again_exactly_when_they_must(path, gen):
    # Lanes are columns mod 64 (the forced block). Row 0: the three largest share lane 5, so the
    # lanes' kept elements alone would miss column 133 (and 69 when a lane keeps one). Row 1:
    # constant, every lane's runner-up ties its kept ones. Row 2: two finite entries for k = 4
    # (fewer kept elements above -inf than k): then -inf by index. Row 3: five outliers in five
    # lanes over small noise, where the kept elements are the answer. Row 4: the largest value
    # three times in one lane (ties go to the lower column: 7, 71, 135).
    x2 = make_logits((5, 300), torch.float32, gen, scale=0.1, outliers=False)
    x2[0, [5, 69, 133]] = torch.tensor([50.0, 49.0, 48.0], device=DEVICE)
    x2[1] = 0.5
    x2[2] = float("-inf")
    x2[2, [100, 30]] = torch.tensor([1.0, 2.0], device=DEVICE)
    x2[3, [3, 70, 140, 200, 260]] = torch.tensor([9.0, 8.0, 7.0, 6.0, 5.0], device=DEVICE)
    x2[4, [135, 71, 7, 200]] = torch.tensor([30.0, 30.0, 30.0, 29.0], device=DEVICE)
    values, indices, _ = run(x2, 4, path)
    ref_values, ref_indices, _ = expected(x2, 4)
    assert indices[0, :3].tolist() == [5, 69, 133]
    assert indices[1].tolist() == [0, 1, 2, 3]
    assert indices[2].tolist() == [30, 100, 0, 1]
    assert indices[3].tolist() == [3, 70, 140, 200]
    assert indices[4].tolist() == [7, 71, 135, 200]
    assert torch.equal(indices.cpu(), ref_indices)
    assert_matches(values, ref_values, torch.float32, "values")


@needs_triton
@pytest.mark.parametrize("path", [PATHS[i] for i in (6, 7, 10, 11)], ids=[PATH_IDS[i] for i in (6, 7, 10, 11)])
def test_two_kept_per_lane_hold_pairs_of_the_top_k(path, gen):
    # Pairs of the top 6 share lanes (5 and 69, 10 and 74, 20 and 148). No lane holds three and
    # every runner-up is noise far below the 6th value, so no second read runs: the answer, both
    # ranks' values and columns, comes from the kept pairs alone.
    x2 = make_logits((2, 300), torch.float32, gen, scale=0.1, outliers=False)
    x2[:, [5, 69, 10, 74, 20, 148]] = torch.tensor([60.0, 59.0, 58.0, 57.0, 56.0, 55.0], device=DEVICE)
    values, indices, _ = run(x2, 6, path)
    assert indices.tolist() == [[5, 69, 10, 74, 20, 148]] * 2
    assert_matches(values, expected(x2, 6)[0], torch.float32, "values")


@needs_triton
@pytest.mark.parametrize("k, strategy, num_chunks, second_read", [
    (100, "split", 2, "chunk"), (100, "single", None, "lanes"),
    # k = 256 is the k = 100 cases' code at another block: the interpreter's 40 s are CI's, the GPU's.
    pytest.param(256, "split", 2, "lanes", marks=gpu_only)])
def test_one_kept_per_lane_with_long_lists(k, strategy, num_chunks, second_read, gen):
    # Keeping one per lane at k > 64 (forced): lanes of K_POW2 (the block, forced so that the GPU
    # runs the same plan as the interpreter), each holding two or more of a row's 600 columns, so
    # lanes hold several of the top k and the second read always runs. Ties (a run of equal values
    # across lanes) and -inf columns included. One row: the interpreter takes about a minute a row
    # at k = 256.
    x2 = make_logits((1, 600), torch.float32, gen)
    x2[0, 100:400:3] = 2.5  # 100 ties across lanes: the lower columns win
    x2[0, :60] = x2[0, 256:316] = float("-inf")  # lanes 0-59 start with two -inf
    values, indices, lse = run(x2, k, (strategy, num_chunks, _device.next_power_of_2(k), 1, second_read))
    ref_values, ref_indices, ref_lse = expected(x2, k)
    assert torch.equal(indices.cpu(), ref_indices)
    assert_matches(values, ref_values, torch.float32, "values")
    assert_matches(lse, ref_lse, torch.float32, "lse")


@needs_triton
@pytest.mark.parametrize("second_read", ["chunk", "lanes"])
@pytest.mark.parametrize("lane_keep", [1, 2])
@pytest.mark.parametrize("k", [12, 16])
def test_lanes_with_chunks_shorter_than_k(lane_keep, k, second_read, gen):
    # Blocks of 16 and chunks of one block: the last chunk of 40 columns holds 8, fewer than k, so
    # its lanes keep fewer than k elements and it reads again (the whole chunk, in either mode);
    # the merge still finds the top k.
    x2 = make_logits((3, 40), torch.float32, gen)
    values, indices, _ = run(x2, k, ("split", 3, 16, lane_keep, second_read))
    ref_values, ref_indices, _ = expected(x2, k)
    assert torch.equal(indices.cpu(), ref_indices)
    assert_matches(values, ref_values, torch.float32, "values")


def test_lane_keep_is_checked():
    device = torch.device("cuda")
    with pytest.raises(ValueError, match="lane_keep"):
        plan.topk_plan(4, 1000, 65, torch.float32, device, sms=132, lane_keep=2)
    with pytest.raises(ValueError, match="lane_keep"):
        plan.topk_plan(4, 1000, 5, torch.float32, device, sms=132, lane_keep=3)
    with pytest.raises(ValueError, match="second_read"):
        plan.topk_plan(4, 1000, 5, torch.float32, device, sms=132, second_read="row")
    # The default: the suspect lanes where second reads are common (keeping one, or two at k > 16).
    for cols, k, lane_keep, second_read in ((1000, 5, 1, "lanes"), (25000, 5, 2, "chunk"), (25000, 50, 2, "lanes"),
                                            (25000, 100, 1, "lanes")):
        chosen = plan.topk_plan(1024, cols, k, torch.float32, device, sms=132)
        assert (chosen.lane_keep, chosen.second_read) == (lane_keep, second_read), chosen


@needs_triton
def test_k_edge_cases_and_errors(gen):
    x = make_logits((2, 17), torch.float32, gen)
    values, indices = onlinesoftmax.softmax_topk(x, 17)  # k == size
    assert torch.equal(indices.cpu(), expected(x, 17)[1])
    values, indices, lse = onlinesoftmax.softmax_topk(x, 0, return_lse=True)
    assert values.shape == (2, 0) and indices.shape == (2, 0) and indices.dtype == torch.int64
    assert_matches(lse, expected(x, 0)[2], torch.float32, "lse for k=0")
    with pytest.raises(ValueError, match="k must be in"):
        onlinesoftmax.softmax_topk(x, 18)
    with pytest.raises(ValueError, match="k must be in"):
        onlinesoftmax.softmax_topk(x, -1)
    with pytest.raises(TypeError):
        onlinesoftmax.softmax_topk(x, 2.0)
    with pytest.raises(TypeError):
        onlinesoftmax.softmax_topk(x.double(), 2)
    with pytest.raises(ValueError, match="temperature"):
        onlinesoftmax.softmax_topk(x, 2, temperature=0.0)
    with pytest.raises(IndexError):
        onlinesoftmax.softmax_topk(x, 2, dim=2)
    with pytest.raises(ValueError, match="strategy"):
        onlinesoftmax.softmax_topk(x, 2, strategy="nope")
    empty_values, empty_indices = onlinesoftmax.softmax_topk(x[:0], 3)
    assert empty_values.shape == (0, 3) and empty_indices.shape == (0, 3)
    scalar_values, scalar_indices = onlinesoftmax.softmax_topk(torch.tensor(2.0, device=DEVICE), 1)
    assert scalar_values.item() == 1.0 and scalar_indices.item() == 0


@needs_triton
def test_large_k_uses_torch_path(gen):
    # K above the kernels' list (256) runs the vectorized torch path with the same semantics: rows
    # tied at the k-th value (on CUDA tensors the tie-break once built a CPU mask and raised) and a
    # NaN row among them.
    x = make_logits((4, 400), torch.float32, gen)
    x[2] = 1.0
    x[3, :350] = 1.0
    x[3, 7] = float("nan")
    values, indices = onlinesoftmax.softmax_topk(x, 300)
    ref_values, ref_indices, _ = expected(x, 300)
    assert torch.equal(indices[:3].cpu(), ref_indices[:3])
    assert torch.equal(indices[3].cpu(), torch.arange(300))
    assert_matches(values, ref_values, torch.float32, "values")


@needs_triton
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_any_dim_and_strided_views(dim, gen):
    base = make_logits((2, 24, 5), torch.float32, gen)
    x = base[:, ::2, :].transpose(0, 2) if dim != 1 else base[::2]  # (5, 12, 2) or (1, 24, 5)
    values, indices, lse = onlinesoftmax.softmax_topk(x, 2, dim=dim, return_lse=True)
    moved = x.movedim(dim, -1).reshape(-1, x.shape[dim])
    ref_values, ref_indices, ref_lse = expected(moved, 2)
    shape = x.movedim(dim, -1).shape[:-1]
    assert values.shape == x.shape[:dim] + (2,) + x.shape[dim + 1:]
    assert torch.equal(indices.movedim(dim, -1).reshape(-1, 2).cpu(), ref_indices)
    assert_matches(values.movedim(dim, -1).reshape(-1, 2), ref_values, torch.float32, "values")
    assert_matches(lse, ref_lse.reshape(shape), torch.float32, "lse")


@needs_triton
@pytest.mark.parametrize("path", PATHS[:2], ids=PATH_IDS[:2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient(path, dtype, gen):
    strategy, num_chunks, block, _ = path
    x = make_logits((3, 300), dtype, gen, outliers=False).requires_grad_()
    values, indices, lse = topk_op._SoftmaxTopkFunction.apply(x, 6, 0.8, strategy, block, num_chunks, False)
    dv = torch.randn(values.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    dlse = torch.randn(lse.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    ((values.double() * dv).sum() + (lse.double() * dlse).sum()).backward()
    x64 = x.detach().double().requires_grad_()
    y = torch.softmax(x64 / 0.8, -1)
    ((y.gather(-1, indices) * dv).sum() + (torch.logsumexp(x64 / 0.8, -1) * dlse).sum()).backward()
    assert x.grad.dtype == dtype
    assert_matches(x.grad, x64.grad, dtype, "dx")


@pytest.mark.parametrize("offset", [800.0, -3000.0])
@pytest.mark.parametrize("path", [PATHS[0], PATHS[1], "cpu"], ids=[PATH_IDS[0], PATH_IDS[1], "cpu"])
def test_gradient_at_large_logits(path, offset, gen):
    """Logits far from 0 (an lse whose float32 ulp is 6e-5 or 2.4e-4): the gradient's terms cancel,
    so a probability recomputed from a rounded lse was 8e-5 off; the lse in two floats keeps dx
    within the float32 tolerance (the kernels, and the CPU functions the torch path runs). At T = 1:
    x / T itself rounds to the ulp of the scaled logits, as torch's x / T does."""
    x = (make_logits((4, 300), torch.float32, gen, outliers=False) + offset).requires_grad_()
    dv = torch.randn((4, 6), generator=gen, dtype=torch.float64).to(DEVICE)
    dlse = torch.randn((4,), generator=gen, dtype=torch.float64).to(DEVICE)
    if path == "cpu":
        x2, inv_t = x.detach().cpu(), 1.0
        values, indices = torch.empty(4, 6), torch.empty(4, 6, dtype=torch.int64)
        lse, lse_low = torch.empty(4), torch.empty(4)
        cpu.softmax_topk(x2, 6, inv_t, values, indices, lse, lse_low)
        grad = torch.empty(4, 300)
        cpu.softmax_topk_backward(x2, lse, lse_low, indices, dv.float().cpu(), dlse.float().cpu(), inv_t, grad)
    else:
        if not TRITON_RUNS:
            pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
        values, indices, lse = topk_op._SoftmaxTopkFunction.apply(x, 6, 1.0, *path[:3], False)
        ((values.double() * dv).sum() + (lse.double() * dlse).sum()).backward()
        grad = x.grad
    x64 = x.detach().double().requires_grad_()
    y = torch.softmax(x64, -1)
    ((y.gather(-1, indices.to(DEVICE)) * dv).sum() + (torch.logsumexp(x64, -1) * dlse).sum()).backward()
    assert_matches(grad, x64.grad, torch.float32, "dx")


@needs_triton
def test_gradient_through_public_function_any_dim(gen):
    x = make_logits((5, 3, 70), torch.float32, gen, outliers=False).transpose(0, 2).requires_grad_()
    values, _ = onlinesoftmax.softmax_topk(x, 4, dim=0)
    values.sum().backward()
    x64 = x.detach().double().requires_grad_()
    torch.topk(torch.softmax(x64, 0), 4, 0).values.sum().backward()
    assert_matches(x.grad, x64.grad, torch.float32, "dx")


@needs_triton
def test_deterministic(gen):
    # The interpreter runs programs one after another, so there only a read of memory no program
    # wrote could make two calls differ: two selections there, all five on the GPU.
    x = make_logits((2, 400), torch.float32, gen)
    selections = ((0, None), (1, "chunk"), (2, "chunk"), (1, "lanes"), (2, "lanes"))
    for lane_keep, second_read in selections if ON_GPU else selections[::4]:
        first = topk_module.launch_forward(x, 16, 1.0, "split", 64, 5, lane_keep=lane_keep, second_read=second_read)
        second = topk_module.launch_forward(x, 16, 1.0, "split", 64, 5, lane_keep=lane_keep, second_read=second_read)
        for a, b in zip(first, second):
            assert torch.equal(a, b)


@needs_triton
@pytest.mark.parametrize("path", [PATHS[i] for i in (0, 1, 5)], ids=[PATH_IDS[i] for i in (0, 1, 5)])
def test_without_the_lse(path, gen):
    """write_lse=False (what an eager call that drops the lse takes): the same values and indices,
    bit for bit, and no lse; the public function takes it only where nothing needs the lse."""
    x = make_logits((3, 300), torch.bfloat16, gen)
    strategy, num_chunks, block, lane_keep = path
    with_lse = topk_module.launch_forward(x, 7, 1.5, strategy, block, num_chunks, lane_keep=lane_keep)
    values, indices, lse, lse_low = topk_module.launch_forward(x, 7, 1.5, strategy, block, num_chunks,
                                                               lane_keep=lane_keep, write_lse=False)
    assert lse is None and lse_low is None and torch.equal(values, with_lse[0]) and torch.equal(indices, with_lse[1])
    calls = []
    real = topk_module.launch_forward

    def spy(*args, **kwargs):
        calls.append(kwargs.get("write_lse", True))
        return real(*args, **kwargs)

    # The lse-less launch is the public function's only direct call of launch_forward; a call that
    # returns the lse or records the graph for a backward goes through the op (_forward).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(topk_op, "launch_forward", spy)
        public = onlinesoftmax.softmax_topk(x, 7, temperature=1.5)
        assert calls == [False] and len(public) == 2 and torch.equal(public[0], values)
        # The public call takes the plan's path, not necessarily this test's forced one (their lse
        # can differ in the last bit: another merge order); it is compared with that path's launch.
        assert torch.equal(onlinesoftmax.softmax_topk(x, 7, temperature=1.5, return_lse=True)[2],
                           real(x, 7, 1.5)[2])
        onlinesoftmax.softmax_topk(x.float().requires_grad_(), 7)[0].sum().backward()
    assert calls == [False]


@needs_triton
def test_auto_plan_splits_few_rows_only(gen):
    sms = _device.sm_count(DEVICE)
    few = make_logits((1, 5000), torch.float32, gen)  # 2 chunks of 2 blocks even with the GPU's blocks
    onlinesoftmax.softmax_topk(few, 3)
    assert plan.last_topk_plan().strategy == "split" and plan.last_topk_plan().num_chunks > 1
    many = make_logits((2 * sms, 100), torch.float32, gen)
    onlinesoftmax.softmax_topk(many, 3)
    assert plan.last_topk_plan().strategy == "single"


def test_row_alignment_hint_only_where_rows_are_16_byte_aligned():
    # The kernels tell Triton that rows start and end on 16-byte boundaries (tl.multiple_of), which
    # the interpreter ignores: a wrong claim would only show on the GPU, so the rule is pinned here.
    def row_align(t):
        return topk_module._row_align(t, aligned(t))

    x = torch.empty((4, 1000), dtype=torch.float32)
    assert row_align(x) == 4
    assert row_align(torch.empty((4, 1000), dtype=torch.bfloat16)) == 8
    assert row_align(x[:, :998]) == 1  # ends mid-vector
    assert row_align(x[:, 1:997]) == 1  # starts mid-vector
    assert row_align(torch.empty((4, 1002))[:, :1000]) == 1  # row stride of 1002
    assert row_align(torch.empty((1000, 4)).t()) == 1  # columns not contiguous
    assert row_align(torch.empty((4, 1004))[:, 4:]) == 4  # 16 bytes in, still aligned


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_read_with_and_without_the_alignment_hint(dtype, gen):
    # Rows of 16-byte-aligned length read as vectors on the GPU (after the hint), sliced ones not;
    # every selection and both strategies, at the plan's blocks (under the interpreter: its own).
    # The interpreter pairs each layout with two of them (its time is CI's), the GPU runs them all.
    base = make_logits((2, 1032), dtype, gen)  # the second row starts where the first row's stride says
    combos = (("single", 0), ("single", 1), ("split", 2), ("split", 0))
    for i, x2 in enumerate((base[:, :1024], base[:, 8:], base[:, 1:1025], base[:, 3:1000])):
        for strategy, lane_keep in combos if ON_GPU else (combos[i % 4], combos[(i + 1) % 4]):
            values, indices, lse, _ = topk_module.launch_forward(x2, 5, 1.0, strategy, None, None, lane_keep=lane_keep)
            ref_values, ref_indices, ref_lse = expected(x2, 5)
            assert torch.equal(indices.cpu(), ref_indices), (x2.shape, x2.storage_offset(), strategy, lane_keep)
            assert_matches(values, ref_values, dtype, "values")
            assert_matches(lse, ref_lse, torch.float32, "lse")


def test_plan_table_for_the_gpu():
    # What the H100 (132 SMs) gets for the shapes: decode rows split, batches do not.
    device = torch.device("cuda")
    assert plan.topk_plan(1, 151936, 1, torch.float32, device, sms=132).num_chunks > 16
    assert plan.topk_plan(1024, 25000, 5, torch.float32, device, sms=132).strategy == "single"
    assert plan.topk_plan(256, 151936, 5, torch.float32, device, sms=132).num_chunks >= 2
    chosen = plan.topk_plan(64, 128256, 50, torch.float32, device, sms=132)
    assert chosen.strategy == "split" and chosen.k_pow2 == 64 and chosen.lane_keep == 2
    assert chosen.block == plan.TOPK_LANE_BLOCK
    assert "softmax_topk" in chosen.describe(3000.0)
    # Lanes keep one on short chunks, two on long ones, and one again above k = 64.
    assert plan.topk_plan(4096, 4096, 8, torch.float32, device, sms=132).lane_keep == 1
    assert plan.topk_plan(1, 151936, 1, torch.float32, device, sms=132).lane_keep == 1
    assert plan.topk_plan(1024, 25000, 5, torch.float32, device, sms=132).lane_keep == 2
    assert plan.topk_plan(1024, 25000, 20, torch.float32, device, sms=132).lane_keep == 2
    wide = plan.topk_plan(256, 151936, 64, torch.float32, device, sms=132)
    assert wide.lane_keep == 2 and wide.block == plan.TOPK_LANE_WIDE_BLOCK
    for dtype, block in ((torch.float32, 1024), (torch.bfloat16, 2048)):
        long_list = plan.topk_plan(128, 262144, 256, dtype, device, sms=132)
        assert (long_list.lane_keep, long_list.second_read, long_list.block) == (1, "lanes", block), long_list
        assert long_list.strategy == "split"
    listed = plan.topk_plan(128, 262144, 256, torch.float32, device, sms=132, lane_keep=0)
    assert listed.lane_keep == 0 and listed.block == plan.TOPK_BLOCK[4]
    assert plan.topk_plan(1024, 25000, 5, torch.float32, device, sms=132, lane_keep=0).block == plan.TOPK_BLOCK[4]


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_path(dtype, gen, monkeypatch):
    # The vectorized torch path that CPU tensors take without the interpreter.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = make_logits((4, 333), dtype, gen, device="cpu")
    x[1, 5] = float("nan")
    values, indices, lse = onlinesoftmax.softmax_topk(x, 12, temperature=2.0, return_lse=True)
    ref_values, ref_indices, ref_lse = expected(x, 12, 2.0)
    ref_values[1], ref_indices[1] = float("nan"), torch.arange(12)
    assert torch.equal(indices, ref_indices)
    assert_matches(values, ref_values, dtype, "values")
    assert_matches(lse, ref_lse, torch.float32, "lse")
    x = make_logits((4, 333), torch.float32, gen, device="cpu", outliers=False).requires_grad_()
    onlinesoftmax.softmax_topk(x, 3)[0].sum().backward()
    x64 = x.detach().double().requires_grad_()
    torch.topk(torch.softmax(x64, -1), 3).values.sum().backward()
    assert_matches(x.grad, x64.grad, torch.float32, "dx")


def test_compile_fullgraph(gen):
    x = make_logits((3, 200), torch.float32, gen, outliers=False).requires_grad_()

    def f(t):
        values, indices, lse = onlinesoftmax.softmax_topk(t, 5, return_lse=True)
        return values.sum() + lse.sum(), indices

    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    loss, indices = torch.compile(f, fullgraph=True, backend=backend)(x)
    loss.backward()
    x64 = x.detach().double().requires_grad_()
    (torch.topk(torch.softmax(x64, -1), 5).values.sum() + torch.logsumexp(x64, -1).sum()).backward()
    assert torch.equal(indices.cpu(), expected(x.detach(), 5)[1])
    assert_matches(x.grad, x64.grad, torch.float32, "dx under compile")




def test_cpu_path_in_row_chunks_equals_one_chunk(gen, monkeypatch):
    # cpu.softmax_topk and its backward take the rows a few at a time (cpu.row_chunks): the same
    # numbers, bit for bit, as all the rows at once. bf16 logits: ties at the k-th value.
    x2 = make_logits((11, 300), torch.bfloat16, gen).cpu()
    dv, dlse = torch.randn((11, 6), generator=gen), torch.randn((11,), generator=gen)
    results = []
    for rows_at_once in (None, 3):
        if rows_at_once:
            monkeypatch.setattr(cpu, "ROW_CHUNK_ELEMENTS", rows_at_once * 300)
            assert len(cpu.row_chunks(x2)) == 4
        values, indices = torch.full((11, 6), float("nan")), torch.zeros((11, 6), dtype=torch.int64)
        lse, lse_low, dx = torch.full((11,), float("nan")), torch.full((11,), float("nan")), torch.empty(11, 300)
        cpu.softmax_topk(x2, 6, 1 / 0.7, values, indices, lse, lse_low)
        cpu.softmax_topk_backward(x2, lse, lse_low, indices, dv, dlse, 1 / 0.7, dx)
        results.append((values, indices, lse, lse_low, dx))
    for name, one, chunked in zip(("values", "indices", "lse", "lse_low", "dx"), *results):
        assert torch.equal(one, chunked), name


@gpu_only
@pytest.mark.slow
@pytest.mark.parametrize("shape, strategy", [((2**14 + 1, 2**17 + 3), "single"), ((3, 2**30 - 5), "split")])
def test_more_than_2_31_elements(shape, strategy, gen):
    # bf16 keeps these at 4 GiB; the last rows are where a 32-bit offset would wrap.
    assert math.prod(shape) > 2**31
    cuda_gen = torch.Generator(device="cuda").manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    x = torch.randn(shape, device="cuda", generator=cuda_gen, dtype=torch.bfloat16)
    values, indices, lse = onlinesoftmax.softmax_topk(x, 8, strategy=strategy, return_lse=True)
    assert plan.last_topk_plan().strategy == strategy
    ref_values, ref_indices, ref_lse = expected(x[-2:], 8, device="cuda")  # rows of 2^30: sorted on the GPU
    assert torch.equal(indices[-2:], ref_indices)
    assert_matches(values[-2:], ref_values, torch.bfloat16, "values")
    assert_matches(lse[-2:], ref_lse, torch.float32, "lse")


@needs_triton
@pytest.mark.parametrize("many_rows, k", [(False, 40), (True, 5)], ids=["chunks_folded", "one_chunk"])
def test_shard_partials_merged_across_ranks(many_rows, k, gen):
    # onlinesoftmax.distributed.softmax_topk's kernels without a process group: a row cut into five
    # shards (one empty, one shorter than k), each reduced to its payload, stacked as an all_gather
    # returns them and merged. The same indices as the one-device op on the whole row, probabilities
    # against float64; ties across shards (+0.0 and -0.0 among them), -inf on a shard, NaN, +inf and
    # all -inf rows.
    from onlinesoftmax.distributed.topk import shard_payload

    # Few rows split a long shard into chunks, folded into one partial a row; many take one chunk
    # (the plan's thresholds: 8 rows on the interpreter's 4 SMs, 2 an SM on a GPU).
    rows = (300 if ON_GPU else 9) if many_rows else 3
    cols = 6003 if ON_GPU else 603
    x = make_logits((rows, cols), torch.float32, gen)
    x[0] = 0.0
    x[0, 1::2] = -0.0
    x[1, :cols // 4] = float("-inf")
    x[2, 500] = float("nan")
    if rows > 3:
        x[3] = float("-inf")
        x[4, 599] = float("inf")
    cuts = [0, cols // 4, cols // 4, cols // 4 + 2, cols * 14 // 15, cols]
    payloads = []
    for a, b in zip(cuts, cuts[1:]):
        payloads.append(shard_payload(x[:, a:b].contiguous(), k, 0.7)[0])
        if b - a > cols // 2:
            assert (plan.last_topk_plan().num_chunks > 1) != many_rows, plan.last_topk_plan()
    values, indices, lse = topk_module.launch_shard_merge(torch.stack(payloads), rows, k, torch.float32)
    ref_values, ref_indices, ref_lse = onlinesoftmax.softmax_topk(x, k, temperature=0.7, return_lse=True)
    assert torch.equal(indices.cpu(), ref_indices.cpu())
    assert torch.equal(indices[0].cpu(), torch.arange(k))
    want, _, want_lse = expected(x, k, 0.7)
    assert_matches(values, want, torch.float32, "values")
    assert_matches(lse, want_lse, torch.float32, "lse")
    assert torch.equal(values.isnan(), ref_values.isnan())
