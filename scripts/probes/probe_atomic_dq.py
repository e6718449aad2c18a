"""Is a backward that sums dQ by atomics faster? (GPU; bf16) A trial, reverted after this run.

The deterministic backward runs two kernels over the score matrix: dK/dV (one program a key block,
four products: S, dP, dV += P^T dO, dK += dS^T Q) and dQ (one program a query block, three: S, dP,
dQ += dS K), seven products where FlashAttention-2 does five: its dK/dV kernel also adds each key
block's dS K into a float32 dQ by atomics, and no dQ kernel runs (``attention(...,
deterministic=False)`` in the trial). The atomics cost L2 traffic instead: BLOCK_M x D float32
additions for every (query block, key block) pair, 2.5 x BLOCK_N FLOPs of the five products for
each byte added, so larger key blocks matter more there than in the deterministic kernel.

Each line: a shape (batch, Hq, Hkv, S, D) and mask, then ms of forward + backward through autograd
(do_bench median over four rotated input sets) for the deterministic plan, the atomic one at the
plan's dK/dV config and at other dK/dV configs (BLOCK_M, BLOCK_N, warps, stages), each with dQ's
relative difference from the deterministic dQ; then SDPA's FLASH and cuDNN backends.

    python scripts/probes/probe_atomic_dq.py [--shapes BxHQxHKVxSxD,...]
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax
from onlinesoftmax.bench import harness
from onlinesoftmax.ops.attention import plan
from probe_fused_backward import input_sets, shapes_from_argv

SHAPES = [(64, 16, 16, 512, 32), (16, 16, 16, 1024, 64), (8, 16, 16, 4096, 64), (4, 32, 8, 4096, 64),
          (16, 16, 16, 2048, 128), (4, 16, 16, 8192, 128), (4, 32, 8, 4096, 128), (2, 16, 16, 16384, 128),
          (10, 16, 16, 3000, 96), (8, 16, 16, 2048, 256)]
DKDV_CONFIGS = [(32, 128, 8, 2), (64, 128, 8, 2), (64, 64, 4, 2)]


def dkdv_forced(config):
    """override_plan tables that give the dK/dV kernel ``config`` at every head dim and length."""
    return dict(ATTENTION_CONFIGS=dict(plan.ATTENTION_CONFIGS, backward_dkdv=((1 << 30, config, config),)),
                ATTENTION_HEAD_DIM_CONFIGS={k: rows for k, rows in plan.ATTENTION_HEAD_DIM_CONFIGS.items()
                                            if k != "backward_dkdv"},
                ATTENTION_SHORT_CONFIGS=dict.fromkeys(plan.ATTENTION_SHORT_CONFIGS, ()))


def ours(causal, deterministic):
    def run(q, k, v, d_out):
        out = onlinesoftmax.attention(q, k, v, causal=causal, deterministic=deterministic)
        return torch.autograd.grad(out, (q, k, v), d_out)[0]
    return run


def sdpa(causal, backend):
    def run(q, k, v, d_out):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        return torch.autograd.grad(out, (q, k, v), d_out)[0]
    return run


def timed(fn, sets):
    dq = fn(*sets[0]).float()
    torch.cuda.synchronize()
    return harness.time_ms(fn, sets), dq


def main():
    shapes = shapes_from_argv(SHAPES)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; ms per forward + backward (do_bench "
          "median), dQ's relative difference from the deterministic dQ in brackets", flush=True)
    for shape in shapes:
        sets = input_sets(gen, *shape)
        for causal in (False, True):
            base, dq0 = timed(ours(causal, True), sets)
            parts = [f"deterministic {base:.4f}"]
            for name, tables in [("atomic", {})] + [(f"atomic {c}", dkdv_forced(c)) for c in DKDV_CONFIGS]:
                try:
                    with onlinesoftmax.override_plan("attention", **tables):
                        ms, dq = timed(ours(causal, False), sets)
                    parts.append(f"{name} {ms:.4f} ({base / ms:.2f}x) [{((dq - dq0).norm() / dq0.norm()).item():.0e}]")
                except Exception as error:  # a config that does not compile (shared memory) at this head dim
                    parts.append(f"{name} failed: {type(error).__name__}")
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    parts.append(f"{name} {timed(sdpa(causal, backend), sets)[0]:.4f}")
                except RuntimeError as error:
                    parts.append(f"{name} failed: {str(error)[:40]}")
            print(shape, "causal" if causal else "full", " | ".join(parts), flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
