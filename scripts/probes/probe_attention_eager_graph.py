"""The attention forward + backward timed four ways on one shape, to check a gap the bench showed
(its eager fwd+bwd of the long non-causal shapes 11-14% above the CUDA-graph time, three runs):
the autograd path (``onlinesoftmax.attention`` + ``torch.autograd.grad``, as the bench) and the
launchers called directly, each with the bench's eager timing (``harness.time_ms``: 100 ms of
calls), a longer eager timing (1.5 s), the bench's CUDA-graph timing and the bench's eager timing
again; the caching allocator's device allocations and retries counted across the eager timings.

    python scripts/probes/probe_attention_eager_graph.py      (GPU; bf16, two rotated input sets)
"""

import torch

import onlinesoftmax
from onlinesoftmax.bench import harness
from onlinesoftmax.ops.attention import launch as attention_launch
SHAPES = [(1, 16, 16, 16384, 128), (2, 32, 8, 8192, 128), (4, 16, 16, 4096, 128)]


def input_sets(gen, batch, heads_q, heads_kv, seq, head_dim, count=2):
    sets = []
    for _ in range(count):
        q = torch.randn(batch, heads_q, seq, head_dim, device="cuda", generator=gen).bfloat16().requires_grad_()
        k, v = (torch.randn(batch, heads_kv, seq, head_dim, device="cuda", generator=gen).bfloat16().requires_grad_()
                for _ in range(2))
        sets.append((q, k, v, torch.randn(batch, heads_q, seq, head_dim, device="cuda", generator=gen).bfloat16()))
    return sets


def through_autograd(causal):
    def run(q, k, v, d_out):
        out = onlinesoftmax.attention(q, k, v, causal=causal)
        return torch.autograd.grad(out, (q, k, v), d_out)[0]
    return run


def through_launchers(causal):
    mode = "top_left" if causal else "none"

    def run(q, k, v, d_out):
        q, k, v = q.detach(), k.detach(), v.detach()
        out, lse = attention_launch.launch_forward(q, k, v, mode, q.shape[-1] ** -0.5)
        return attention_launch.launch_backward(d_out, q, k, v, out, lse, mode, q.shape[-1] ** -0.5)[0]
    return run


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}; milliseconds per forward + backward")
    for shape in SHAPES:
        sets = input_sets(gen, *shape)
        for causal in (False, True):
            parts = []
            for name, fn in (("autograd", through_autograd(causal)), ("launchers", through_launchers(causal))):
                fn(*sets[0])
                torch.cuda.synchronize()
                before = torch.cuda.memory_stats()
                bench_eager = harness.time_ms(fn, sets)
                long_eager = harness.time_ms(fn, sets, rep_ms=1500)
                after = torch.cuda.memory_stats()
                graph = harness.graph_time_ms(fn, sets)
                again = harness.time_ms(fn, sets)
                parts.append(f"{name}: bench eager {bench_eager:.2f}, 1.5 s eager {long_eager:.2f}, graph {graph:.2f}, "
                             f"bench eager again {again:.2f} (device allocations +{after['num_device_alloc'] - before['num_device_alloc']}, "
                             f"retries +{after['num_alloc_retries'] - before['num_alloc_retries']})")
            print(shape, "causal" if causal else "non-causal", " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
