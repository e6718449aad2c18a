"""cross_entropy and softmax_topk on CPU tensors (no Triton: their torch paths) against
F.cross_entropy and torch.topk(torch.softmax(x)).

One forward and one training step (forward, backward, the gradient dropped) per shape, ms, medians
of seven rounds in which ours and torch's alternate. Time an older tree the same way with
PYTHONPATH=<tree>/src. The host's threads and its allocator's state move torch's own times too.

    python scripts/probes/probe_cpu_torch_paths.py
"""

import statistics
import time

import torch
import torch.nn.functional as F

import onlinesoftmax

SHAPES = ((8, 1024), (1, 50257), (16, 32000), (64, 32000), (256, 50257), (512, 50257), (2048, 4097), (1024, 128256))
TOPK_SHAPES = ((64, 32000, 50), (512, 50257, 5), (1024, 128256, 5))


def per_call_ms(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def training_step(loss_fn, logits, target):
    def step():
        loss_fn(logits, target).backward()
        logits.grad = None
    return step


def topk_values(k):
    def ours(x, _):
        return onlinesoftmax.softmax_topk(x, k)[0].sum()

    def theirs(x, _):
        return torch.topk(torch.softmax(x, -1), k).values.sum()
    return ours, theirs


def compare(label, ours, theirs):
    ours(), theirs()
    start = time.perf_counter()
    ours()
    calls = max(2, min(100, int(0.1 / max(time.perf_counter() - start, 1e-6))))
    mine, torchs = [], []
    for _ in range(7):
        mine.append(per_call_ms(ours, calls))
        torchs.append(per_call_ms(theirs, calls))
    a, b = statistics.median(mine), statistics.median(torchs)
    print(f"{label} ours {a:8.3f} torch {b:8.3f} torch/ours {b / a:5.2f}", flush=True)


def main():
    print("onlinesoftmax from", onlinesoftmax.__file__, "torch", torch.__version__, "threads", torch.get_num_threads())
    for dtype in (torch.float32, torch.bfloat16):
        for rows, cols in SHAPES:
            x = torch.randn(rows, cols).to(dtype)
            target = torch.randint(0, cols, (rows,))
            leaf = x.clone().requires_grad_()
            cases = {"fwd": (lambda: onlinesoftmax.cross_entropy(x, target), lambda: F.cross_entropy(x, target)),
                     "step": (training_step(onlinesoftmax.cross_entropy, leaf, target),
                              training_step(F.cross_entropy, leaf, target))}
            for name, (ours, theirs) in cases.items():
                compare(f"cross_entropy {str(dtype)[6:]:8s} {rows}x{cols:<7d} {name:4s}", ours, theirs)
        for rows, cols, k in TOPK_SHAPES:
            x = torch.randn(rows, cols).to(dtype)
            leaf = x.clone().requires_grad_()
            ours, theirs = topk_values(k)
            compare(f"softmax_topk  {str(dtype)[6:]:8s} {rows}x{cols}:k{k} fwd ", lambda: ours(x, None),
                    lambda: theirs(x, None))
            compare(f"softmax_topk  {str(dtype)[6:]:8s} {rows}x{cols}:k{k} step", training_step(ours, leaf, None),
                    training_step(theirs, leaf, None))


if __name__ == "__main__":
    main()
