"""Host time of an eager attention training step where the backward runs its split kernels (GPU; bf16)

bench host's attention step (S128) takes the fused backward, one launch. Past one key block the
backward launches delta, dK/dV and dQ, and where the dK/dV programs share a GQA group it sums
their float32 partials too. Host microseconds per forward + backward of tiny problems on each
path beside SDPA's FLASH backend (bench host's ``host_us``), a cProfile of the group-split step,
then two random-shape sweep cells whose eager timing had trailed FLASH (B22 H12 S146 D136, B2
H16/1 S1334 D160 causal), eager back to back, do_bench and CUDA-graph replays, ms.

    python scripts/probes/probe_attention_split_host.py
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import onlinesoftmax
from onlinesoftmax.bench import harness
from onlinesoftmax.bench.host_suite import host_us, print_profile
from onlinesoftmax.ops.attention import plan

HOST_SHAPES = [((1, 2, 2, 146, 136), False), ((1, 16, 1, 300, 160), True), ((1, 2, 2, 300, 64), False),
               ((1, 2, 2, 128, 64), False)]
CELLS = [((22, 12, 12, 146, 136), False), ((2, 16, 1, 1334, 160), True)]


def qkv(batch, heads_q, heads_kv, seq, head_dim):
    return [torch.randn(batch, h, seq, head_dim, device="cuda", dtype=torch.bfloat16).requires_grad_()
            for h in (heads_q, heads_kv, heads_kv)]


def ours(causal):
    def run(q, k, v, d_out):
        return torch.autograd.grad(onlinesoftmax.attention(q, k, v, causal=causal), (q, k, v), d_out)
    return run


def flash(causal):
    def run(q, k, v, d_out):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        return torch.autograd.grad(out, (q, k, v), d_out)
    return run


def main():
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    for shape, causal in HOST_SHAPES:
        q, k, v = qkv(*shape)
        d_out = torch.randn_like(q)
        ours_us = host_us(lambda: ours(causal)(q, k, v, d_out))
        backward = plan.last_attention_plan().describe()
        flash_us = host_us(lambda: flash(causal)(q, k, v, d_out))
        print(shape, "causal" if causal else "full", f"host us a forward + backward: ours {ours_us:.1f}, "
              f"flash {flash_us:.1f}; {backward[:90]}", flush=True)
    q, k, v = qkv(1, 16, 1, 300, 160)
    d_out = torch.randn_like(q)
    print_profile(lambda: ours(True)(q, k, v, d_out), 25)
    for shape, causal in CELLS:
        sets = [(*qkv(*shape), None) for _ in range(3)]
        sets = [(q, k, v, torch.randn_like(q)) for q, k, v, _ in sets]
        for name, fn in (("ours", ours(causal)), ("flash", flash(causal))):
            print(shape, "causal" if causal else "full", name, f"eager {harness.back_to_back_ms(fn, sets):.4f}",
                  f"do_bench {harness.time_ms(fn, sets):.4f}", f"graph {harness.graph_time_ms(fn, sets):.4f}",
                  flush=True)


if __name__ == "__main__":
    main()
