"""Eager backward steps of rows off 16-byte boundaries, the one-chunk rule on and off, beside torch (GPU).

    python scripts/probes/probe_backward_one_chunk.py

A sweep re-run after the backward's one-chunk rule (plan.MISALIGNED_ONE_CHUNK_*) had bf16
3077 x 12867 slower in its eager steps (0.0869 -> 0.1209 ms) while its kernel ran faster under CUDA
graphs (3403 -> 3893 GB/s), torch's own step moving by 20% in the same run. This times the step
(``torch.autograd.grad`` of a kept graph) with the rule, without it (looped for 2-byte rows, the head
and tail for fp32) and torch's, three rounds in turn, to tell the rule from the host's variation.
"""

import torch
import triton

import onlinesoftmax
from onlinesoftmax.ops.softmax import plan

RULE_OFF = dict(MISALIGNED_ONE_CHUNK_TILES=dict(plan.MISALIGNED_ONE_CHUNK_TILES, backward={4: (), 2: ()}))
SHAPES = ((torch.bfloat16, 3077, 12867), (torch.bfloat16, 4096, 10007), (torch.float32, 2443, 12143))


def step_ms(forward, x, dy):
    y = forward(x, -1)
    return triton.testing.do_bench(lambda: torch.autograd.grad(y, x, dy, retain_graph=True), warmup=50, rep=200)


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; ms a step")
    for dtype, rows, cols in SHAPES:
        for log in (False, True):
            inputs = [torch.randn(rows, cols, device="cuda", dtype=dtype).requires_grad_() for _ in range(3)]
            dy = torch.randn(rows, cols, device="cuda", dtype=dtype)
            ours = onlinesoftmax.log_softmax if log else onlinesoftmax.softmax
            theirs = torch.log_softmax if log else torch.softmax
            times = {"one chunk": [], "rule off": [], "torch": []}
            for x in inputs:  # a fresh input each round
                times["one chunk"].append(step_ms(ours, x, dy))
                with onlinesoftmax.override_plan("softmax", **RULE_OFF):
                    times["rule off"].append(step_ms(ours, x, dy))
                times["torch"].append(step_ms(theirs, x, dy))
            print(str(dtype)[6:], rows, cols, "log" if log else "softmax",
                  " ".join(f"{name}: " + "/".join(f"{t:.4f}" for t in ts) for name, ts in times.items()), flush=True)


if __name__ == "__main__":
    main()
