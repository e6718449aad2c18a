"""cross_entropy's options against torch (GPU): does an option make a step slower than torch's?

The bench grid times the plain loss ("mean", no options). Training recipes add label smoothing,
class weights, padding rows (ignore_index), a z-loss (PaLM) and logit soft-capping (Gemma 2). Here
one training step (the "mean" loss, then the gradient of the logits through torch.autograd.grad) per
option, at vocabulary-sized rows:

    torch:    F.cross_entropy with the option; the z-loss and soft-capping as one writes them in
              torch ops (tanh before the loss; z_loss * logsumexp^2 over the rows that count);
    ours:     onlinesoftmax.cross_entropy keeping the logits, and in place (inplace_backward=True).

Each timed two ways on the same inputs (a few sets in turn, rotated past L2 where they are small
enough): eager calls back to back (harness.back_to_back_ms, what a loop of eager steps costs) and
CUDA-graph replays (harness.graph_time_ms). Ratios are torch's time over ours (above 1: ours
faster); "loss" is the relative difference of our loss from torch's on the first set (the same
quantity, to rounding).

    python scripts/probes/probe_cross_entropy_options.py [--dtype bf16] [--seed 0]
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


def steps(options):
    """(torch's, ours keeping the logits, ours in place) steps of one option."""
    def ours(inplace):
        return suite._step(lambda x, t: onlinesoftmax.cross_entropy(x, t, inplace_backward=inplace, **options))

    return {"torch": suite._step(lambda x, t: torch_loss(x, t, **options)), "ours": ours(False),
            "inplace": ours(True)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bf16", choices=list(suite.DTYPES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = suite.DTYPES[args.dtype]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.dtype}; seed {args.seed}; "
          "a step of the 'mean' loss, ms")
    print(f"{'shape':>14s} {'option':>15s} | {'eager: torch':>12s} {'ours':>7s} {'inplace':>7s} {'ratios':>11s} | "
          f"{'graph: torch':>12s} {'ours':>7s} {'inplace':>7s} {'ratios':>11s} | loss", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    worst = []
    for rows, vocab in SHAPES:
        case = suite.case((rows, vocab), dtype)
        count = min(rotation_count(case.bytes_moved), 4)
        for option, spec in OPTIONS.items():
            options = {k: v for k, v in spec.items() if k not in ("weight", "ignored")}
            if spec.get("weight"):
                options["weight"] = (torch.rand(vocab, generator=gen) + 0.5).to("cuda", dtype)
            shared = [case.make_inputs(gen) for _ in range(count)]
            if spec.get("ignored"):
                for _, target in shared:
                    target[::IGNORE_EVERY] = -100
            # The in-place step overwrites its logits: a copy of its own (the same values, for the loss).
            sets = {"shared": shared,
                    "own": [(x.detach().clone().requires_grad_(), target) for x, target in shared]}
            calls = steps(options)
            first = {name: call(*sets["own" if name == "inplace" else "shared"][0])[0].item()
                     for name, call in calls.items()}
            eager, graph = {}, {}
            for name, call in calls.items():
                own = sets["own" if name == "inplace" else "shared"]
                eager[name] = back_to_back_ms(call, own)
                graph[name] = graph_time_ms(call, own)
            ratios = [eager["torch"] / eager[name] for name in ("ours", "inplace")]
            graph_ratios = [graph["torch"] / graph[name] if graph[name] and graph["torch"] else float("nan")
                            for name in ("ours", "inplace")]
            worst.append((min(ratios + graph_ratios), f"{rows}x{vocab} {option}"))
            differences = "/".join(f"{abs(first[name] - first['torch']) / abs(first['torch']):.1e}"
                                   for name in ("ours", "inplace"))
            print(f"{rows:>6d}x{vocab:<7d} {option:>15s} | {eager['torch']:12.3f} {eager['ours']:7.3f} "
                  f"{eager['inplace']:7.3f} {ratios[0]:5.2f} {ratios[1]:5.2f} | "
                  + " ".join("-" if graph[name] is None else f"{graph[name]:{w}.3f}"
                             for name, w in (("torch", 12), ("ours", 7), ("inplace", 7)))
                  + f" {graph_ratios[0]:5.2f} {graph_ratios[1]:5.2f} | {differences}", flush=True)
            del sets
            torch.cuda.empty_cache()
    worst.sort()
    print("# the lower of ours against torch (eager or graph, keeping the logits or in place), worst first: "
          + ", ".join(f"{cell} {ratio:.2f}" for ratio, cell in worst[:12]))


if __name__ == "__main__":
    main()
