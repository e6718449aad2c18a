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

import torch

from probe_fused_backward import compare_settings, input_sets, shapes_from_argv

SHAPES = [(4, 28, 4, 2770, 32), (5, 28, 4, 8936, 32), (8, 16, 16, 4096, 32), (16, 16, 16, 1024, 64),
          (4, 32, 8, 4096, 64), (8, 16, 16, 1024, 128), (4, 32, 8, 4096, 128), (1, 16, 16, 16384, 128),
          (36, 12, 12, 155, 128), (4, 40, 8, 541, 128), (8, 16, 16, 2048, 256), (11, 16, 1, 388, 80),
          (10, 16, 16, 3000, 96)]
# (dK/dV, dQ): the smallest GQA group that takes the order (0: none; 1: every layout).
SETTINGS = {"by head": (0, 0), "dK/dV first": (1, 0), "dQ first": (0, 1), "both first": (1, 1)}


def main():
    shapes = shapes_from_argv(SHAPES)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; causal forward + backward, ms "
          "(do_bench / back to back / graph)", flush=True)
    for shape in shapes:
        settings = {name: {"ATTENTION_BACKWARD_HEAVY_FIRST": {"backward_dkdv": dkdv, "backward_dq": dq}}
                    for name, (dkdv, dq) in SETTINGS.items()}
        print(shape, " | ".join(compare_settings(input_sets(gen, *shape), True, settings)), flush=True)


if __name__ == "__main__":
    main()
