"""distributed.cross_entropy (the vocabulary sharded across ranks) against the float64 single-process
reference, in gloo worlds of 2 and 3 ranks.

Each world runs a group of checks (few process starts). Every rank builds the same logits and
targets from the printed seed, takes its uneven shard of the classes (world 3: the middle rank
holds none), and compares the loss (bitwise the same on every rank) and its shard's gradient
with the reference on the whole tensor. CPU tensors; on a GPU machine CUDA tensors on one GPU,
the collectives staged through the host by gloo.
"""

from __future__ import annotations


import pytest
import torch
import torch.distributed as dist

from conftest import DEVICE, TRITON_RUNS, assert_matches
from worlds import gathered_equal_everywhere, run_world, shard_bounds
from test_cross_entropy import reference

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

INIT_TIMEOUT_S = 60
WORLD_TIMEOUT_S = 300
STRATEGIES = ("stream", "torch") if TRITON_RUNS else ("torch",)
OPTIONS = [
    {},
    {"label_smoothing": 0.1, "z_loss": 1e-3},
    {"weight": True, "label_smoothing": 0.2},
    {"softcap": 6.0, "temperature": 0.8, "weight": True},
]


def _case(seed, rows, classes, dtype, ignore_every=4):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, classes, generator=gen, dtype=torch.float64) * 3).to(dtype)
    target = torch.randint(0, classes, (rows,), generator=gen)
    target[::ignore_every] = -100
    weight = torch.rand(classes, generator=gen) + 0.5
    upstream = torch.randn(rows, generator=gen, dtype=torch.float64)
    return x, target, weight, upstream


def _compare(rank, world, x, target, upstream, dtype, strategy, what, **options):
    from onlinesoftmax.distributed import cross_entropy

    start, stop = shard_bounds(x.shape[1], world, rank)
    x64 = x.double().requires_grad_()
    ref = reference(x64, target, **options)
    g = upstream if options.get("reduction") == "none" else torch.tensor(0.75, dtype=torch.float64)
    (ref * g).sum().backward()
    shard = x[:, start:stop].to(DEVICE).requires_grad_()
    device_options = {k: (v.to(DEVICE) if torch.is_tensor(v) else v) for k, v in options.items()}
    loss, lse = cross_entropy(shard, target.to(DEVICE), strategy=strategy, return_lse=True, **device_options)
    (loss * g.to(loss.dtype).to(DEVICE)).sum().backward()
    assert gathered_equal_everywhere(loss) and gathered_equal_everywhere(lse), f"{what}: ranks differ"
    assert_matches(loss.detach(), ref.detach(), dtype, f"{what} loss (rank {rank})")
    assert_matches(lse, torch.logsumexp(_transformed(x64.detach(), options), -1), torch.float32, f"{what} lse")
    assert_matches(shard.grad, x64.grad[:, start:stop], dtype, f"{what} grad (rank {rank})")


def _transformed(x, options):
    if options.get("softcap"):
        x = options["softcap"] * torch.tanh(x / options["softcap"])
    return x / options.get("temperature", 1.0)


# --------------------------------------------------------------------------------------------
# Checks run inside the worlds
# --------------------------------------------------------------------------------------------


def check_options_and_reductions(rank, world, seed):
    for strategy in STRATEGIES:
        for dtype in (torch.float32, torch.bfloat16):
            x, target, weight, upstream = _case(seed, 9, 61, dtype)
            for options in OPTIONS:
                options = dict(options)
                if options.pop("weight", False):
                    options["weight"] = weight
                for reduction in ("mean", "sum", "none"):
                    _compare(rank, world, x, target, upstream, dtype, strategy,
                             f"{strategy} {dtype} {options.keys()} {reduction}", reduction=reduction, **options)


