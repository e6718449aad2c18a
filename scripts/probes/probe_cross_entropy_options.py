"""cross_entropy's options against torch (GPU): does an option make a step slower than torch's?

The bench grid times the plain loss ("mean", no options). Training recipes add label smoothing,
class weights, padding rows (ignore_index), a z-loss (PaLM) and logit soft-capping (Gemma 2). Here
one training step (the "mean" loss, then the gradient of the logits through torch.autograd.grad) per
option, at vocabulary-sized rows:

    torch:    F.cross_entropy with the option; the z-loss and soft-capping as one writes them in
              torch ops (tanh before the loss; z_loss * logsumexp^2 over the rows that count);
    ours:     onlinesoftmax.cross_entropy keeping the logits, and in place (inplace_backward=True);
    liger:    Liger's liger_cross_entropy (in place; the z-loss as its lse_square_scale), where
              liger_kernel imports (its reason printed where not).

Each timed two ways on the same inputs (a few sets in turn, rotated past L2 where they are small
enough): eager calls back to back (harness.back_to_back_ms, what a loop of eager steps costs) and
CUDA-graph replays (harness.graph_time_ms). Ratios are torch's time over ours keeping the logits
and in place, and Liger's over ours in place (above 1: ours faster); "loss" is the relative
difference of our losses (and Liger's) from torch's on the first set (the same quantity, to
rounding).

    python scripts/probes/probe_cross_entropy_options.py [--dtype bf16] [--seed 0] [--option softcap ...]
"""

import argparse

import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench import cross_entropy_suite as suite
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, rotation_count

SHAPES = [(8192, 128256), (4096, 50257), (2048, 32000), (512, 4097), (64, 151937)]
# Each option as the two functions take it: "weight" and "ignored" are made per shape below.
OPTIONS = {"plain": {}, "label_smoothing": dict(label_smoothing=0.1), "weight": dict(weight=True),
           "ignored rows": dict(ignored=True), "z_loss": dict(z_loss=1e-4), "softcap": dict(softcap=30.0)}
IGNORE_EVERY = 4  # every fourth row padding (ignore_index): targets of -100


def torch_loss(x, target, weight=None, label_smoothing=0.0, z_loss=0.0, softcap=None):
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    loss = F.cross_entropy(x, target, weight=weight, label_smoothing=label_smoothing)
    if z_loss:
        valid = target != -100
        loss = loss + z_loss * (torch.logsumexp(x.float(), -1)[valid] ** 2).mean()
    return loss


def steps(options, liger):
    """torch's, ours keeping the logits, ours in place and (with ``liger``, its functional module)
    Liger's steps of one option."""
    def ours(inplace):
        return suite._step(lambda x, t: onlinesoftmax.cross_entropy(x, t, inplace_backward=inplace, **options))

    calls = {"torch": suite._step(lambda x, t: torch_loss(x, t, **options)), "ours": ours(False),
             "inplace": ours(True)}
    if liger:
        named = {"lse_square_scale" if k == "z_loss" else k: v for k, v in options.items()}
        calls["liger"] = suite._step(lambda x, t: liger.liger_cross_entropy(x, t, **named))
    return calls


def columns(times: dict) -> str:
    """ms of each step (- where it could not be timed), then torch / ours, torch / in place, Liger / in place."""
    names = ("torch", "ours", "inplace", "liger")
    ms = " ".join(f"{'-':>7s}" if times.get(name) is None else f"{times[name]:7.3f}" for name in names)
    ratios = [ratio(times, "torch", "ours"), ratio(times, "torch", "inplace"), ratio(times, "liger", "inplace")]
    return ms + " " + " ".join("    -" if r is None else f"{r:5.2f}" for r in ratios)


def ratio(times, peer, ours):
    return times[peer] / times[ours] if times.get(peer) and times.get(ours) else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bf16", choices=list(suite.DTYPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--option", action="append", choices=list(OPTIONS), help="these options alone (repeatable)")
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    liger, why = suite._optional("liger_kernel.transformers.functional")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.dtype}; seed {args.seed}; "
          f"a step of the 'mean' loss, ms{'; ' + why if why else ''}")
    head = " ".join(f"{name:>7s}" for name in ("torch", "ours", "inplace", "liger")) + "  t/o   t/i   l/i"
    print(f"{'shape':>14s} {'option':>15s} | eager: {head} | graph: {head} | loss (ours/inplace/liger)", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    worst = []
    for rows, vocab in SHAPES:
        case = suite.case((rows, vocab), dtype)
        count = min(rotation_count(case.bytes_moved), 4)
        for option, spec in OPTIONS.items():
            if args.option and option not in args.option:
                continue
            options = {k: v for k, v in spec.items() if k not in ("weight", "ignored")}
            if spec.get("weight"):
                options["weight"] = (torch.rand(vocab, generator=gen) + 0.5).to("cuda", dtype)
            shared = [case.make_inputs(gen) for _ in range(count)]
            if spec.get("ignored"):
                for _, target in shared:
                    target[::IGNORE_EVERY] = -100
            calls = steps(options, liger)
            first, eager, graph = {}, {}, {}
            for name, call in calls.items():
                # The in-place steps (ours, Liger's) overwrite their logits: each from a fresh copy.
                own = shared if name in ("torch", "ours") else [
                    (x.detach().clone().requires_grad_(), target) for x, target in shared]
                try:
                    first[name] = call(*own[0])[0].item()
                except Exception as exc:  # an option a peer does not take
                    print(f"# {name} {option}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
                    continue
                eager[name] = back_to_back_ms(call, own)
                graph[name] = graph_time_ms(call, own)
            ours = [ratio(t, "torch", name) for t in (eager, graph) for name in ("ours", "inplace")]
            worst.append((min(r for r in ours if r is not None), f"{rows}x{vocab} {option}"))
            differences = "/".join(f"{abs(first[name] - first['torch']) / abs(first['torch']):.1e}"
                                   if name in first else "-" for name in ("ours", "inplace", "liger"))
            print(f"{rows:>6d}x{vocab:<7d} {option:>15s} | eager: {columns(eager)} | graph: {columns(graph)} | "
                  f"{differences}", flush=True)
            del shared, own
            torch.cuda.empty_cache()
    worst.sort()
    print("# ours against torch, the lowest of eager and graph, keeping the logits and in place, worst first: "
          + ", ".join(f"{cell} {value:.2f}" for value, cell in worst[:12]))


if __name__ == "__main__":
    main()
