"""``onlinesoftmax bench attention``: flash attention against SDPA's backends and FlexAttention, in TFLOP/s.

FLOPs: the two matrix products of the forward cost 2 * Sq * Sk * D each per (batch, head), so a
forward is 4 * B * Hq * Sq * Sk * D, half of it when causal (the masked half of the score matrix is
skipped by every implementation here). A backward counts as 2.5 forwards (five products instead of
two), so forward+backward is 3.5 forwards. Peers: SDPA with each backend forced (FLASH =
FlashAttention-2, CUDNN, EFFICIENT), FlexAttention compiled, ours.

Correctness is checked on the first input set of each case against a float32 blockwise torch
evaluation (:mod:`onlinesoftmax.cpu`'s algorithm run on the GPU): a float64 score matrix of the
16384-long case would need 34 GB. The forward+backward rows are checked on dQ.
"""

from __future__ import annotations

import math
import random
from typing import Optional

import torch

from ..ops.attention.plan import forward_flops
from . import harness
from .harness import Case, Implementation
from .shapes import parse_dims, sweep_shapes_asked

# (batch, query heads, key/value heads, sequence length, head dim), bf16, each causal and not:
# training shapes from short to long sequences, a head dim of 64, and grouped-query attention.
GRID = [(8, 16, 16, 1024, 128), (4, 16, 16, 4096, 128), (1, 16, 16, 16384, 128), (4, 32, 32, 4096, 64),
        (2, 32, 8, 8192, 128)]
FORWARD, FORWARD_BACKWARD = "forward", "fwd+bwd"
# Targets from issue 5, as ratios of ours to the peer's TFLOP/s.
TARGET_VS_CUDNN = 0.9
TARGET_VS_FLASH = {FORWARD: 1.3, FORWARD_BACKWARD: 1.2}


def label(shape, causal) -> str:
    batch, heads_q, heads_kv, seq, head_dim = shape
    heads = f"{heads_q}" if heads_q == heads_kv else f"{heads_q}/{heads_kv}"
    return f"B{batch}-H{heads}-S{seq}-D{head_dim}" + ("-causal" if causal else "")


def _reference_forward(q, k, v, causal):
    from .. import cpu

    out, lse = cpu.attention_forward(q, k, v, "top_left" if causal else "none", q.shape[-1] ** -0.5)
    return out.float(), lse


