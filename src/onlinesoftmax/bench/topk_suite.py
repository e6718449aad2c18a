"""``onlinesoftmax bench topk``: fused softmax + top-k against torch and Quack on the issue's grid;
``onlinesoftmax bench topk_paper``: the paper's speed-up curves (online vs safe softmax, fused vs
unfused softmax + top-k) against V."""

from __future__ import annotations

import importlib
import json
import os
import torch

from . import harness
from .shapes import parse_dims
from .harness import Case, Implementation

# (B, V, K) from the issue: decode batches over LLM vocabularies (Llama 3 128256, Qwen 151936,
# Gemma 262144), a 25000-word vocabulary at batch 1 and 1024, a short-row training shape that
# Quack's kernel covers, and K = 256 (the largest list the kernels keep on chip).
GRID = [(1, 25000, 5), (1024, 25000, 5), (64, 128256, 50), (256, 151936, 5), (256, 151936, 64),
        (1, 151936, 1), (4096, 4096, 8), (128, 262144, 256)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Targets from the issue (H100, fp32, ms).
TARGETS_MS = {(1024, 25000, 5): 0.050, (256, 151936, 5): 0.070, (256, 151936, 64): 0.090,
              (64, 128256, 50): 0.025, (1, 151936, 1): 0.012, (4096, 4096, 8): 0.038}


def _label(shape) -> str:
    return "{}x{}:k{}".format(*shape)


def case(shape, dtype, device="cuda") -> Case:
    rows, cols, k = shape

    def make(gen):
        x = torch.randn((rows, cols), generator=harness.device_generator(gen, device), device=device) * 2.0
        return x.to(dtype), k

    def reference(inputs):
        return torch.topk(torch.softmax(inputs[0].double(), -1), k).values

    # x read once; values, int64 indices and (ours) a float32 lse written once.
    written = rows * k * (dtype.itemsize + 8) + rows * 4
    return Case(_label(shape), dtype, "forward", rows * cols * dtype.itemsize + written, make, reference)


def _quack_topk():
    try:
        return importlib.import_module("quack.topk").topk, ""
    except Exception as exc:  # ImportError, or its own dependencies failing to load
        return None, f"quack.topk not importable ({type(exc).__name__})"


def _row_probabilities(indices, inputs):
    # For selections whose values are not the op's: their indices' float64 probabilities in the
    # row (untimed), compared with the reference's.
    return torch.softmax(inputs[0].double(), -1).gather(-1, indices.long())


def implementations(shape) -> list[Implementation]:
    import onlinesoftmax

    rows, cols, k = shape
    impls = [
        Implementation("torch", lambda x, k: torch.topk(torch.softmax(x, -1), k), check=lambda out, _: out.values),
        Implementation("torch.topk only", lambda x, k: torch.topk(x, k), check=lambda out, inputs: _row_probabilities(out.indices, inputs)),
    ]
    quack_topk, why = _quack_topk()
    power_of_two = lambda n: n & (n - 1) == 0  # noqa: E731
    if quack_topk is None:
        impls.append(Implementation("quack", skipped=why))
    elif not (cols <= 4096 and power_of_two(cols) and k <= 128 and power_of_two(k)):
        impls.append(Implementation("quack", skipped="needs N <= 4096 and k <= 128, both powers of two"))
    else:
        # Quack's softmax=True normalizes over the k chosen logits (a mixture-of-experts router's
        # weights), not the row, and clears each value's low log2(N) bits to carry its index: its
        # values are not the op's. Its selection is checked: its indices' probabilities in the row.
        impls.append(Implementation("quack", lambda x, k: quack_topk(x, k, softmax=True), check=lambda out, inputs: _row_probabilities(out[1], inputs)))
    impls.append(Implementation("onlinesoftmax", lambda x, k: onlinesoftmax.softmax_topk(x, k),
                                check=lambda out, _: out[0]))
    return impls


def _floor_notes(rows, shapes, dtypes, copy_gbs) -> tuple[str, list]:
    """Per case: the read floor (bytes of x at the copy bandwidth), ours, torch, the target."""
    lines = ["| dtype | case | read floor ms | ours ms | ours graph ms | ours / floor | torch ms | target ms |",
             "|---|---|---|---|---|---|---|---|"]
    summary = []
    for dtype in dtypes:
        for shape in shapes:
            label, name = _label(shape), str(dtype).replace("torch.", "")
            sel = {r.impl: r for r in rows if r.case == label and r.dtype == name}
            ours, ref = sel.get("onlinesoftmax"), sel.get("torch")
            floor = shape[0] * shape[1] * dtype.itemsize / (copy_gbs * 1e9) * 1e3
            target = TARGETS_MS.get(shape) if dtype == torch.float32 else None
            entry = {"dtype": name, "case": label, "floor_ms": floor, "ours_ms": ours.ms if ours else None,
                     "ours_graph_ms": ours.graph_ms if ours else None, "torch_ms": ref.ms if ref else None,
                     "target_ms": target}
            summary.append(entry)
            best = min((t for t in (entry["ours_ms"], entry["ours_graph_ms"]) if t), default=None)
            lines.append(f"| {name} | {label} | {floor:.4f} | {harness._fmt(entry['ours_ms'], '.4f')} | "
                         f"{harness._fmt(entry['ours_graph_ms'], '.4f')} | "
                         f"{harness._fmt(best / floor if best else None, '.2f')} | "
                         f"{harness._fmt(entry['torch_ms'], '.4f')} | {harness._fmt(target, '.3f')}"
                         + (" MISS" if target and best and best > target else "") + " |")
    return "\n".join(lines), summary


def run(args) -> int:
    """The grid, fp32 and bf16, every peer; writes RESULTS/topk.{json,md,png}."""
    dtypes = [DTYPES[d] for d in (args.dtype or "fp32,bf16").split(",")]
    shapes = [parse_dims(t, 3) for t in args.shape] if args.shape else GRID
    gen = torch.Generator().manual_seed(args.seed)
    print(f"seed {args.seed}; measuring device copy bandwidth ...", flush=True)
    copy_gbs = harness.copy_bandwidth_gbs()
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            rows += harness.run_cases("topk", [case(shape, dtype)], {"forward": implementations(shape)}, gen,
                                      graph_timing=not args.no_graph)
    harness.finish_rows(rows, copy_gbs)
    rows, earlier_runs = harness.merge_with_previous(args, "topk", rows)
    notes, summary = _floor_notes(rows, shapes, dtypes, copy_gbs)
    notes = ("Bytes: x read once + values, int64 indices and a float32 lse written once. Read floor: bytes of x "
             f"at the measured copy bandwidth ({copy_gbs:.0f} GB/s). 'graph ms': replayed from a CUDA graph "
             "(no Python launch overhead; what a decode loop under graphs sees). quack: softmax=True normalizes over "
             "the k chosen logits (router weights), not the row, so its row checks its selection only: the row "
             "probabilities of its indices.\n\n" + notes)
    harness.write_results(args, "topk", rows, copy_gbs, notes, {"floors": summary}, earlier_runs)
    return harness.exit_code(rows)


# --------------------------------------------------------------------------------------------
# The paper's experiment (arXiv:1805.02867, figures 1 and 2): speed-ups against V
# --------------------------------------------------------------------------------------------

PAPER_BATCHES = (4000, 10)
PAPER_K = 5
PAPER_VOCABS = [int(10 ** (e / 2)) for e in range(4, 15)]  # 10^2, 10^2.5, ..., 10^7
# Inputs above this many bytes are skipped (batch 4000 x 10^7 fp32 would be 160 GB).
PAPER_MAX_BYTES = 2 * 10**9


def _paper_point(batch, vocab, gen):
    import onlinesoftmax

    x = torch.randn((batch, vocab), device="cuda", generator=gen) * 2.0
    # Enough distinct inputs that small points are not timed from L2 (at most 8 sets).
    extra_sets = min(harness.rotation_count(x.numel() * 4, 2 * 10**8), 8) - 1
    sets = [(x,)] + [(torch.randn_like(x),) for _ in range(extra_sets)]
    fns = {
        "safe": lambda t: onlinesoftmax.softmax(t, algorithm="safe", strategy="looped"),
        "online": lambda t: onlinesoftmax.softmax(t, algorithm="online", strategy="looped"),
        "unfused": lambda t: torch.topk(onlinesoftmax.softmax(t, algorithm="safe", strategy="looped"), PAPER_K),
        "fused": lambda t: onlinesoftmax.softmax_topk(t, PAPER_K),
    }
    times = {name: harness.time_ms(fn, sets, warmup_ms=10, rep_ms=40) for name, fn in fns.items()}
    del sets, x
    torch.cuda.empty_cache()
    return times


def run_paper(args) -> int:
    """Speed-up of online over safe softmax and of fused over unfused softmax + top-k (K = 5)
    against V, at batch 4000 and 10, fp32; writes RESULTS/topk_paper.{json,md,png}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    points = []
    for batch in PAPER_BATCHES:
        for vocab in PAPER_VOCABS:
            if batch * vocab * 4 > PAPER_MAX_BYTES:
                continue
            times = _paper_point(batch, vocab, gen)
            point = {"batch": batch, "vocab": vocab, **{f"{k}_ms": v for k, v in times.items()},
                     "online_over_safe": times["safe"] / times["online"],
                     "fused_over_unfused": times["unfused"] / times["fused"]}
            points.append(point)
            print(f"batch {batch:5d} V {vocab:9d}: online/safe {point['online_over_safe']:.2f}x, "
                  f"fused/unfused {point['fused_over_unfused']:.2f}x", flush=True)
    stem = harness._stem(args, "topk_paper")
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    env = harness.environment("onlinesoftmax bench topk_paper")
    with open(stem + ".json", "w") as f:
        json.dump({"environment": env, "k": PAPER_K, "points": points}, f, indent=1)
    lines = [f"# The paper's experiment on {env.get('device')}", "",
             "Softmax: our looped kernels with algorithm='online' (2 reads of x) vs 'safe' (3 reads). "
             "Unfused: safe softmax then torch.topk; fused: softmax_topk (1 read). K = 5, fp32. "
             f"Points above {PAPER_MAX_BYTES / 1e9:.0f} GB of input are skipped.", "",
             "| batch | V | safe ms | online ms | online/safe | unfused ms | fused ms | fused/unfused |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {p['batch']} | {p['vocab']} | {p['safe_ms']:.4f} | {p['online_ms']:.4f} | "
              f"{p['online_over_safe']:.2f} | {p['unfused_ms']:.4f} | {p['fused_ms']:.4f} | "
              f"{p['fused_over_unfused']:.2f} |" for p in points]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, key, title in ((axes[0], "online_over_safe", "online vs safe softmax"),
                           (axes[1], "fused_over_unfused", f"fused vs unfused softmax + top-{PAPER_K}")):
        for batch in PAPER_BATCHES:
            sel = [p for p in points if p["batch"] == batch]
            ax.plot([p["vocab"] for p in sel], [p[key] for p in sel], marker="o", label=f"batch {batch}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("V")
        ax.set_ylabel("speed-up")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"arXiv:1805.02867 figures 1-2 on {env.get('device')}")
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    plt.close(fig)
    print(f"wrote {stem}.json, {stem}.md, {stem}.png")
    return 0