def check_edge_rows_and_validate_false(rank, world, seed):
    from onlinesoftmax.distributed import cross_entropy
    from onlinesoftmax.ops.cross_entropy import plan

    for strategy in STRATEGIES:
        # Every row ignored: torch's NaN "mean", 0 "sum", zero gradient.
        x, target, _, upstream = _case(seed, 4, 20, torch.float32)
        target[:] = -100
        shard = x[:, slice(*shard_bounds(20, world, rank))].to(DEVICE).requires_grad_()
        loss = cross_entropy(shard, target.to(DEVICE), strategy=strategy)
        assert torch.isnan(loss)
        cross_entropy(shard, target.to(DEVICE), strategy=strategy, reduction="sum").backward()
        assert torch.equal(shard.grad, torch.zeros_like(shard))
        # -inf logits, targets at the shards' edges, and the reused offsets of validate=False.
        x, target, _, upstream = _case(seed + 1, 6, 30, torch.float32, ignore_every=5)
        x[1, :] = float("-inf")
        x[2, 3:27] = float("-inf")
        target[2] = 0
        target[3] = 29
        _compare(rank, world, x, target, upstream, torch.float32, strategy, "edges", reduction="none",
                 label_smoothing=0.1)
        for validate in (True, False, False):
            shard = x[:, slice(*shard_bounds(30, world, rank))].to(DEVICE)
            out = cross_entropy(shard, target.to(DEVICE), strategy=strategy, reduction="none", validate=validate)
            assert_matches(out, reference(x, target, reduction="none"), torch.float32, f"validate={validate}")
        if strategy == "stream" and shard_bounds(30, world, rank)[1] > shard_bounds(30, world, rank)[0]:
            assert plan.last_plan().op == "stats"


def check_autocast_loss_dtype(rank, world, seed):
    # Inside an autocast region the loss is float32, as F.cross_entropy's; the shard's gradient
    # stays in its dtype.
    from onlinesoftmax.distributed import cross_entropy

    x, target, _, _ = _case(seed, 7, 41, torch.bfloat16)
    shard = x[:, slice(*shard_bounds(41, world, rank))].to(DEVICE).requires_grad_()
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        expected = torch.nn.functional.cross_entropy(x.to(DEVICE), target.to(DEVICE)).dtype
        loss = cross_entropy(shard, target.to(DEVICE))
    assert loss.dtype == expected == torch.float32, f"loss {loss.dtype}, torch {expected}"
    x64 = x.double().requires_grad_()
    ref = reference(x64, target)
    ref.backward()
    loss.backward()
    assert_matches(loss.detach(), ref.detach(), torch.float32, "autocast loss")
    assert shard.grad.dtype == torch.bfloat16
    assert_matches(shard.grad, x64.grad[:, slice(*shard_bounds(41, world, rank))], torch.bfloat16, "autocast grad")


def check_mismatched_shards_raise_everywhere(rank, world, seed):
    from onlinesoftmax.distributed import cross_entropy

    rows = 5 if rank == 0 else 6
    shard = torch.randn(rows, 7, device=DEVICE)
    with pytest.raises(ValueError, match="same size on every rank"):
        cross_entropy(shard, torch.zeros(rows, dtype=torch.int64, device=DEVICE))
    if DEVICE.type == "cpu":  # (on CUDA a target out of range gives a NaN loss: no host sync to check it)
        with pytest.raises(ValueError, match="out of range"):  # the same targets on every rank: all raise
            cross_entropy(torch.randn(2, 7, device=DEVICE), torch.tensor([0, 7 * world], device=DEVICE))


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3])
def test_vocabulary_parallel_cross_entropy(world, gen):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    # Autocast's loss dtype does not depend on how the classes are split: world 2 only (CI's time).
    autocast = ["check_autocast_loss_dtype"] if world == 2 else []
    run_world(world, __name__, ["check_options_and_reductions", "check_edge_rows_and_validate_false",
                                "check_mismatched_shards_raise_everywhere"] + autocast, seed)


def test_needs_an_initialized_process_group():
    from onlinesoftmax.distributed import cross_entropy

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="not initialized"):
        cross_entropy(torch.randn(2, 5), torch.tensor([0, 1]))


def test_refuses_float64_shards():
    # Before the process group: the dtype check comes first. onlinesoftmax.cross_entropy takes
    # float64 (torch's kernels); the vocabulary-parallel one, whose exchange is float32, refuses it.
    from onlinesoftmax.distributed import cross_entropy

    with pytest.raises(TypeError, match="float64"):
        cross_entropy(torch.randn(2, 5, dtype=torch.float64), torch.tensor([0, 1]))
