"""Command line: ``onlinesoftmax bench | explain | check``."""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time

import torch

# Device copy bandwidth assumed by `explain` when no GPU is present to measure (H100 SXM, measured).
DEFAULT_BANDWIDTH_GBS = 3000.0
DEFAULT_SMS = 132

# `onlinesoftmax bench SUITE`: each suite is a module of onlinesoftmax.bench with a run(args) -> int
# that reads the shared options below (--dtype, --shape, --out, --name, --seed, ...).
SUITES = {
    "softmax": ".bench.softmax_suite:run",
    "attention": ".bench.attention_suite:run",
    "distributed": ".bench.distributed_suite:run",  # under torchrun, one GPU per rank
    "ladder": ".bench.ladder_suite:run",
    "topk": ".bench.topk_suite:run",
    "topk_paper": ".bench.topk_suite:run_paper",
}


def _parse_shape(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 16x262144, got {text!r}") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError("rows and cols must be positive")
    return rows, cols


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
    # The GPU's plan, also where TRITON_INTERPRET=1 would give the interpreter's (one chunk a row).
    chosen = plan.choose(args.op, rows, cols, dtype, device, args.algorithm, args.strategy, sms=sms, interpreting=False)
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
    bench.add_argument("suite", nargs="?", default="softmax", choices=list(SUITES))
    bench.add_argument("--dtype", default="fp32,bf16", help="comma-separated: fp32,bf16,fp16")
    bench.add_argument("--shape", action="append",
                       help="one case, dims joined by x as the suite takes them (softmax: ROWSxCOLS); repeatable; default: the grid")
    bench.add_argument("--no-backward", action="store_true")
    bench.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replay timings")
    bench.add_argument("--out", default="benchmarks/results")
    bench.add_argument("--name", default="h100", help="results go to OUT/NAME.* for softmax, OUT/SUITE-NAME.* for the other suites")
    bench.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    bench.add_argument("--merge", action="store_true",
                       help="softmax suite: keep the rows of the existing results file that this run does not measure")

    exp = sub.add_parser("explain", help="print the launch plan for a shape")
    exp.add_argument("shape", type=_parse_shape)
    exp.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    exp.add_argument("--op", default="softmax", choices=["softmax", "log_softmax", "logsumexp",
                                                          "softmax_backward", "log_softmax_backward"])
    exp.add_argument("--algorithm", default="auto", choices=["auto", "online", "safe"])
    exp.add_argument("--strategy", default=None, choices=["row_on_chip", "looped", "split_row", "split_row_on_chip"])
    exp.add_argument("--sms", type=int, default=DEFAULT_SMS, help="SM count to plan for when no GPU is present")
    exp.add_argument("--bandwidth", type=float, default=DEFAULT_BANDWIDTH_GBS, help="GB/s for the floor time")

    sub.add_parser("check", help="run each op against torch on the available device")

    args = parser.parse_args(argv)
    if args.command == "bench":
        if args.merge and args.suite != "softmax":
            parser.error(f"--merge applies to the softmax suite only, not {args.suite!r}")
        module_name, function = SUITES[args.suite].split(":")
        return getattr(importlib.import_module(module_name, __package__), function)(args)
    if args.command == "explain":
        return explain(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
