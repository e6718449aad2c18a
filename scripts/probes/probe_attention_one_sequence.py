"""Attention forward + backward of one sequence at few heads, where the random-shape sweep of seed
3205 left ours behind SDPA's FLASH (B1 H12 S2382 D48 eager 0.69x, its CUDA-graph replay level;
B1 H8 S2195 D72 causal 0.96x): eager (the bench's do_bench timing and calls back to back), CUDA-graph
replay and the host's time per step (the GPU held busy by a sleeping kernel meanwhile, so the
host never waits on it), ours beside FLASH in one process, three rounds, bf16.

    python scripts/probes/probe_attention_one_sequence.py [--shapes B,Hq,Hkv,S,D,causal;...]
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax
from onlinesoftmax.bench import harness

SHAPES = "1,12,12,2382,48,0;1,12,12,2382,48,1;1,8,8,2195,72,1;1,12,12,2048,64,0"


def input_sets(gen, batch, heads_q, heads_kv, seq, head_dim):
    def one():
        q = torch.randn(batch, heads_q, seq, head_dim, device="cuda", generator=gen).bfloat16().requires_grad_()
        k, v = (torch.randn(batch, heads_kv, seq, head_dim, device="cuda", generator=gen).bfloat16().requires_grad_()
                for _ in range(2))
        return q, k, v, torch.randn(batch, heads_q, seq, head_dim, device="cuda", generator=gen).bfloat16()
    per_set = 2 * 2 * (batch * (heads_q + heads_kv) * seq * head_dim) * 2
    return [one() for _ in range(harness.rotation_count(per_set))]


def host_us_at_shape(fn, inputs, calls=60):
    """Host microseconds per call of ``fn`` at a real shape: the GPU sleeps through the timed calls
    (about 5 kernels a step, well inside the launch queue), so only the host's work is timed."""
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second at the H200's clock
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return seconds / calls * 1e6


def steps(causal):
    def ours(q, k, v, d_out):
        out = onlinesoftmax.attention(q, k, v, causal=bool(causal))
        return torch.autograd.grad(out, (q, k, v), d_out)[0]

    def flash(q, k, v, d_out):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        return torch.autograd.grad(out, (q, k, v), d_out)[0]
    return ours, flash


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(3205)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; bf16 forward + backward, ms (host: us a step)")
    for text in args.shapes.split(";"):
        b, hq, hkv, s, d, causal = (int(x) for x in text.split(","))
        sets = input_sets(gen, b, hq, hkv, s, d)
        ours, flash = steps(causal)
        for fn in (ours, flash):
            fn(*sets[0])
        for round_ in range(3):
            cells = {}
            for name, fn in (("ours", ours), ("flash", flash)):
                cells[name] = (harness.time_ms(fn, sets), harness.back_to_back_ms(fn, sets),
                               harness.graph_time_ms(fn, sets))
            host = host_us_at_shape(ours, sets[0]), host_us_at_shape(flash, sets[0])
            o, f = cells["ours"], cells["flash"]
            print(f"B{b} H{hq}/{hkv} S{s} D{d} {'causal' if causal else 'non-causal'} round {round_}: "
                  f"do_bench {o[0]:.4f} / {f[0]:.4f} ({f[0] / o[0]:.2f}x), back to back {o[1]:.4f} / {f[1]:.4f} "
                  f"({f[1] / o[1]:.2f}x), graph {o[2]:.4f} / {f[2]:.4f} ({f[2] / o[2]:.2f}x); "
                  f"host {host[0]:.1f} / {host[1]:.1f} us", flush=True)


if __name__ == "__main__":
    main()
