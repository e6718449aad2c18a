"""Programmatically dependent launches of the kernels that follow another (GPU).

    python scripts/probes/probe_programmatic_launch.py

A kernel launched with programmatic dependent launch (_launch.dependent_launch) may be scheduled
while the kernel before it in the stream still runs and waits (griddepcontrol.wait) until that one
has finished; the kernel before it may let it be scheduled early (griddepcontrol.launch_dependents).
This times public calls whose launches follow one another with such launches and with plain ones
(_device.PROGRAMMATIC_LAUNCH): cross_entropy of probability targets (a "mean" loss: the rows, a
merge of chunks, the reduction; forward alone and forward + backward through torch.autograd.grad)
and attention_with_kvcache (the split kernel, then the merge). Under CUDA graphs and eager: ms,
medians of do_bench_cudagraph and do_bench, each setting twice in turn, in one process on the
same inputs; the outputs of the two settings compared bitwise.
"""
import torch
import triton

import onlinesoftmax
from onlinesoftmax import _device

PROBABILITY_SHAPES = {torch.bfloat16: [(6, 571), (32, 1000), (225, 108), (4007, 369), (1952, 1151), (64, 256000),
                                       (8192, 50257)],
                      torch.float32: [(225, 108), (4007, 369), (119, 15792), (777, 50257)]}
# (batch, queries, query heads, KV heads, keys, head dim)
DECODE_SHAPES = [(1, 1, 32, 8, 4096, 128), (1, 1, 32, 8, 131072, 128), (1, 1, 8, 1, 131072, 128),
                 (4, 1, 32, 8, 32768, 64), (64, 1, 32, 8, 4096, 128), (32, 4, 8, 1, 8192, 128)]


def probability_case(rows, cols, dtype):
    x = torch.randn(rows, cols, device="cuda", dtype=dtype).requires_grad_()
    p = torch.softmax(torch.randn(rows, cols, device="cuda"), -1).to(dtype)

    def forward():
        with torch.no_grad():
            return onlinesoftmax.cross_entropy(x, p)

    def step():
        return torch.autograd.grad(onlinesoftmax.cross_entropy(x, p), x)[0]

    return f"cross_entropy {str(dtype)[6:]} {rows}x{cols}", [forward, step]


def decode_case(batch, n_queries, heads_q, heads_kv, keys, head_dim):
    q = torch.randn(batch, n_queries, heads_q, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, keys, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def forward():
        return onlinesoftmax.attention_with_kvcache(q, k, v)

    return f"decode bf16 B{batch} Sq{n_queries} H{heads_q}/{heads_kv} S{keys} D{head_dim}", [forward]


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; ms under CUDA "
          "graphs | eager (cross_entropy: forward / forward + backward)")
    cases = [probability_case(*shape, dtype) for dtype, shapes in PROBABILITY_SHAPES.items() for shape in shapes]
    cases += [decode_case(*shape) for shape in DECODE_SHAPES]
    for name, calls in cases:
        cells, outputs = [], {}
        for setting, dependent in (("dependent", True), ("plain", False)) * 2:
            _device.PROGRAMMATIC_LAUNCH = dependent
            _device.clear_plan_caches()
            outputs[setting] = [call() for call in calls]
            graphs = [triton.testing.do_bench_cudagraph(call, rep=30) for call in calls]
            eager = [triton.testing.do_bench(call, warmup=10, rep=30) for call in calls]
            cells.append(f"{setting} " + "/".join(f"{t:.4f}" for t in graphs) + " | "
                         + "/".join(f"{t:.4f}" for t in eager))
        assert all(torch.equal(a, b) for a, b in zip(outputs["dependent"], outputs["plain"])), name
        print(f"{name}: " + "  ".join(cells), flush=True)
        del calls, outputs
    _device.PROGRAMMATIC_LAUNCH = True


if __name__ == "__main__":
    main()
