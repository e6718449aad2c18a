"""``onlinesoftmax bench cross_entropy``, ``bench cross_entropy_probabilities`` and ``bench
linear_cross_entropy``: forward + backward time and peak memory against torch eager, torch.compile,
Liger and Quack (and for the linear loss torch's own chunked ``F.linear_cross_entropy``, from torch
2.13); probability targets against torch eager and torch.compile alone, their forward timed too.

Every implementation runs one training step's worth of the loss: the forward and the gradient
(``torch.autograd.grad``), on inputs that require grad, with "mean" reduction. Implementations
that overwrite the logits with their gradient (ours with ``inplace_backward=True``, Liger's, Quack's
``inplace_backward=True``) each get a case of their own inputs, so that none of them is checked on
logits that another has overwritten (their timed repetitions then run on gradient values: the
same work). Peak memory is measured in one untimed call (``harness.peak_memory_mb``): what the
step allocates above its inputs, the gradient it returns included.
"""

from __future__ import annotations

import importlib
import torch
import torch.nn.functional as F

from . import harness
from .shapes import parse_dims, sweep_shapes_asked
from .sweep_suite import random_shapes
from .harness import Case, Implementation

# Rows x vocabulary: Llama 2 32000, GPT-2 50257 (rows that start inside 16-byte vectors), Llama 3
# 128256 (the issue's 8192-row case), Qwen 2 151936, Gemma 256000; 1024 to 32768 rows. fp32
# takes the cases of at most 4.3 GB of logits (F.cross_entropy's own temporaries triple that).
GRID = {
    torch.bfloat16: [(8192, 32000), (32768, 32000), (8192, 50257), (16384, 50257), (1024, 128256), (8192, 128256),
                     (16384, 128256), (8192, 151936), (4096, 256000), (8192, 256000)],
    torch.float32: [(8192, 32000), (8192, 50257), (8192, 128256), (8192, 151936), (4096, 256000)],
}
# linear_cross_entropy: (rows, hidden, vocabulary); the issue's case and two smaller ones.
LINEAR_GRID = [(8192, 4096, 128256), (4096, 2048, 32000), (8192, 4096, 50257)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DIRECTION = "forward+backward"
# Gradient rows compared with the reference (the loss uses every row): enough to catch a wrong
# kernel, few enough for a float64 reference of the largest cases.
CHECKED_ROWS = 64
REFERENCE_CHUNK_ROWS = 1024


def _optional(module: str):
    try:
        return importlib.import_module(module), ""
    except Exception as exc:  # ImportError, or a peer whose own dependencies fail to load
        first_line = str(exc).splitlines()[0][:80] if str(exc) else ""
        return None, f"{module} not importable ({type(exc).__name__}: {first_line})"


def _compiled(fn):
    import torch._dynamo

    for knob in ("cache_size_limit", "recompile_limit"):  # one graph per shape
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    return torch.compile(fn, dynamic=False)


# --------------------------------------------------------------------------------------------
# cross_entropy
# --------------------------------------------------------------------------------------------


def case(shape, dtype, device="cuda") -> Case:
    """Logits (rows, V) that require grad and their targets; checked: the loss and the first
    CHECKED_ROWS rows of the gradient (times the rows, for "mean": entries of order 1)."""
    rows, vocab = shape

    def make(gen):
        drawn = harness.device_generator(gen, device)
        x = (torch.randn(shape, generator=drawn, device=device) * 2.0).to(dtype)
        target = torch.randint(0, vocab, (rows,), generator=drawn, device=device)
        return x.requires_grad_(), target

    def reference(inputs):
        x, target = inputs[0].detach(), inputs[1]
        total = torch.zeros((), dtype=torch.float64, device=x.device)
        for start in range(0, rows, REFERENCE_CHUNK_ROWS):
            total += F.cross_entropy(x[start:start + REFERENCE_CHUNK_ROWS].double(),
                                     target[start:start + REFERENCE_CHUNK_ROWS], reduction="sum")
        head = x[:CHECKED_ROWS].double()
        grad = torch.softmax(head, -1)
        grad[torch.arange(head.shape[0], device=x.device), target[:CHECKED_ROWS]] -= 1
        return torch.cat([(total / rows).reshape(1), grad.reshape(-1)])

    # The fused floor: the logits read once and the gradient written once.
    return Case(f"{rows}x{vocab}", dtype, DIRECTION, 2 * rows * vocab * dtype.itemsize, make, reference,
                peak_memory=True)


def _check(out, inputs):
    loss, grad = out
    return torch.cat([loss.detach().double().reshape(1), grad[:CHECKED_ROWS].double().reshape(-1) * grad.shape[0]])


def _step(loss_fn):
    """One training step of the loss: (loss, d loss / d logits)."""

    def step(x, target):
        loss = loss_fn(x, target)
        (grad,) = torch.autograd.grad(loss, x)
        return loss, grad

    return step


def implementation_groups() -> list[list[Implementation]]:
    """Implementations in groups that may share inputs: each one that overwrites its logits alone."""
    from ..ops.cross_entropy import cross_entropy

    shared = [
        Implementation("torch", _step(F.cross_entropy), check=_check),
        Implementation("torch.compile", _step(_compiled(lambda x, t: F.cross_entropy(x, t))), check=_check),
    ]
    quack, why = _optional("quack.cross_entropy")
    shared.append(Implementation("quack", _step(lambda x, t: quack.cross_entropy(x, t)), check=_check) if quack
                  else Implementation("quack", skipped=why))
    shared.append(Implementation("onlinesoftmax", _step(lambda x, t: cross_entropy(x, t)), check=_check))
    # The logits kept, their gradient written by the forward (for the step's upstream gradient of 1).
    shared.append(Implementation("onlinesoftmax gradient_in_forward",
                                 _step(lambda x, t: cross_entropy(x, t, gradient_in_forward=True)), check=_check))
    groups = [shared, [Implementation("onlinesoftmax inplace",
                                      _step(lambda x, t: cross_entropy(x, t, inplace_backward=True)), check=_check)]]
    liger, why = _optional("liger_kernel.transformers")
    groups.append([Implementation("liger", _step(liger.LigerCrossEntropyLoss()), check=_check) if liger
                   else Implementation("liger", skipped=why)])
    if quack:
        groups.append([Implementation("quack inplace",
                                      _step(lambda x, t: quack.cross_entropy(x, t, inplace_backward=True)),
                                      check=_check)])
    return groups


def _floor_notes(rows, cases, copy_gbs) -> tuple[str, list]:
    """Per case: the two floors, ours (the three modes), the best peer, and peak memory."""
    lines = ["| dtype | case | fused floor ms | separate floor ms | ours inplace ms | ours ms | "
             "ours gradient_in_forward ms | best peer | peer ms | ours inplace / peer | "
             "peak MB ours inplace / ours / peer |", "|---" * 11 + "|"]
    summary = []
    for dtype, (n, v) in cases:
        name, label = str(dtype).replace("torch.", ""), f"{n}x{v}"
        sel = {r.impl: r for r in rows if r.case == label and r.dtype == name and r.ms}
        fused = 2 * n * v * dtype.itemsize / (copy_gbs * 1e9) * 1e3
        peers = [r for impl, r in sel.items() if not impl.startswith("onlinesoftmax") and r.status == "ok"]
        best = min(peers, key=lambda r: r.ms, default=None)
        inplace, ours = sel.get("onlinesoftmax inplace"), sel.get("onlinesoftmax")
        in_forward = sel.get("onlinesoftmax gradient_in_forward")
        entry = {"dtype": name, "case": label, "fused_floor_ms": fused, "separate_floor_ms": 1.5 * fused,
                 "ours_inplace_ms": inplace.ms if inplace else None, "ours_ms": ours.ms if ours else None,
                 "ours_gradient_in_forward_ms": in_forward.ms if in_forward else None,
                 "best_peer": best.impl if best else None, "best_peer_ms": best.ms if best else None}
        summary.append(entry)
        fmt = harness._fmt
        peaks = " / ".join(fmt(r.peak_mb if r else None, ".0f") for r in (inplace, ours, best))
        lines.append(f"| {name} | {label} | {fused:.3f} | {1.5 * fused:.3f} | {fmt(entry['ours_inplace_ms'], '.3f')} | "
                     f"{fmt(entry['ours_ms'], '.3f')} | {fmt(entry['ours_gradient_in_forward_ms'], '.3f')} | "
                     f"{entry['best_peer'] or ''} | "
                     f"{fmt(entry['best_peer_ms'], '.3f')} | "
                     f"{fmt(best.ms / inplace.ms if best and inplace else None, '.2f')} | {peaks} |")
    return "\n".join(lines), summary


def run(args) -> int:
    """``onlinesoftmax bench cross_entropy``: the grid, bf16 and fp32, every peer; writes the results."""
    dtypes = [DTYPES[d] for d in (args.dtype or "bf16,fp32").split(",")]
    gen = torch.Generator().manual_seed(args.seed)
    print(f"seed {args.seed}; measuring device copy bandwidth ...", flush=True)
    copy_gbs = harness.copy_bandwidth_gbs()
    groups = implementation_groups()
    cases, rows = [], []
    for dtype in dtypes:
        shapes = [parse_dims(t, 2) for t in args.shape] if args.shape else GRID.get(dtype, GRID[torch.float32])
        for shape in shapes:
            cases.append((dtype, shape))
            measured = []
            for impls in groups:
                measured += harness.run_cases("cross_entropy", [case(shape, dtype)], {DIRECTION: impls}, gen,
                                              graph_timing=not args.no_graph)
            harness.report_case(f"{str(dtype)[6:]} {shape[0]}x{shape[1]}", measured)
            rows += measured
            torch.cuda.empty_cache()
    harness.finish_rows(rows, copy_gbs)
    rows, earlier_runs = harness.merge_with_previous(args, "cross_entropy", rows)
    cases = list(dict.fromkeys((getattr(torch, r.dtype), parse_dims(r.case, 2)) for r in rows))
    table, summary = _floor_notes(rows, cases, copy_gbs)
    notes = ("One training step of a 'mean' loss: forward, then the gradient of the logits. GB/s against the fused "
             "floor (logits read once, gradient written once); the separate floor reads the logits twice. "
             "'peak MB': what one step allocates above its inputs (the returned gradient included; the in-place "
             "implementations return the logits' own storage). Implementations that overwrite the logits ran on "
             "inputs of their own.\n\n" + table)
    harness.write_results(args, "cross_entropy", rows, copy_gbs, notes, {"floors": summary}, earlier_runs)
    return harness.exit_code(rows)


def _measure(suite: str, dtypes, shapes_of, cases_of, impls: dict, gen, graph_timing: bool) -> list:
    """Every dtype's shapes (``shapes_of(dtype)``), each shape's cases (``cases_of(shape, dtype)``)
    against the implementations of their direction, reported as each shape finishes."""
    rows = []
    for dtype in dtypes:
        for shape in shapes_of(dtype):
            measured = harness.run_cases(suite, cases_of(shape, dtype), impls, gen, graph_timing=graph_timing)
            harness.report_case(f"{str(dtype)[6:]} {'x'.join(map(str, shape))}", measured)
            rows += measured
            torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------
# cross_entropy of probability targets
# --------------------------------------------------------------------------------------------

# Soft targets (distillation) of the logits' dtype: vocabularies as GRID's and odd sizes, few and
# many rows; fp32 up to 2.1 GB of logits (torch's own path keeps four tensors of their shape).
PROBABILITY_GRID = {
    torch.bfloat16: [(8192, 32000), (8192, 50257), (8192, 128256), (1024, 151936), (64, 256000), (2049, 32003),
                     (32, 1000)],
    torch.float32: [(8192, 32000), (4096, 128256), (777, 50257), (32, 1000)],
}
PROBABILITY_DIRECTIONS = ("forward", "forward+backward")


def probability_case(shape, dtype, direction, device="cuda") -> Case:
    """Logits (rows, V) and probability targets (a softmax, in the logits' dtype) with a "mean"
    loss; forward + backward also checks the first CHECKED_ROWS rows of the logits' gradient."""
    rows, vocab = shape

    def make(gen):
        drawn = harness.device_generator(gen, device)
        x = (torch.randn(shape, generator=drawn, device=device) * 2.0).to(dtype)
        p = torch.softmax(torch.randn(shape, generator=drawn, device=device), -1).to(dtype)
        return x.requires_grad_(direction != "forward"), p

    def reference(inputs):
        x, p = inputs[0].detach(), inputs[1]
        total = torch.zeros((), dtype=torch.float64, device=x.device)
        for start in range(0, rows, REFERENCE_CHUNK_ROWS):
            chunk = slice(start, start + REFERENCE_CHUNK_ROWS)
            total += F.cross_entropy(x[chunk].double(), p[chunk].double(), reduction="sum")
        loss = (total / rows).reshape(1)
        if direction == "forward":
            return loss
        head, q = x[:CHECKED_ROWS].double(), p[:CHECKED_ROWS].double()
        return torch.cat([loss, (torch.softmax(head, -1) * q.sum(-1, keepdim=True) - q).reshape(-1)])

    # The floor: the logits and targets read once (and the gradient written once).
    reads = 2 * rows * vocab * dtype.itemsize
    return Case(f"{rows}x{vocab}", dtype, direction, reads if direction == "forward" else reads * 3 // 2, make,
                reference, peak_memory=True)


def probability_implementations() -> dict[str, list[Implementation]]:
    from ..ops.cross_entropy import cross_entropy

    def forward(loss_fn):
        def call(x, p):
            with torch.no_grad():
                return loss_fn(x, p)
        return call

    def check_forward(out, inputs):
        return out.detach().double().reshape(1)

    impls = {}
    for direction in PROBABILITY_DIRECTIONS:
        wrap, check = (forward, check_forward) if direction == "forward" else (_step, _check)
        impls[direction] = [
            Implementation("torch", wrap(F.cross_entropy), check=check),
            Implementation("torch.compile", wrap(_compiled(lambda x, p: F.cross_entropy(x, p))), check=check),
            Implementation("onlinesoftmax", wrap(lambda x, p: cross_entropy(x, p)), check=check),
        ]
    return impls


def run_probabilities(args) -> int:
    """``onlinesoftmax bench cross_entropy_probabilities``: probability targets, forward and forward
    + backward, against torch eager and torch.compile (Liger and Quack take class indices only), on
    PROBABILITY_GRID or the --shape cases, with --random's seeded shapes (the softmax sweep's)."""
    dtypes = [DTYPES[d] for d in (args.dtype or "bf16,fp32").split(",")]
    gen = torch.Generator().manual_seed(args.seed)
    print(f"seed {args.seed}; measuring device copy bandwidth ...", flush=True)
    copy_gbs = harness.copy_bandwidth_gbs()
    rows = _measure("cross_entropy_probabilities", dtypes, lambda dtype: sweep_shapes_asked(
        args, 2, random_shapes, lambda quick, n, seed: PROBABILITY_GRID[dtype] + random_shapes(n, seed)),
        lambda shape, dtype: [probability_case(shape, dtype, direction) for direction in PROBABILITY_DIRECTIONS],
        probability_implementations(), gen, not args.no_graph)
    harness.finish_rows(rows, copy_gbs)
    rows, earlier_runs = harness.merge_with_previous(args, "cross_entropy_probabilities", rows)
    notes = ("A 'mean' loss of probability targets (a softmax in the logits' dtype): the forward without "
             "autograd, and a training step (forward, then the gradient of the logits). GB/s against the floor: "
             "the logits and targets read once (the gradient written once); ours reads both again for the "
             "backward. 'peak MB': what one call allocates above its inputs (the gradient included).")
    harness.write_results(args, "cross_entropy_probabilities", rows, copy_gbs, notes, None, earlier_runs)
    return harness.exit_code(rows)


# --------------------------------------------------------------------------------------------
# linear_cross_entropy
# --------------------------------------------------------------------------------------------


def linear_case(shape, dtype, device="cuda") -> Case:
    """Hidden states h (rows, H) and the projection W (V, H), both requiring grad; checked: the loss,
    the first CHECKED_ROWS rows of grad h and of grad W (times the rows: entries of order 1)."""
    rows, hidden, vocab = shape

    def make(gen):
        drawn = harness.device_generator(gen, device)
        h = torch.randn((rows, hidden), generator=drawn, device=device).to(dtype)
        w = (torch.randn((vocab, hidden), generator=drawn, device=device) / hidden ** 0.5 * 2).to(dtype)
        target = torch.randint(0, vocab, (rows,), generator=drawn, device=device)
        return h.requires_grad_(), w.requires_grad_(), target

    def reference(inputs):
        # float32 (TF32 off: torch's default for matmuls) in chunks of rows, float64 sums.
        h, w, target = inputs[0].detach().float(), inputs[1].detach().float(), inputs[2]
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        grad_w = torch.zeros((min(CHECKED_ROWS, vocab), hidden), dtype=torch.float64, device=h.device)
        grad_h = None
        for start in range(0, rows, REFERENCE_CHUNK_ROWS):
            h_chunk, t_chunk = h[start:start + REFERENCE_CHUNK_ROWS], target[start:start + REFERENCE_CHUNK_ROWS]
            logits = h_chunk @ w.T
            total += F.cross_entropy(logits, t_chunk, reduction="sum").double()
            dlogits = torch.softmax(logits, -1)
            dlogits[torch.arange(h_chunk.shape[0], device=h.device), t_chunk] -= 1
            if grad_h is None:
                grad_h = dlogits[:CHECKED_ROWS].double() @ w.double()
            grad_w += dlogits[:, :CHECKED_ROWS].double().T @ h_chunk.double()
        return torch.cat([(total / rows).reshape(1), grad_h.reshape(-1), grad_w.reshape(-1)])

    flops = 3 * 2 * rows * hidden * vocab  # logits, grad h, grad W
    bytes_moved = (rows * hidden + vocab * hidden) * dtype.itemsize * 2  # h and W read, their gradients written
    return Case(f"{rows}x{hidden}:V{vocab}", dtype, DIRECTION, bytes_moved, make, reference, flops=flops,
                peak_memory=True)


def _linear_check(out, inputs):
    loss, grad_h, grad_w = out
    rows = grad_h.shape[0]
    return torch.cat([loss.detach().double().reshape(1), grad_h[:CHECKED_ROWS].double().reshape(-1) * rows,
                      grad_w[:CHECKED_ROWS].double().reshape(-1) * rows])


def _linear_step(loss_fn):
    def step(h, w, target):
        loss = loss_fn(h, w, target)
        grad_h, grad_w = torch.autograd.grad(loss, (h, w))
        return loss, grad_h, grad_w

    return step


def linear_implementations() -> list[Implementation]:
    from ..ops.cross_entropy import linear_cross_entropy

    def torch_loss(h, w, t):
        return F.cross_entropy(h @ w.T, t)

    impls = [Implementation("torch", _linear_step(torch_loss), check=_linear_check),
             Implementation("torch.compile", _linear_step(_compiled(torch_loss)), check=_linear_check)]
    # torch's own fused loss (2.13 and later): chunks of rows, its gradients computed in the forward.
    if hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions"):
        chunked = torch.nn.LinearCrossEntropyOptions()
        impls.append(Implementation("torch chunked", _linear_step(
            lambda h, w, t: F.linear_cross_entropy(h, w, t, options=chunked)), check=_linear_check))
    else:
        impls.append(Implementation("torch chunked", skipped=f"torch {torch.__version__} has no "
                                                             "F.linear_cross_entropy (2.13 and later)"))
    liger, why = _optional("liger_kernel.transformers")
    if liger:
        module = liger.LigerFusedLinearCrossEntropyLoss()
        impls.append(Implementation("liger", _linear_step(lambda h, w, t: module(w, h, t)), check=_linear_check))
    else:
        impls.append(Implementation("liger", skipped=why))
    impls.append(Implementation("quack", skipped="quack has no fused linear cross-entropy"))
    impls.append(Implementation("onlinesoftmax", _linear_step(lambda h, w, t: linear_cross_entropy(h, w, t)),
                                check=_linear_check))
    # The traced call: two custom ops, the gradients of "mean" computed in the forward one.
    impls.append(Implementation("onlinesoftmax torch.compile",
                                _linear_step(_compiled(lambda h, w, t: linear_cross_entropy(h, w, t))),
                                check=_linear_check))
    impls.append(Implementation("onlinesoftmax vocab_chunk",
                                _linear_step(lambda h, w, t: linear_cross_entropy(h, w, t, vocab_chunk="auto")),
                                check=_linear_check))
    return impls


def run_linear(args) -> int:
    """``onlinesoftmax bench linear_cross_entropy``: loss of h @ W.T, forward + backward, bf16 by default."""
    dtypes = [DTYPES[d] for d in (args.dtype or "bf16").split(",")]
    shapes = [parse_dims(t, 3) for t in args.shape] if args.shape else LINEAR_GRID
    gen = torch.Generator().manual_seed(args.seed)
    # Each set of inputs is over 1 GB (W and its gradient): two sets rotate, no more; no CUDA graphs.
    rows = _measure("linear_cross_entropy", dtypes, lambda dtype: shapes,
                    lambda shape, dtype: [linear_case(shape, dtype)], {DIRECTION: linear_implementations()}, gen, False)
    harness.finish_rows(rows, None)
    rows, earlier_runs = harness.merge_with_previous(args, "linear_cross_entropy", rows)
    notes = ("One training step of a 'mean' loss of h @ W.T: forward, then the gradients of h and W (TFLOP/s: the "
             "three matmuls, 6 N H V). 'peak MB': what one step allocates above its inputs, the gradients it returns "
             "included (grad W alone is V x H in the weight's dtype). onlinesoftmax (chunk='auto') takes the rows in "
             "chunks with an fp32 grad-W accumulator (V x H x 4 bytes; chunks of 512 MiB of logits or grad W's "
             "bytes, the larger) where that is the lower peak, else all rows as one chunk and no accumulator. "
             "onlinesoftmax vocab_chunk (vocab_chunk='auto') takes slices of the vocabulary over all the rows: no "
             "grad-W accumulator, 256 MiB of logits a slice and a float32 grad-h accumulator, four matmuls. "
             "onlinesoftmax torch.compile: the same call compiled (two custom ops, the eager call's chunks and "
             "three matmuls); see docs/perf-cross_entropy.md.")
    harness.write_results(args, "linear_cross_entropy", rows, None, notes, earlier_runs=earlier_runs)
    return harness.exit_code(rows)