def math_attention(q, k, v, causal):
    """Attention as plain tensor math in q's dtype (each product and the softmax rounded to it):
    flash-attention's accuracy criterion holds a kernel to twice this math's error in bf16."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        seen = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~seen, float("-inf"))
    return torch.softmax(s, -1) @ v


def make_case(shape, dtype, causal, direction, device="cuda") -> Case:
    batch, heads_q, heads_kv, seq, head_dim = shape
    element = dtype.itemsize
    qo_bytes = batch * heads_q * seq * head_dim * element
    kv_bytes = batch * heads_kv * seq * head_dim * element

    def make(gen):
        drawn = harness.device_generator(gen, device)
        tensors = [torch.randn((batch, h, seq, head_dim), generator=drawn, device=device).to(dtype)
                   for h in (heads_q, heads_kv, heads_kv)]
        if direction == FORWARD:
            return (*tensors, causal)
        d_out = torch.randn((batch, heads_q, seq, head_dim), generator=drawn, device=device).to(dtype)
        return (*[t.requires_grad_() for t in tensors], d_out, causal)

    def reference(inputs):
        from .. import cpu

        q, k, v = (t.detach() for t in inputs[:3])
        out, lse = _reference_forward(q, k, v, causal)
        if direction == FORWARD:
            return out
        mode = "top_left" if causal else "none"
        return cpu.attention_backward(inputs[3], q, k, v, out.to(q.dtype), lse, mode, head_dim ** -0.5)[0].float()

    flops = forward_flops(batch, heads_q, seq, seq, head_dim, causal)
    if direction == FORWARD:
        # q, k, v read once, out written once: the floor, not what a tiled kernel moves.
        return Case(label(shape, causal), dtype, direction, 2 * qo_bytes + 2 * kv_bytes, make, reference, flops=flops)
    # Backward also reads out and dO and writes dQ, dK, dV.
    return Case(label(shape, causal), dtype, direction, 5 * qo_bytes + 4 * kv_bytes, make, reference,
                flops=int(3.5 * flops))


def _with_backward(forward):
    """(q, k, v, dO, causal) -> dQ of one forward and backward through ``forward``."""
    def run(q, k, v, d_out, causal):
        out = forward(q, k, v, causal)
        return torch.autograd.grad(out, (q, k, v), d_out)[0]
    return run


class SdpaBackend:
    """SDPA with one backend forced. GQA goes through ``enable_gqa=True`` when the backend takes it,
    else through K and V expanded to Hq heads (forward: once per input set, untimed; forward+backward:
    inside the timed call, as training would); ``gqa`` records which, for the notes."""

    def __init__(self, backend):
        self.backend = backend
        self.gqa: Optional[str] = None
        self._expanded = {}

    def __call__(self, q, k, v, causal):
        from torch.nn.attention import sdpa_kernel

        sdpa = torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel(self.backend):
            if q.shape[1] == k.shape[1]:
                return sdpa(q, k, v, is_causal=causal)
            if self.gqa != "expanded K/V":
                try:
                    out = sdpa(q, k, v, is_causal=causal, enable_gqa=True)
                    self.gqa = "enable_gqa=True"
                    return out
                except RuntimeError:
                    self.gqa = "expanded K/V"
            group = q.shape[1] // k.shape[1]
            if k.requires_grad:
                # Through autograd, inside the timed call, so dK and dV flow back to the shared heads.
                return sdpa(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=causal)
            # Forward only: expanded once per input set, outside the timing. An entry holds its K and
            # V (an address alone could be a later tensor's) and lives until the shape changes.
            if self._expanded and next(iter(self._expanded.values()))[0].shape != k.shape:
                self._expanded.clear()
            key = (k.data_ptr(), v.data_ptr())
            entry = self._expanded.get(key)
            if entry is None or entry[0] is not k or entry[1] is not v:
                entry = self._expanded[key] = (k, v, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
            return sdpa(q, entry[2], entry[3], is_causal=causal)


class FlexAttention:
    """torch.compile'd FlexAttention; the causal block mask is built once per length."""

    def __init__(self):
        from torch.nn.attention.flex_attention import flex_attention

        import torch._dynamo

        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        self.flex = torch.compile(flex_attention, dynamic=False)
        self.masks = {}

    def __call__(self, q, k, v, causal):
        from torch.nn.attention.flex_attention import create_block_mask

        mask = None
        if causal:
            key = (q.shape[2], k.shape[2])
            if key not in self.masks:
                self.masks[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, key[0], key[1],
                                                    device=q.device)
            mask = self.masks[key]
        return self.flex(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def implementations() -> tuple[dict[str, list[Implementation]], list]:
    import onlinesoftmax
    from torch.nn.attention import SDPBackend

    sdpa = [(name, SdpaBackend(backend)) for name, backend in
            (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
             ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION))]
    peers = list(sdpa)
    try:
        peers.append(("flex-compiled", FlexAttention()))
    except Exception as exc:  # an older torch without FlexAttention
        peers.append(("flex-compiled", f"FlexAttention unavailable ({type(exc).__name__}: {exc})"))

    def ours(q, k, v, causal):
        return onlinesoftmax.attention(q, k, v, causal=causal)

    impls = {FORWARD: [], FORWARD_BACKWARD: []}
    for name, fn in peers + [("onlinesoftmax", ours)]:
        if isinstance(fn, str):
            impls[FORWARD].append(Implementation(name, skipped=fn))
            impls[FORWARD_BACKWARD].append(Implementation(name, skipped=fn))
            continue
        impls[FORWARD].append(Implementation(name, fn))
        impls[FORWARD_BACKWARD].append(Implementation(name, _with_backward(fn)))
    return impls, sdpa


