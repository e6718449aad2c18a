"""The causal backward's grid with every head's heaviest block first (plan.ATTENTION_BACKWARD_HEAVY_FIRST:
the dK/dV kernel's first key block, the dQ kernel's last query block, of every batch and head before
any next block) against blocks ordered within each head, beside SDPA's FLASH backend.

With a causal mask a program's work falls linearly from its head's heaviest block to its lightest.
Ordered head by head, the heaviest blocks of the last heads launch in the grid's last wave and run
after the rest of the GPU has finished; with the grid's axes swapped the last wave holds the
lightest programs of every head. The shapes: the attention sweep's head dim 32 cells that trail
FLASH (GQA groups of seven: few, long dK/dV programs), and causal rows at other head dims and
lengths, MHA and GQA. The plan's rule (GQA only, the dK/dV kernel only) came from this run.

Each line: a shape (batch, Hq, Hkv, S, D), then per setting milliseconds of causal forward +
backward through autograd (do_bench median over four rotated input sets / calls back to back /
CUDA-graph replays), dK's relative difference from the first setting, and FLASH's.

    python scripts/probes/probe_heavy_first.py [--shapes BxHQxHKVxSxD,...]     (GPU; bf16)
"""

import sys

import torch

import onlinesoftmax

from probe_fused_backward import flash, input_sets, ours, timings

SHAPES = [(4, 28, 4, 2770, 32), (5, 28, 4, 8936, 32), (8, 16, 16, 4096, 32), (16, 16, 16, 1024, 64),
          (4, 32, 8, 4096, 64), (8, 16, 16, 1024, 128), (4, 32, 8, 4096, 128), (1, 16, 16, 16384, 128),
          (36, 12, 12, 155, 128), (4, 40, 8, 541, 128), (8, 16, 16, 2048, 256), (11, 16, 1, 388, 80),
          (10, 16, 16, 3000, 96)]
# (dK/dV, dQ): the smallest GQA group that takes the order (0: none; 1: every layout).
SETTINGS = {"by head": (0, 0), "dK/dV first": (1, 0), "dQ first": (0, 1), "both first": (1, 1)}


def main():
    shapes = SHAPES
    if "--shapes" in sys.argv:
        text = sys.argv[sys.argv.index("--shapes") + 1]
        shapes = [tuple(int(v) for v in item.split("x")) for item in text.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; causal forward + backward, ms "
          "(do_bench / back to back / graph)", flush=True)
    for shape in shapes:
        sets = input_sets(gen, *shape)
        parts = []
        reference = None
        for name, (dkdv, dq) in SETTINGS.items():
            with onlinesoftmax.override_plan("attention", ATTENTION_BACKWARD_HEAVY_FIRST={
                    "backward_dkdv": dkdv, "backward_dq": dq}):
                q, k, v, d_out = sets[0]
                dk = torch.autograd.grad(onlinesoftmax.attention(q, k, v, causal=True), k, d_out)[0]
                times = timings(ours(True), sets)
            error = 0.0
            if reference is None:
                reference = dk.float()
            else:
                error = ((dk.float() - reference).norm() / reference.norm()).item()
            parts.append(f"{name} (dk {error:.0e}) " + "/".join("-" if t is None else f"{t:.4f}" for t in times))
            del dk
        times = timings(flash(True), sets)
        parts.append("flash " + "/".join("-" if t is None else f"{t:.4f}" for t in times))
        print(shape, " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
