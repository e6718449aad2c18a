"""Command line: ``onlinesoftmax bench | explain | check``.

Exit codes, the same for every command and suite: 0 when everything it checked was correct, 1 when
a result of ours was wrong (or a bench row of ours failed), 2 for a usage error (including results
that would overwrite existing files without ``--overwrite``). Without a GPU, ``bench`` runs the
suite's CPU correctness check and says that timings need a CUDA GPU.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import torch

# Device copy bandwidth assumed by `explain` when no GPU is present to measure (H100 SXM, measured).
DEFAULT_BANDWIDTH_GBS = 3000.0
DEFAULT_SMS = 132

# `onlinesoftmax bench SUITE`: each suite is a module of onlinesoftmax.bench with a run(args) -> int
# that reads the shared options below (--dtype, --shape, --out, --seed, ...).
SUITES = {
    "softmax": ".bench.softmax_suite:run",
    "sweep": ".bench.sweep_suite:run",
    "host": ".bench.host_suite:run",
    "attention": ".bench.attention_suite:run",
    "decode": ".bench.decode_suite:run",
    "topk": ".bench.topk_suite:run",
    "topk_paper": ".bench.topk_suite:run_paper",
    "distributed": ".bench.distributed_suite:run",  # under torchrun, one GPU per rank
    "ladder": ".bench.ladder_suite:run",
    "cross_entropy": ".bench.cross_entropy_suite:run",
    "cross_entropy_probabilities": ".bench.cross_entropy_suite:run_probabilities",
    "linear_cross_entropy": ".bench.cross_entropy_suite:run_linear",
}


# Suites whose grid can be measured in parts (--merge adds a run's rows to the results file); the
# sweeps too, which take longer than one call of a time-limited machine.
MERGING_SUITES = ("softmax", "sweep", "topk", "attention", "decode", "cross_entropy", "cross_entropy_probabilities",
                  "linear_cross_entropy")


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 16x262144, got {text!r}") from None
    if len(dims) not in (2, 5, 6, 7) or min(dims[:6]) < 1:
        raise argparse.ArgumentTypeError("expected positive ROWSxCOLS (with --op attention BxHQxHKVxSxD or "
                                         "BxHQxHKVxSQxSKxD; with --op decode BxHQxHKVxSQxSxDxPAGE, PAGE 0 for "
                                         "a contiguous cache)")
    return dims


def cpu_check(suite: str) -> int:
    """Without a GPU: the suite's ops against float64 on small CPU inputs, run as the interpreter
    (``TRITON_INTERPRET=1``) or torch's kernels allow here. Returns the exit code."""
    from .checks import run_checks

    print(f"No CUDA GPU here: `bench {suite}` times GPU kernels, so it runs its CPU correctness "
          "check instead (no results written).")
    if suite == "ladder":
        print("The ladder's CUDA kernels run in numba's CUDA simulator: pytest tests/test_ladder.py")
    return run_checks(suite)