def cases(shapes, dtypes, directions, device="cuda") -> list[Case]:
    return [make_case(shape, dtype, causal, direction, device)
            for direction in directions for dtype in dtypes for shape in shapes for causal in (False, True)]


def summary(rows) -> dict:
    """Per case: ours against cuDNN and FLASH, and whether the issue's targets are met."""
    out = []
    keys = list(dict.fromkeys((r.direction, r.dtype, r.case) for r in rows))
    for key in keys:
        sel = {r.impl: r for r in rows if (r.direction, r.dtype, r.case) == key and r.status == "ok" and r.tflops}
        ours = sel.get("onlinesoftmax")
        entry = {"direction": key[0], "dtype": key[1], "case": key[2], "ours_tflops": ours.tflops if ours else None}
        for peer in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex-compiled"):
            if peer in sel:
                entry[f"{peer}_tflops"] = sel[peer].tflops
                if ours:
                    entry[f"ours_vs_{peer}"] = ours.tflops / sel[peer].tflops
        misses = []
        if entry.get("ours_vs_sdpa-cudnn") is not None and entry["ours_vs_sdpa-cudnn"] < TARGET_VS_CUDNN:
            misses.append(f"{entry['ours_vs_sdpa-cudnn']:.2f}x cuDNN < {TARGET_VS_CUDNN}")
        flash_target = TARGET_VS_FLASH[key[0]]
        if entry.get("ours_vs_sdpa-flash") is not None and entry["ours_vs_sdpa-flash"] < flash_target:
            misses.append(f"{entry['ours_vs_sdpa-flash']:.2f}x FLASH < {flash_target}")
        entry["misses"] = misses
        out.append(entry)
    return {"cases": out}


def summary_text(result: dict, sdpa) -> str:
    lines = ["TFLOP/s = 4*B*Hq*Sq*Sk*D (half for causal) per forward; forward+backward counts 3.5 forwards. "
             "fwd+bwd rows are checked on dQ against a float32 blockwise evaluation."]
    for name, backend in sdpa:
        if backend.gqa:
            lines.append(f"{name} ran GQA through {backend.gqa}.")
    for c in result["cases"]:
        if c["ours_tflops"] is None:
            lines.append(f"{c['direction']} {c['case']}: ours has no timing")
            continue
        ratios = ", ".join(f"{c[k]:.2f}x {k[8:]}" for k in c if k.startswith("ours_vs_"))
        lines.append(f"{c['direction']} {c['dtype']} {c['case']}: ours {c['ours_tflops']:.0f} TFLOP/s ({ratios})"
                     + (f"  MISS: {'; '.join(c['misses'])}" if c["misses"] else ""))
    return "\n".join(lines)


def run(args) -> int:
    """``onlinesoftmax bench attention``: the grid, causal and not, forward and forward+backward."""
    dtypes = harness.half_dtypes(args, "attention")
    directions = harness.directions(args, FORWARD, FORWARD_BACKWARD)
    if getattr(args, "sweep", False):
        return run_sweep(args, dtypes, directions)
    shapes = [parse_dims(t, 5) for t in args.shape] if args.shape else GRID
    gen = torch.Generator().manual_seed(args.seed)
    impls, sdpa = implementations()
    # Replayed from CUDA graphs, the shortest cases (0.1 ms) show the kernels without the host's
    # launch cost, which a Triton or compiled-Flex call pays in Python and SDPA in C++.
    rows = harness.run_cases("attention", cases(shapes, dtypes, directions), impls, gen,
                             graph_timing=not args.no_graph)
    harness.finish_rows(rows, None)
    rows, earlier_runs = harness.merge_with_previous(args, "attention", rows)
    result = summary(rows)
    harness.write_results(args, "attention", rows, None, summary_text(result, sdpa), {"summary": result},
                          earlier_runs)
    return harness.exit_code(rows)


