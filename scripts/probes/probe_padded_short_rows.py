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
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax
from onlinesoftmax.bench import harness
from probe_fused_backward import input_sets, shapes_from_argv

SHAPES = [(16, 32, 32, 233, 40), (64, 16, 16, 512, 40), (32, 16, 16, 1000, 40), (256, 16, 16, 128, 48),
          (64, 16, 16, 512, 48), (64, 32, 8, 300, 24), (16, 16, 16, 1000, 24), (121, 16, 16, 373, 112),
          (64, 16, 16, 512, 112), (64, 16, 16, 512, 80), (16, 16, 16, 2048, 80)]
SETTINGS = {"padded rows": True, "long tables": False}


def forward(causal):
    return lambda q, k, v, d_out: onlinesoftmax.attention(q, k, v, causal=causal)


def training(causal):
    def run(q, k, v, d_out):
        return torch.autograd.grad(onlinesoftmax.attention(q, k, v, causal=causal), (q, k, v), d_out)
    return run


def flash(causal, backward):
    def run(q, k, v, d_out):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        return torch.autograd.grad(out, (q, k, v), d_out) if backward else out
    return run


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
                                 f"{harness.time_ms(training(causal), sets):.4f}")
            parts.append(f"flash {harness.time_ms(flash(causal, False), sets):.4f} / "
                         f"{harness.time_ms(flash(causal, True), sets):.4f}")
            print(shape, "causal" if causal else "full", " | ".join(parts), flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