def explain(args) -> int:
    # Attention runs in 16-bit only: its default is bf16, the other ops' fp32.
    attention = args.op in ("attention", "decode")
    name = args.dtype or ("bf16" if attention else "fp32")
    if attention and name == "fp32":
        print(f"explain --op {args.op}: attention runs in float16 and bfloat16; pass --dtype bf16 or fp16",
              file=sys.stderr)
        return 2
    if args.causal and args.op != "attention":
        print("explain: --causal applies to --op attention", file=sys.stderr)
        return 2
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
    if torch.cuda.is_available():
        device, sms = torch.device("cuda"), None
    else:
        device, sms = torch.device("cuda"), args.sms
        print(f"(no GPU here: planning for a CUDA device with {sms} SMs)")
    from ._device import sm_count

    if args.op == "attention":
        from .ops.attention import explain as attention_explain, op as attention_op

        if len(args.shape) not in (5, 6):
            print("explain --op attention: give BxHQxHKVxSxD or BxHQxHKVxSQxSKxD, e.g. 4x32x8x4096x128",
                  file=sys.stderr)
            return 2
        batch, heads_q, heads_kv, *lengths, head_dim = args.shape
        n_queries, n_keys = lengths if len(lengths) == 2 else lengths * 2

        def stand_in(heads, seq):  # the shape alone, for the op's own checks (one element, expanded)
            return torch.empty((), dtype=dtype).expand(batch, heads, seq, head_dim)

        try:
            attention_op.validate(stand_in(heads_q, n_queries), stand_in(heads_kv, n_keys),
                                  stand_in(heads_kv, n_keys), args.causal, None, "explain --op attention")
        except ValueError as exc:  # what attention() would refuse
            print(exc, file=sys.stderr)
            return 2
        print(attention_explain.explain(batch, heads_q, heads_kv, n_queries, n_keys, head_dim, dtype, args.causal,
                                        sms=sms or sm_count(device)))
        return 0
    if args.op == "decode":
        from .ops.decode import plan as decode_plan

        if len(args.shape) != 7:
            print("explain --op decode: give BxHQxHKVxSQxSxDxPAGE, e.g. 1x32x8x1x131072x128x0", file=sys.stderr)
            return 2
        batch, heads_q, heads_kv, n_queries, capacity, head_dim, page = args.shape
        print(decode_plan.explain(batch, heads_q, heads_kv, n_queries, head_dim, capacity, page, dtype,
                                  sms=sms or sm_count(device)))
        return 0
    if len(args.shape) != 2:
        print(f"explain --op {args.op}: give ROWSxCOLS", file=sys.stderr)
        return 2
    if args.op == "cross_entropy":
        return _explain_cross_entropy(args, dtype, device, sms)
    if args.op == "softmax_topk":
        from .ops.topk import plan

        rows, cols = args.shape
        print(plan.topk_plan(rows, cols, args.k, dtype, device, sms=sms).describe(args.bandwidth))
        return 0
    from .ops.softmax import eager_route, launch

    rows, cols = args.shape
    # The GPU's plan for a contiguous tensor, also where TRITON_INTERPRET=1 would give the
    # interpreter's (one chunk a row).
    chosen = launch.contiguous_plan(args.op, rows, cols, dtype, device, args.algorithm, args.strategy, sms=sms,
                                    interpreting=False)
    print(chosen.describe(args.bandwidth))
    if args.strategy is None:
        note = eager_route.eager_torch_note(chosen, sms=sms)
        if note:
            print(note)
    return 0


def _explain_cross_entropy(args, dtype, device, sms) -> int:
    """cross_entropy's plans for a training step of (ROWS, COLS) contiguous logits: keeping them (a
    forward, then a backward), and in place, with the options that keep its rows plain and without."""
    from .ops.cross_entropy import plan

    rows, cols = args.shape

    def describe(op, **kwargs):
        chosen = plan.choose(op, rows, cols, dtype, device, sms=sms, interpreting=False, **kwargs)
        return chosen, chosen.describe(args.bandwidth)

    print("keeping the logits (inplace_backward=False): the forward, then the backward")
    for op in ("forward", "backward"):
        print(describe(op)[1])
    plain, text = describe("forward_grad", plain=True)
    print("\nin place (inplace_backward=True), no class weights, label smoothing, softcap, z-loss or return_lse:")
    print(text)
    general, text = describe("forward_grad")
    if general != plain:
        print("\nin place with any of those options (but those below):")
        print(text)
    for what, kwargs in (("label smoothing", dict(smoothing=True)),
                         ("label smoothing and class weights", dict(smoothing=True, weighted=True)),
                         ("a softcap", dict(softcap=True))):
        options, text = describe("forward_grad", **kwargs)
        if options != general:
            print(f"\nin place with {what}:")
            print(text)
    if rows * cols * dtype.itemsize < plan.EAGER_BEHIND_TORCH_BYTES:
        print(f"\neager steps of logits under {plan.EAGER_BEHIND_TORCH_BYTES / 1e6:.0f} MB are our host's time, "
              "longer than torch's (docs/perf-cross_entropy.md, host time); CUDA graphs and torch.compile "
              "take the host out")
    return 0


def check(args) -> int:
    """Self-check: every op on the available device against float64."""
    from .checks import run_checks

    return run_checks("all")