# ``bench attention --sweep``: sequence lengths from 128 to 32768 (odd ones too), the batch scaled so
# that every cell holds about SWEEP_TOKENS query tokens, head dims 64 and 128 (and 80, 96, 256
# without --quick), MHA and GQA, causal and not; against SDPA's FLASH and cuDNN backends (and
# FlexAttention without --quick, compiled once per shape). Eager timings are calls back to back.
SWEEP_LENGTHS = (128, 512, 1000, 2048, 3000, 4096, 8191, 16384, 32768)
QUICK_LENGTHS = (128, 512, 1000, 2048, 4096, 8191)
SWEEP_HEAD_DIMS = (64, 128, 80, 96, 256)
QUICK_HEAD_DIMS = (64, 128)
SWEEP_HEADS = ((16, 16), (32, 8))  # MHA, GQA
SWEEP_TOKENS = 32768


# ``--random N``: head dims models use (multiples of 8 up to 256, several not powers of two) and
# head layouts of real models (MHA, GQA at 4-8 query heads a KV head, MQA), drawn with the seed.
RANDOM_HEAD_DIMS = (32, 40, 48, 64, 72, 80, 96, 112, 128, 136, 160, 192, 256)
RANDOM_HEADS = ((8, 8), (12, 12), (16, 16), (25, 25), (32, 32), (32, 8), (28, 4), (40, 8), (64, 8), (16, 1))


