"""The fused attention backward (one kernel: delta, dK, dV, dQ; keys in one block) against the
split one (three launches) and SDPA's FLASH backend, forward + backward through autograd, on short
sequences: which lengths and head dims the fused kernel should take, and with which config.

Each line: a shape (batch, Hq, Hkv, S, D), the mask, then per variant milliseconds of do_bench
(median, L2 flushed), of calls back to back (the host's time where it exceeds the GPU's: what an
eager loop costs) and of CUDA-graph replays. Variants are the split backward (the fused table
emptied), the plan's choice (the tables as they are; not in --first), the fused one under
candidate configs (BLOCK_M, warps, stages) at every shape, and SDPA FLASH.

    python scripts/probes/probe_fused_backward.py [--first]     (GPU; bf16, four rotated input sets)
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax
from onlinesoftmax.bench import harness
from onlinesoftmax.ops.attention import plan

# (batch, Hq, Hkv, S, D): the host bench's case, the attention sweep's S128 cells (32768 tokens),
# smaller batches, and the lengths at the tables' limits (--first: the shapes of the first run,
# which chose ATTENTION_BACKWARD_FUSED; the default: the shapes that checked the chosen table).
FIRST_SHAPES = [(1, 2, 2, 128, 64), (256, 16, 16, 128, 64), (256, 32, 8, 128, 64), (32, 16, 16, 128, 64),
                (8, 16, 16, 100, 64), (512, 16, 16, 64, 128), (32, 16, 16, 64, 128), (256, 16, 16, 128, 128),
                (256, 16, 16, 128, 96)]
FIRST_CONFIGS = [(32, 8, 2), (64, 8, 2), (16, 4, 2)]
CHECK_SHAPES = [(1, 2, 2, 128, 64), (64, 16, 16, 128, 64), (256, 16, 16, 128, 64), (512, 16, 16, 64, 64),
                (256, 32, 8, 128, 128), (512, 32, 8, 64, 128), (256, 16, 16, 128, 80), (256, 32, 8, 128, 96),
                (8, 32, 4, 37, 128)]
CHECK_CONFIGS = [(64, 8, 2), (16, 4, 2)]


def input_sets(gen, batch, heads_q, heads_kv, seq, head_dim, count=4):
    def make(heads):
        return torch.randn(batch, heads, seq, head_dim, device="cuda", generator=gen).bfloat16()
    return [(make(heads_q).requires_grad_(), make(heads_kv).requires_grad_(), make(heads_kv).requires_grad_(),
             make(heads_q)) for _ in range(count)]


def shapes_from_argv(default):
    """``--shapes BxHQxHKVxSxD,...`` from the command line, else ``default``."""
    if "--shapes" not in sys.argv:
        return default
    text = sys.argv[sys.argv.index("--shapes") + 1]
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",")]


def ours(causal):
    def run(q, k, v, d_out):
        return torch.autograd.grad(onlinesoftmax.attention(q, k, v, causal=causal), (q, k, v), d_out)[0]
    return run


def sdpa_forward(causal):
    """SDPA's FLASH backend, forward alone (GQA through enable_gqa)."""
    def run(q, k, v, d_out):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return run


def flash(causal):
    forward = sdpa_forward(causal)

    def run(q, k, v, d_out):
        return torch.autograd.grad(forward(q, k, v, d_out), (q, k, v), d_out)[0]
    return run


def timings(fn, sets):
    fn(*sets[0])
    torch.cuda.synchronize()
    graph = harness.graph_time_ms(fn, sets)
    return (harness.time_ms(fn, sets), harness.back_to_back_ms(fn, sets), graph)


def format_times(times) -> str:
    return "/".join("-" if t is None else f"{t:.4f}" for t in times)


def compare_settings(sets, causal, settings, label=lambda: ""):
    """One output line's parts: per setting (name -> attention plan tables for override_plan), dK's
    relative difference from the first setting's, ``label()`` under it and the timings; then FLASH's."""
    q, k, v, d_out = sets[0]
    parts, reference = [], None
    for name, tables in settings.items():
        with onlinesoftmax.override_plan("attention", **tables):
            dk = torch.autograd.grad(onlinesoftmax.attention(q, k, v, causal=causal), k, d_out)[0].float()
            note = label()
            times = timings(ours(causal), sets)
        reference = dk if reference is None else reference
        error = ((dk - reference).norm() / reference.norm()).item()
        parts.append(f"{name} ({note}dk {error:.0e}) {format_times(times)}")
    parts.append(f"flash {format_times(timings(flash(causal), sets))}")
    return parts


def main():
    first = "--first" in sys.argv
    shapes, configs = (FIRST_SHAPES, FIRST_CONFIGS) if first else (CHECK_SHAPES, CHECK_CONFIGS)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; ms per forward + backward "
          "(do_bench / back to back / graph)", flush=True)
    for shape in shapes:
        sets = input_sets(gen, *shape)
        head_dim, seq = shape[4], shape[3]
        for causal in (False, True):
            variants = [("split", dict(ATTENTION_BACKWARD_FUSED=()))] + ([] if first else [("plan", {})])
            variants += [(f"fused {m}x{w}w{s}s", dict(ATTENTION_BACKWARD_FUSED=((head_dim, seq, 0, m, w, s),)))
                         for m, w, s in configs]
            parts = []
            for name, tables in variants:
                with onlinesoftmax.override_plan("attention", **tables):
                    try:
                        times = timings(ours(causal), sets)
                        kernel = plan.last_attention_plan().kernel
                    except Exception as error:  # a config that does not compile (registers, shared memory)
                        parts.append(f"{name}: {type(error).__name__}")
                        continue
                if name == "plan":
                    name = f"plan ({kernel[9:]})"
                else:
                    assert kernel == ("backward_dkdv" if name == "split" else "backward_fused"), (name, kernel)
                parts.append(f"{name} " + "/".join("-" if t is None else f"{t:.4f}" for t in times))
            times = timings(flash(causal), sets)
            parts.append("flash " + "/".join("-" if t is None else f"{t:.4f}" for t in times))
            print(shape, "causal" if causal else "full", " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