def _existing_results(args) -> list[str]:
    from .bench.harness import _stem

    suite = "attention_sweep" if args.suite == "attention" and args.sweep else args.suite
    stem = _stem(args, suite)
    return [stem + ".json"] if os.path.exists(stem + ".json") else []


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="onlinesoftmax", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"onlinesoftmax {__version__}")
    sub = parser.add_subparsers(dest="command")

    bench = sub.add_parser("bench", help="benchmark against every peer (GPU); a CPU correctness check without one")
    bench.add_argument("suite", nargs="?", default="softmax", choices=list(SUITES))
    bench.add_argument("--dtype", default=None, help="comma-separated: fp32,bf16,fp16 (default: the suite's)")
    bench.add_argument("--shape", action="append",
                       help="one case, dims joined by x as the suite takes them (softmax: ROWSxCOLS); repeatable")
    bench.add_argument("--no-backward", action="store_true", help="the forward timings only")
    bench.add_argument("--no-forward", action="store_true",
                       help="softmax, sweep, attention: the backward (attention: forward + backward) timings only; "
                            "with --merge the forward rows stay")
    bench.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replay timings")
    bench.add_argument("--out", default=None,
                       help="results folder (default: benchmarks/results/<device>, e.g. benchmarks/results/h100)")
    bench.add_argument("--overwrite", action="store_true", help="replace results already in the results folder")
    bench.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    bench.add_argument("--merge", action="store_true",
                       help="keep the rows of the existing results file that this run does not measure")
    bench.add_argument("--impls", default=None, metavar="NAMES",
                       help="comma-separated implementations to run (the results' impl names, e.g. "
                            "onlinesoftmax,torch); with --merge the others keep their rows from the results file")
    bench.add_argument("--random", type=int, default=0, metavar="N",
                       help="sweep suites (sweep, attention --sweep) and cross_entropy_probabilities: add N seeded "
                            "random shapes (--seed) to the grid or to the --shape cases")
    bench.add_argument("--quick", action="store_true", help="sweep suites: a smaller grid")
    bench.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                       help="sweep suites: start no case after this many seconds, and write the cases measured")
    bench.add_argument("--sweep", action="store_true",
                       help="attention: the sweep over sequence lengths, head dims and layouts (writes attention_sweep.*)")

    exp = sub.add_parser("explain", help="print the launch plan for a shape")
    exp.add_argument("shape", type=_parse_shape)
    exp.add_argument("--dtype", default=None, choices=["fp32", "bf16", "fp16"],
                     help="default fp32 (decode: bf16)")
    exp.add_argument("--op", default="softmax", choices=["softmax", "log_softmax", "logsumexp",
                                                          "softmax_backward", "log_softmax_backward",
                                                          "softmax_topk", "attention", "decode", "cross_entropy"])
    exp.add_argument("--k", type=int, default=50, help="softmax_topk: k")
    exp.add_argument("--causal", action="store_true", help="attention: a causal mask")
    exp.add_argument("--algorithm", default="auto", choices=["auto", "online", "safe"])
    exp.add_argument("--strategy", default=None, choices=["row_on_chip", "looped", "split_row", "split_row_on_chip"])
    exp.add_argument("--sms", type=int, default=DEFAULT_SMS, help="SM count to plan for when no GPU is present")
    exp.add_argument("--bandwidth", type=float, default=DEFAULT_BANDWIDTH_GBS, help="GB/s for the floor time")

    sub.add_parser("check", help="run each op against float64 on the available device")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "bench":
        if args.merge and args.suite not in MERGING_SUITES:
            parser.error(f"--merge applies to the {', '.join(MERGING_SUITES)} suites only, not {args.suite!r}")
        if args.no_forward and (args.no_backward or args.suite not in ("softmax", "sweep", "attention")):
            parser.error("--no-forward applies to the softmax, sweep and attention suites, without --no-backward")
        if args.deadline is not None and not (args.suite == "sweep" or (args.suite == "attention" and args.sweep)):
            parser.error("--deadline applies to the sweeps only (bench sweep, bench attention --sweep)")
        if not torch.cuda.is_available() and args.suite not in ("distributed",):
            return cpu_check(args.suite)
        existing = _existing_results(args)
        if existing and not (args.overwrite or args.merge):
            print(f"onlinesoftmax bench: {existing[0]} exists; pass --overwrite to replace it, --merge to add "
                  "this run's rows to it, or --out DIR to write elsewhere", file=sys.stderr)
            return 2
        from .bench import harness

        harness.select_implementations(args.impls)
        module_name, function = SUITES[args.suite].split(":")
        return getattr(importlib.import_module(module_name, __package__), function)(args)
    if args.command == "explain":
        return explain(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