def random_shapes(n: int, seed: int) -> list[tuple]:
    """N shapes (batch, heads_q, heads_kv, seq, head_dim): lengths log-uniform over 100-16384 (any
    integer), tokens a call log-uniform over 2048-65536 (the batch follows, at least 1)."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(n):
        seq = int(math.exp(rng.uniform(math.log(100), math.log(16384))))
        tokens = math.exp(rng.uniform(math.log(2048), math.log(65536)))
        heads_q, heads_kv = rng.choice(RANDOM_HEADS)
        shapes.append((max(1, round(tokens / seq)), heads_q, heads_kv, seq, rng.choice(RANDOM_HEAD_DIMS)))
    return shapes


def sweep_shapes(quick: bool, n_random: int = 0, seed: int = 0) -> list[tuple]:
    lengths = QUICK_LENGTHS if quick else SWEEP_LENGTHS
    head_dims = QUICK_HEAD_DIMS if quick else SWEEP_HEAD_DIMS
    return [(max(1, SWEEP_TOKENS // seq), hq, hkv, seq, d) for d in head_dims for hq, hkv in SWEEP_HEADS
            for seq in lengths] + random_shapes(n_random, seed)


def run_sweep(args, dtypes, directions) -> int:
    gen = torch.Generator().manual_seed(args.seed)
    impls, sdpa = implementations()
    keep = {"sdpa-flash", "sdpa-cudnn", "onlinesoftmax"} | (set() if args.quick else {"flex-compiled"})
    impls = {d: [i for i in impls[d] if i.name in keep] for d in impls}
    # --shape picks cells of the sweep (or others) to measure, e.g. one head dim a call, with --merge.
    shapes = sweep_shapes_asked(args, 5, random_shapes, sweep_shapes)
    print(f"seed {args.seed}; {len(shapes)} shapes x {len(dtypes)} dtypes x 2 masks x {len(directions)} directions",
          flush=True)
    rows = []
    for case in harness.until_deadline(list(cases(shapes, dtypes, directions)), getattr(args, "deadline", None)):
        measured = harness.run_case(case, impls[case.direction], gen, graph_timing=not args.no_graph,
                                    max_input_sets=4, back_to_back=True)
        rows += measured
        harness.report_case(f"{case.direction} {case.label}", measured)
    harness.finish_rows(rows, None)
    rows, earlier_runs = harness.merge_with_previous(args, "attention_sweep", rows)
    cells = []
    for key in dict.fromkeys((r.direction, r.dtype, r.case) for r in rows):
        sel = {r.impl: r for r in rows if (r.direction, r.dtype, r.case) == key}
        ours = sel.get("onlinesoftmax")
        if not (ours and ours.ms):
            continue
        cell = dict(direction=key[0], dtype=key[1], case=key[2], ours_tflops=ours.tflops, status=ours.status)
        for peer in ("sdpa-flash", "sdpa-cudnn", "flex-compiled"):
            if peer in sel and sel[peer].ms:
                cell[f"vs_{peer}"] = sel[peer].ms / ours.ms
                if sel[peer].graph_ms and ours.graph_ms:
                    cell[f"graph_vs_{peer}"] = sel[peer].graph_ms / ours.graph_ms
        cells.append(cell)
    notes = _sweep_notes(cells, sdpa)
    stem = harness.write_results(args, "attention_sweep", rows, None, notes, {"cells": cells}, earlier_runs,
                                 table=False, bars=False)
    sweep_heat_maps(stem, cells)
    return harness.exit_code(rows)


def sweep_heat_maps(stem: str, cells: list[dict]) -> None:
    """``{stem}-{dtype}-{direction}.png``: ours over FLASH and over cuDNN per cell, rows by sequence
    length (merged runs list their cells in any order)."""
    for dtype in dict.fromkeys(c["dtype"] for c in cells):
        for direction in dict.fromkeys(c["direction"] for c in cells):
            sel = [c for c in cells if c["dtype"] == dtype and c["direction"] == direction]
            panels = []
            for peer in ("sdpa-flash", "sdpa-cudnn"):
                values = {}
                for c in sel:
                    if f"vs_{peer}" in c:
                        batch_heads_seq, config = _sweep_axes(c["case"])
                        values[(batch_heads_seq, config)] = c[f"vs_{peer}"]
                rows_l = sorted(dict.fromkeys(r for r, _ in values), key=lambda r: int(r.split()[0][1:]))
                cols_l = sorted(dict.fromkeys(k for _, k in values))
                panels.append((f"{direction} {dtype}: ours over {peer} (eager)", rows_l, cols_l, values))
            path = harness.heat_maps(f"{stem}-{dtype}-{direction}.png", panels)
            if path:
                print("wrote", path)


def _sweep_axes(case: str) -> tuple[str, str]:
    """``B8-H16-S4096-D128-causal`` -> (``S4096 B8``, ``D128 H16 causal``): heat-map row and column."""
    parts = case.split("-")
    batch, heads, seq, dim = parts[:4]
    return f"{seq} {batch}", f"{dim} {heads}" + (" causal" if parts[-1] == "causal" else "")


def _sweep_notes(cells: list[dict], sdpa) -> str:
    def geomean(values):
        values = [v for v in values if v]
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")

    lines = []
    for direction in (FORWARD, FORWARD_BACKWARD):
        sel = [c for c in cells if c["direction"] == direction]
        if not sel:
            continue
        for peer in ("sdpa-flash", "sdpa-cudnn"):
            ratios = [c[f"vs_{peer}"] for c in sel if f"vs_{peer}" in c]
            if ratios:
                lines.append(f"- {direction}: {len(ratios)} cells, geometric mean {geomean(ratios):.2f}x {peer}, "
                             f"{sum(r < 1.0 for r in ratios)} below 1.0x, worst {min(ratios):.2f}x")
    for name, backend in sdpa:
        if backend.gqa:
            lines.append(f"- {name} ran GQA through {backend.gqa}.")
    lines += ["", "Worst cells first (eager, ours over SDPA FLASH):", "",
              "| direction | dtype | case | ours TFLOP/s | vs FLASH | vs cuDNN | graph vs FLASH | status |",
              "|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: c.get("vs_sdpa-flash", 9.0))[:40]:
        def fmt(key):
            return f"{c[key]:.2f}x" if c.get(key) else "-"
        lines.append(f"| {c['direction']} | {c['dtype']} | {c['case']} | {c['ours_tflops'] or 0:.0f} | "
                     f"{fmt('vs_sdpa-flash')} | {fmt('vs_sdpa-cudnn')} | {fmt('graph_vs_sdpa-flash')} | {c['status']} |")
    return "\n".join(lines)

