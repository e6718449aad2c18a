"""Benchmark of the sharded ops: softmax, softmax_topk and cross_entropy over a dimension split across GPUs.

Run under torchrun, one GPU per rank (rank 0 writes the results)::

    torchrun --nproc-per-node 2 -m onlinesoftmax bench distributed --dtype bf16

For each shape, every rank holds an even shard of the last dim and these are timed (CUDA events
around a loop of calls, ranks started together by a barrier; the slowest rank's mean counts):

* ``sharded total``: :func:`onlinesoftmax.distributed.softmax` (or ``softmax_topk``) end to end,
  one collective per call (``validate=False``);
* ``local kernels``: the same call's per-rank compute alone (the partials kernel and the normalize
  kernel fed with every rank's pair; for top-k, the shard's partials and the merge of every
  rank's);
* ``collective``: the all_gather of the same payload alone (8 bytes per row for softmax);
* ``gather + single-GPU``: all_gather the shards, then the single-GPU op on the whole row;
* ``single-GPU whole``: the single-GPU op on the whole tensor on one GPU (no communication).

Each is also replayed from a CUDA graph of one call on every rank (the "graph ms" column: what a
captured training step or serving loop sees, without the host's launches), None where a rank
could not capture it.

cross_entropy (the vocabulary sharded, Megatron's layout) times one training step of a 'mean' loss,
the forward and the gradient of the logits, with the same ``sharded total``, ``collective`` (its 16
bytes a row), ``gather + single-GPU`` and ``single-GPU whole``, and instead of ``local kernels``:

* ``shard alone``: :func:`onlinesoftmax.cross_entropy` over this rank's shard as if it were the
  whole vocabulary (the local bytes, no collective);
* ``megatron (torch ops)``: Megatron-LM's vocabulary-parallel algorithm written in torch ops, as its
  ``_VocabParallelCrossEntropy`` runs it: the logits in float32 (its default), three all_reduces
  (the max, the target's logit, the sum of exponentials), the gradient from the saved
  exponentials.

Targets (issue 7): the collective adds <= 30 us per call, and ``sharded total`` beats
``gather + single-GPU``.
"""

from __future__ import annotations

import datetime
import os
from typing import Optional

import torch
import torch.distributed as dist

from . import harness
from .shapes import parse_dims

DEFAULT_SHAPES = [(64, 262144), (8, 1048576)]
CROSS_ENTROPY_SHAPES = [(8192, 128256), (4096, 256000)]
TOPK_K = 50
# Keep NVLink multicast off (the lent machines require it; harmless elsewhere).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _init() -> bool:
    if dist.is_initialized():
        return True
    if "RANK" not in os.environ or not torch.cuda.is_available():
        print("the distributed suite runs under torchrun with one GPU per rank, e.g.\n"
              "  torchrun --nproc-per-node 2 -m onlinesoftmax bench distributed --dtype bf16")
        return False
    for key, value in NCCL_ENV.items():
        os.environ.setdefault(key, value)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120),
                            device_id=torch.device("cuda", local_rank))
    return True


