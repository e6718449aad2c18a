"""Command line: ``onlinesoftmax bench | explain | check``."""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

import torch

# Device copy bandwidth assumed by `explain` when no GPU is present to measure (H100 SXM, measured).
DEFAULT_BANDWIDTH_GBS = 3000.0
DEFAULT_SMS = 132


def _parse_shape(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 16x262144, got {text!r}") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError("rows and cols must be positive")
    return rows, cols


def _progress():
    try:
        from rich.progress import Progress
        return Progress(transient=True)
    except ImportError:
        return None


def bench_softmax(args) -> int:
    from .bench import harness, softmax_suite

    command = "onlinesoftmax " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if not torch.cuda.is_available():
        print("No CUDA GPU found: running the CPU correctness-and-timing demo instead (no results written).")
        return cpu_demo()
    dtypes = [softmax_suite.DTYPES[d] for d in args.dtype.split(",")]
    shapes = args.shape or softmax_suite.GRID
    directions = ["forward"] + ([] if args.no_backward else ["backward"])
    gen = torch.Generator().manual_seed(args.seed)
    print(f"seed {args.seed}; measuring device copy bandwidth ...", flush=True)
    copy_gbs = harness.copy_bandwidth_gbs()
    impls = {"forward": softmax_suite.forward_implementations(), "backward": softmax_suite.backward_implementations()}
    all_cases = softmax_suite.cases(shapes, dtypes, directions)
    rows = []
    progress = _progress()
    if progress:
        with progress:
            task = progress.add_task("bench softmax", total=len(all_cases))
            for case in all_cases:
                rows += harness.run_case(case, impls[case.direction], gen, graph_timing=not args.no_graph,
                                         progress=lambda s: progress.update(task, description=s))
                progress.advance(task)
    else:
        for case in all_cases:
            rows += harness.run_case(case, impls[case.direction], gen, graph_timing=not args.no_graph,
                                     progress=lambda s: print(s, flush=True))
    harness.finish_rows(rows, copy_gbs)
    env = harness.environment(command)
    title = f"softmax on {env['device']} (copy {copy_gbs:.0f} GB/s)"
    harness.print_table(rows, title)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, args.name)
    summary = softmax_summary(rows, copy_gbs)
    harness.write_json(stem + ".json", rows, env, copy_gbs, {"summary": summary, "seed": args.seed})
    with open(stem + ".md", "w") as f:
        f.write(f"# softmax benchmark: {env['device']}\n\n" + harness.markdown(rows, env, copy_gbs, summary_text(summary)))
    harness.plot(stem + ".png", rows, copy_gbs, "softmax")
    print(summary_text(summary))
    print(f"wrote {stem}.json, {stem}.md, {stem}.png")
    return 0


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


def cpu_demo() -> int:
    """Without a GPU: correctness against float64 and timings of the CPU path next to torch."""
    import onlinesoftmax
    from .bench.harness import relative_error

    print(f"{'shape':>12s} {'dtype':>9s} {'torch ms':>9s} {'ours ms':>9s} {'rel err':>9s}")
    gen = torch.Generator().manual_seed(0)
    failures = 0
    for shape in [(64, 1024), (8, 32768), (1, 262144)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(shape, generator=gen) * 3).to(dtype)
            ref = torch.softmax(x.double(), -1)
            err = relative_error(onlinesoftmax.softmax(x), ref)
            failures += not err < (1e-5 if dtype == torch.float32 else 1e-2)
            times = {}
            for name, fn in (("torch", lambda: torch.softmax(x, -1)), ("ours", lambda: onlinesoftmax.softmax(x))):
                fn()  # warm-up: first calls pay for allocation and dispatch setup
                samples = []
                for _ in range(7):
                    t0 = time.perf_counter()
                    fn()
                    samples.append((time.perf_counter() - t0) * 1e3)
                times[name] = statistics.median(samples)
            print(f"{shape[0]:>5d}x{shape[1]:<6d} {str(dtype)[6:]:>9s} {times['torch']:9.3f} {times['ours']:9.3f} {err:9.1e}")
    print("CPU path: the split-and-merge algorithm in vectorized torch (onlinesoftmax.cpu); "
          "GPU numbers need a CUDA device.")
    return 1 if failures else 0


def explain(args) -> int:
    from . import plan

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rows, cols = args.shape
    if torch.cuda.is_available():
        device, sms = torch.device("cuda"), None
    else:
        device, sms = torch.device("cuda"), args.sms
        print(f"(no GPU here: planning for a CUDA device with {sms} SMs)")
    chosen = plan.choose(args.op, rows, cols, dtype, device, args.algorithm, args.strategy, sms=sms)
    print(chosen.describe(args.bandwidth))
    return 0


def check(args) -> int:
    """Self-check: every op on the available device against torch in float64."""
    import onlinesoftmax
    from . import plan
    from .bench.harness import relative_error

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
    print(f"{'op':>12s} {'shape':>14s} {'dtype':>9s} {'strategy':>12s} {'rel err':>9s}")
    failures = 0
    for shape in [(33, 1000), (4, 50000)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(shape, generator=gen) * 3).to(device=device, dtype=dtype)
            for name, ours, ref in (("softmax", onlinesoftmax.softmax, torch.softmax),
                                    ("log_softmax", onlinesoftmax.log_softmax, torch.log_softmax),
                                    ("logsumexp", onlinesoftmax.logsumexp, torch.logsumexp)):
                err = relative_error(ours(x, -1), ref(x.double(), -1))
                ok = err < (1e-5 if dtype == torch.float32 else 1e-2)
                failures += not ok
                print(f"{name:>12s} {str(shape):>14s} {str(dtype)[6:]:>9s} {plan.last_plan().strategy:>12s} "
                      f"{err:9.1e} {'ok' if ok else 'FAIL'}")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="onlinesoftmax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmark against every peer (GPU); a CPU demo without one")
    bench.add_argument("suite", nargs="?", default="softmax", choices=["softmax"])
    bench.add_argument("--dtype", default="fp32,bf16", help="comma-separated: fp32,bf16,fp16")
    bench.add_argument("--shape", type=_parse_shape, action="append", help="ROWSxCOLS (repeatable); default: the grid")
    bench.add_argument("--no-backward", action="store_true")
    bench.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replay timings")
    bench.add_argument("--out", default="benchmarks/results")
    bench.add_argument("--name", default="h100", help="file stem of the results")
    bench.add_argument("--seed", type=int, default=int(time.time()) % 100000)

    exp = sub.add_parser("explain", help="print the launch plan for a shape")
    exp.add_argument("shape", type=_parse_shape)
    exp.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    exp.add_argument("--op", default="softmax", choices=["softmax", "log_softmax", "logsumexp",
                                                          "softmax_backward", "log_softmax_backward"])
    exp.add_argument("--algorithm", default="auto", choices=["auto", "online", "safe"])
    exp.add_argument("--strategy", default=None, choices=["row_on_chip", "looped", "split_row"])
    exp.add_argument("--sms", type=int, default=DEFAULT_SMS, help="SM count to plan for when no GPU is present")
    exp.add_argument("--bandwidth", type=float, default=DEFAULT_BANDWIDTH_GBS, help="GB/s for the floor time")

    sub.add_parser("check", help="run each op against torch on the available device")

    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench_softmax(args)
    if args.command == "explain":
        return explain(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
