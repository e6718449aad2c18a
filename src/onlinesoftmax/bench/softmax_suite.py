"""``onlinesoftmax bench softmax``: forward and backward against every peer, on the standard grid."""

from __future__ import annotations

import importlib
import statistics
from typing import Optional

import torch

from . import harness
from .shapes import parse_dims
from .harness import Case, Implementation

# The standard grid. (1024, 32768) is the seed work log's shape; (4096, 4096) .. (65536, 256) are
# the usual training shapes from short to very short rows; the rest are LLM vocabularies
# (Llama 3 128256, Qwen 151936, Gemma 262144) at decode-sized batches, and one 16M-element row.
GRID = [(1024, 32768), (4096, 4096), (32768, 1024), (65536, 256), (64, 128256), (256, 151936), (16, 262144),
        (1, 16777216)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _label(shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def forward_case(shape, dtype, device="cuda") -> Case:
    def make(gen):
        x = torch.randn(shape, generator=harness.device_generator(gen, device), device=device) * 2.0
        return (x.to(dtype),)

    def reference(inputs):
        return torch.softmax(inputs[0].double(), -1)

    numel = shape[0] * shape[1]
    return Case(_label(shape), dtype, "forward", 2 * numel * dtype.itemsize, make, reference)


def backward_case(shape, dtype, device="cuda") -> Case:
    def make(gen):
        drawn = harness.device_generator(gen, device)
        x = torch.randn(shape, generator=drawn, device=device) * 2.0
        dy = torch.randn(shape, generator=drawn, device=device)
        return (torch.softmax(x, -1).to(dtype), dy.to(dtype))

    def reference(inputs):
        y, dy = inputs[0].double(), inputs[1].double()
        return y * (dy - (dy * y).sum(-1, keepdim=True))

    numel = shape[0] * shape[1]
    return Case(_label(shape), dtype, "backward", 3 * numel * dtype.itemsize, make, reference)


def _optional(module: str) -> tuple[Optional[object], str]:
    try:
        return importlib.import_module(module), ""
    except Exception as exc:  # ImportError, or a peer whose own dependencies fail to load
        return None, f"{module} not importable ({type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''})"


def _compiled(fn):
    import torch._dynamo

    # One compiled graph per shape: more shapes than dynamo's default recompile limit.
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    return torch.compile(fn, dynamic=False)


def _torch_backward_formula(y, dy):
    y32, dy32 = y.float(), dy.float()
    return (y32 * (dy32 - (dy32 * y32).sum(-1, keepdim=True))).to(y.dtype)


def forward_implementations() -> list[Implementation]:
    import onlinesoftmax
    from .baselines import tutorial_softmax

    impls = [
        Implementation("torch", lambda x: torch.softmax(x, -1)),
        Implementation("torch.compile", _compiled(lambda x: torch.softmax(x, -1))),
        Implementation("triton-tutorial", tutorial_softmax),
    ]
    liger, why = _optional("liger_kernel.ops.softmax")
    impls.append(Implementation("liger", liger.LigerSoftmaxFunction.apply) if liger else Implementation("liger", skipped=why))
    quack, why = _optional("quack.softmax")
    impls.append(Implementation("quack", quack.softmax_fwd) if quack else Implementation("quack", skipped=why))
    impls.append(Implementation("onlinesoftmax", lambda x: onlinesoftmax.softmax(x, -1)))
    return impls


def backward_implementations() -> list[Implementation]:
    from ..ops.softmax.launch import launch_backward

    impls = [
        Implementation("torch", lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype)),
        Implementation("torch.compile", _compiled(_torch_backward_formula)),
    ]
    liger, why = _optional("liger_kernel.ops.softmax")
    if liger:
        settings = {}

        def liger_backward(y, dy):
            # Liger's launch settings come from its forward; get them once per row length, on the
            # untimed correctness call, so the timed calls are backward only.
            if y.shape[-1] not in settings:
                settings[y.shape[-1]] = liger._softmax_forward(y)[1:]
            return liger._softmax_backward(dy, y, *settings[y.shape[-1]])

        impls.append(Implementation("liger", liger_backward))
    else:
        impls.append(Implementation("liger", skipped=why))
    quack, why = _optional("quack.softmax")
    impls.append(Implementation("quack", lambda y, dy: quack.softmax_bwd(dy, y)) if quack
                 else Implementation("quack", skipped=why))
    impls.append(Implementation("onlinesoftmax", lambda y, dy: launch_backward(y, dy, 1, False)))
    return impls


def cases(shapes, dtypes, directions, device="cuda") -> list[Case]:
    out = []
    for direction in directions:
        make = forward_case if direction == "forward" else backward_case
        for dtype in dtypes:
            out += [make(shape, dtype, device) for shape in shapes]
    return out


def run(args) -> int:
    """``onlinesoftmax bench softmax``: the grid, every peer, forward and backward; writes the results."""
    dtypes = [DTYPES[d] for d in (args.dtype or "fp32,bf16").split(",")]
    directions = harness.directions(args, "forward", "backward")
    gen = torch.Generator().manual_seed(args.seed)
    print(f"seed {args.seed}; measuring device copy bandwidth ...", flush=True)
    copy_gbs = harness.copy_bandwidth_gbs()
    impls = {"forward": forward_implementations(), "backward": backward_implementations()}
    rows = harness.run_cases("softmax", cases([parse_dims(t, 2) for t in args.shape] if args.shape else GRID, dtypes, directions), impls, gen,
                             graph_timing=not args.no_graph)
    harness.finish_rows(rows, copy_gbs)
    rows, earlier_runs = harness.merge_with_previous(args, "softmax", rows)
    summary = softmax_summary(rows, copy_gbs)
    harness.write_results(args, "softmax", rows, copy_gbs, summary_text(summary), {"summary": summary},
                          earlier_runs)
    return harness.exit_code(rows)


def softmax_summary(rows, copy_gbs) -> dict:
    """Per case: ours vs the best peer, % of copy; geometric-mean speedup over torch eager."""
    out = {"cases": [], "copy_gbs": copy_gbs}
    keys = list(dict.fromkeys((r.direction, r.dtype, r.case) for r in rows))
    speedups = {"forward": [], "backward": []}
    for key in keys:
        sel = [r for r in rows if (r.direction, r.dtype, r.case) == key]
        ours = next((r for r in sel if r.impl == "onlinesoftmax"), None)
        peers = [r for r in sel if r.impl != "onlinesoftmax" and r.status == "ok" and r.ms]
        best = min(peers, key=lambda r: r.ms, default=None)
        entry = {"direction": key[0], "dtype": key[1], "case": key[2],
                 "ours_gbs": ours.gbs if ours else None, "ours_pct_copy": ours.pct_of_copy if ours else None,
                 "best_peer": best.impl if best else None, "best_peer_gbs": best.gbs if best else None,
                 "ours_vs_best_peer": (best.ms / ours.ms) if (best and ours and ours.ms) else None}
        graph_peers = [r for r in peers if r.graph_ms]
        best_graph = min(graph_peers, key=lambda r: r.graph_ms, default=None)
        if best_graph and ours and ours.graph_ms:
            entry.update(best_peer_graph=best_graph.impl, ours_graph_vs_best_peer_graph=best_graph.graph_ms / ours.graph_ms)
        out["cases"].append(entry)
        if ours and ours.speedup_vs_torch:
            speedups[key[0]].append(ours.speedup_vs_torch)
    for direction, values in speedups.items():
        if values:
            out[f"{direction}_geomean_speedup_vs_torch"] = statistics.geometric_mean(values)
    return out


def summary_text(summary) -> str:
    lines = []
    for direction in ("forward", "backward"):
        key = f"{direction}_geomean_speedup_vs_torch"
        if key in summary:
            lines.append(f"{direction}: geometric-mean speedup over torch eager {summary[key]:.2f}x")
    behind = [c for c in summary["cases"] if c["ours_vs_best_peer"] is not None and c["ours_vs_best_peer"] < 1.0]
    for c in behind:
        graph = c.get("ours_graph_vs_best_peer_graph")
        lines.append(f"behind the best peer: {c['direction']} {c['dtype']} {c['case']}: {c['ours_vs_best_peer']:.2f}x "
                     f"of {c['best_peer']} ({c['best_peer_gbs']:.0f} GB/s vs ours {c['ours_gbs']:.0f})"
                     + (f"; under CUDA graphs {graph:.2f}x of {c['best_peer_graph']}" if graph else ""))
    return "\n".join(lines)