def _timed_ms(fn, reps: int = 50, warmup: int = 10) -> float:
    """Mean ms per call on the slowest rank, the ranks released together by a barrier."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    ms = torch.tensor([start.elapsed_time(end) / reps], device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def _graph_ms(fn, reps: int = 20) -> Optional[float]:
    """Mean ms a call replayed from a CUDA graph of one call, the slower rank's; None where any
    rank could not capture it, and then no rank replays (one rank's collective alone would hang)."""
    graph = None
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # allocations and compilations outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
    except Exception:  # an op that synchronizes or allocates in a way capture forbids
        graph = None
    torch.cuda.synchronize()
    captured = torch.tensor([graph is not None], dtype=torch.int32, device="cuda")
    dist.all_reduce(captured, op=dist.ReduceOp.MIN)
    if not captured.item():
        return None
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    ms = torch.tensor([start.elapsed_time(end) / reps], device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    del graph
    return ms.item()


def _rows_for(label, dtype, op, x_full, shard, world, rank):
    import onlinesoftmax
    from onlinesoftmax import distributed

    from onlinesoftmax.distributed._group import all_gather
    from onlinesoftmax.distributed.topk import shard_payload
    from onlinesoftmax.ops.softmax import launch as softmax_rows
    from onlinesoftmax.ops.topk import launch as topk_launch

    rows_n, n_local = shard.shape

    def gather_then_single():
        whole = all_gather(shard, None).permute(1, 0, 2).reshape(rows_n, world * n_local)
        return onlinesoftmax.softmax(whole) if op == "softmax" else onlinesoftmax.softmax_topk(whole, TOPK_K)

    if op == "softmax":
        x2 = shard.contiguous()
        pairs = all_gather(softmax_rows.row_normalizers(x2), None)
        payload = torch.empty(2 * rows_n, dtype=torch.float32, device="cuda")

        def local_kernels():
            softmax_rows.row_normalizers(x2)
            return softmax_rows.normalize_rows(x2, pairs, False)

        impls = {
            "sharded total": lambda: distributed.softmax(shard, -1, validate=False),
            "local kernels": local_kernels,
            "single-GPU whole": lambda: onlinesoftmax.softmax(x_full),
        }
        out = distributed.softmax(shard, -1)
        ref = torch.softmax(x_full.double(), -1).narrow(1, rank * n_local, n_local)
        err = harness.relative_error(out, ref)
        moved = x_full.numel() * dtype.itemsize * 2  # read x and write y once, over all ranks
    else:
        x2 = shard.contiguous()
        payload, keys, part_m, part_d = shard_payload(x2, TOPK_K, 1.0)
        gathered = all_gather(payload, None)

        def local_kernels():
            topk_launch.launch_shard_partial(x2, TOPK_K, 1.0, keys, part_m, part_d)
            return topk_launch.launch_shard_merge(gathered, rows_n, TOPK_K, x2.dtype, write_lse=False)

        impls = {
            "sharded total": lambda: distributed.softmax_topk(shard, TOPK_K, -1, validate=False),
            "local kernels": local_kernels,
            "single-GPU whole": lambda: onlinesoftmax.softmax_topk(x_full, TOPK_K),
        }
        values, indices = distributed.softmax_topk(shard, TOPK_K, -1)
        probs = torch.softmax(x_full.double(), -1)
        err = harness.relative_error(values, probs.gather(-1, indices))
        moved = x_full.numel() * dtype.itemsize
    impls["collective"] = lambda: all_gather(payload, None)
    impls["gather + single-GPU"] = gather_then_single
    status = "ok" if err <= harness.tolerance(dtype) else "WRONG"
    rows = []
    for name, fn in impls.items():
        ms = _timed_ms(fn)
        counts_bytes = name not in ("collective",)
        rows.append(harness.Row(case=f"{op} {label}", dtype=str(dtype).replace("torch.", ""), direction="forward",
                                impl=name, ms=ms, gbs=harness.gbs(moved, ms) if counts_bytes else None,
                                graph_ms=_graph_ms(fn), rel_error=err if name == "sharded total" else None,
                                status=status))
    return rows


def _megatron_step(shard, target, lo, world):
    """Megatron-LM's vocabulary-parallel cross-entropy, forward and the logits' gradient, in torch ops."""
    rows, n_local = shard.shape
    x = shard.to(torch.float32, copy=True)  # Megatron subtracts the max in place
    x_max = x.amax(-1)
    dist.all_reduce(x_max, op=dist.ReduceOp.MAX)
    x -= x_max.unsqueeze(-1)
    here = (target >= lo) & (target < lo + n_local)
    local_target = torch.where(here, target - lo, 0)
    predicted = x.gather(-1, local_target.unsqueeze(-1)).squeeze(-1) * here
    dist.all_reduce(predicted)
    exp = x.exp_()
    sum_exp = exp.sum(-1)
    dist.all_reduce(sum_exp)
    loss = (sum_exp.log() - predicted).mean()
    grad = exp.div_(sum_exp.unsqueeze(-1))
    grad[torch.arange(rows, device=grad.device), local_target] -= here.float()
    return loss, grad.mul_(1.0 / rows).to(shard.dtype)


def _cross_entropy_rows(label, dtype, x_full, shard, world, rank, seed):
    import onlinesoftmax
    from onlinesoftmax import distributed

    from onlinesoftmax.distributed._group import all_gather

    rows_n, n_local = shard.shape
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    target = torch.randint(0, x_full.shape[1], (rows_n,), generator=gen, device="cuda")
    leaf, whole_leaf = shard.detach().requires_grad_(), x_full.detach().requires_grad_()
    lo = rank * n_local

    def step(fn, x):
        loss = fn(x)
        return loss, torch.autograd.grad(loss, x)[0]

    def gather_then_single():
        whole = all_gather(shard, None).permute(1, 0, 2).reshape(rows_n, world * n_local).requires_grad_()
        loss, grad = step(lambda w: onlinesoftmax.cross_entropy(w, target), whole)
        return loss, grad[:, lo:lo + n_local]

    impls = {
        "sharded total": lambda: step(lambda s: distributed.cross_entropy(s, target, validate=False), leaf),
        "shard alone": lambda: step(lambda s: onlinesoftmax.cross_entropy(s, target.remainder(n_local)), leaf),
        "megatron (torch ops)": lambda: _megatron_step(shard, target, lo, world),
        "collective": lambda: all_gather(torch.empty((4, rows_n), dtype=torch.float32, device="cuda"), None),
        "gather + single-GPU": gather_then_single,
        "single-GPU whole": lambda: step(lambda w: onlinesoftmax.cross_entropy(w, target), whole_leaf),
    }
    x64 = x_full.double().requires_grad_()
    ref_loss = torch.nn.functional.cross_entropy(x64, target)
    ref_grad = torch.autograd.grad(ref_loss, x64)[0][:, lo:lo + n_local]
    errors = {}
    for name in ("sharded total", "megatron (torch ops)"):
        loss, grad = impls[name]()
        errors[name] = max(harness.relative_error(loss, ref_loss), harness.relative_error(grad, ref_grad))
    del x64, ref_grad
    status = "ok" if errors["sharded total"] <= harness.tolerance(dtype) else "WRONG"
    moved = 3 * x_full.numel() * dtype.itemsize  # the logits read twice, the gradient written once
    rows = []
    for name, fn in impls.items():
        ms = _timed_ms(fn)
        rows.append(harness.Row(case=f"cross_entropy {label}", dtype=str(dtype).replace("torch.", ""),
                                direction="forward+backward", impl=name, ms=ms,
                                gbs=None if name == "collective" else harness.gbs(moved, ms), graph_ms=_graph_ms(fn),
                                rel_error=errors.get(name), status=status))
    return rows


def _us(ms: Optional[float]) -> Optional[float]:
    return None if ms is None else 1e3 * ms


def _shown(us: Optional[float]) -> str:
    return "not captured" if us is None else f"{us:.1f} us"


def run(args) -> int:
    if not _init():
        return 2
    rank, world = dist.get_rank(), dist.get_world_size()
    # Every rank draws the same logits from rank 0's seed: the default seed is the clock's, read by
    # each process on its own.
    seed = torch.tensor([args.seed], dtype=torch.int64, device="cuda")
    dist.broadcast(seed, 0)
    args.seed = int(seed.item())
    if args.shape:  # every op at the shapes asked for
        cases = [(("softmax", "softmax_topk", "cross_entropy"), *parse_dims(s, 2)) for s in args.shape]
    else:
        cases = ([(("softmax", "softmax_topk"), *shape) for shape in DEFAULT_SHAPES]
                 + [(("cross_entropy",), *shape) for shape in CROSS_ENTROPY_SHAPES])
    dtypes = [DTYPES[d] for d in (args.dtype or "fp32,bf16").split(",")]
    rows = []
    for dtype in dtypes:
        for ops, n_rows, n_cols in cases:
            if n_cols % world:
                raise ValueError(f"the benchmark splits the columns evenly: {n_cols} is not a multiple of {world}")
            gen = torch.Generator(device="cuda").manual_seed(args.seed)
            x_full = (torch.randn((n_rows, n_cols), generator=gen, device="cuda") * 3).to(dtype)
            n_local = n_cols // world
            shard = x_full[:, rank * n_local:(rank + 1) * n_local].contiguous()
            for op in ops:
                if op == "cross_entropy":
                    rows += _cross_entropy_rows(f"{n_rows}x{n_cols}", dtype, x_full, shard, world, rank, args.seed)
                else:
                    rows += _rows_for(f"{n_rows}x{n_cols}", dtype, op, x_full, shard, world, rank)
            del x_full, shard
    by_case, graphs = {}, {}
    for r in rows:
        by_case.setdefault((r.case, r.dtype), {})[r.impl] = r.ms
        graphs.setdefault((r.case, r.dtype), {})[r.impl] = r.graph_ms
    summary = {f"{case} {dt}": {"collective_us": 1e3 * t["collective"],
                                "sharded_total_us": 1e3 * t["sharded total"],
                                "gather_single_us": 1e3 * t["gather + single-GPU"],
                                "collective_le_30us": t["collective"] * 1e3 <= 30.0,
                                "sharded_beats_gather": t["sharded total"] < t["gather + single-GPU"],
                                "graph_sharded_total_us": _us(graphs[(case, dt)]["sharded total"]),
                                "graph_gather_single_us": _us(graphs[(case, dt)]["gather + single-GPU"])}
               for (case, dt), t in by_case.items()}
    if rank == 0:
        notes = (f"{world} ranks, even shards of the last dim, NCCL; k = {TOPK_K} for top-k. GB/s counts one read "
                 "of the whole input (and one write of the output for softmax) over all ranks; for cross_entropy "
                 "(a training step: the loss and the logits' gradient) two reads of the logits and one write of "
                 "the gradient. 'megatron (torch ops)': Megatron-LM's vocabulary-parallel algorithm in torch ops "
                 "(float32 logits, three all_reduces).\n\n"
                 + "\n".join(f"- {case}: collective {s['collective_us']:.1f} us, sharded total "
                             f"{s['sharded_total_us']:.1f} us, gather + single-GPU {s['gather_single_us']:.1f} us; "
                             f"under CUDA graphs {_shown(s['graph_sharded_total_us'])} and "
                             f"{_shown(s['graph_gather_single_us'])}"
                             for case, s in summary.items()))
        harness.write_results(args, "distributed", rows, None, notes, {"world_size": world, "summary": summary})
    dist.barrier()
    dist.destroy_process_group()
    return 1 if any(r.status != "ok" for r in rows) else 0
