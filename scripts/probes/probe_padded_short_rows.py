"""Should head dims padded to a power of two read their padded dim's short-sequence rows? (GPU; bf16)

ATTENTION_SHORT_CONFIGS names head dims; a dim padded whole (24 to 32, 40 and 48 to 64, 80 and 112
to 128 in the backward) found no row of its own and took the long tables' configs, whose blocks
suit thousands of keys: B16 H32 S233 D40's forward ran at 0.88x FLASH on 64 x 128 blocks where D64
runs 64 x 32. ``plan.ATTENTION_SHORT_CONFIGS_PADDED`` gives such dims their padded dim's rows.

Each line: a shape (batch, Hq, Hkv, S, D) and mask, then ms (do_bench median over four rotated
input sets) of the forward and of forward + backward through autograd, with the padded dim's rows
("padded rows") and without ("long tables"), and SDPA's FLASH backend.

    python scripts/probes/probe_padded_short_rows.py [--shapes BxHQxHKVxSxD,...]
"""

import torch

import onlinesoftmax
from onlinesoftmax.bench import harness
from probe_fused_backward import flash, input_sets, ours, shapes_from_argv, sdpa_forward

SHAPES = [(16, 32, 32, 233, 40), (64, 16, 16, 512, 40), (32, 16, 16, 1000, 40), (256, 16, 16, 128, 48),
          (64, 16, 16, 512, 48), (64, 32, 8, 300, 24), (16, 16, 16, 1000, 24), (121, 16, 16, 373, 112),
          (64, 16, 16, 512, 112), (64, 16, 16, 512, 80), (16, 16, 16, 2048, 80)]
SETTINGS = {"padded rows": True, "long tables": False}


def forward(causal):
    return lambda q, k, v, d_out: onlinesoftmax.attention(q, k, v, causal=causal)


def main():
    shapes = shapes_from_argv(SHAPES)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; ms, forward / forward + backward", flush=True)
    for shape in shapes:
        sets = input_sets(gen, *shape)
        for causal in (False, True):
            parts = []
            for name, padded in SETTINGS.items():
                with onlinesoftmax.override_plan("attention", ATTENTION_SHORT_CONFIGS_PADDED=padded):
                    parts.append(f"{name} {harness.time_ms(forward(causal), sets):.4f} / "
                                 f"{harness.time_ms(ours(causal), sets):.4f}")
            parts.append(f"flash {harness.time_ms(sdpa_forward(causal), sets):.4f} / "
                         f"{harness.time_ms(flash(causal), sets):.4f}")
            print(shape, "causal" if causal else "full", " | ".join(parts), flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
