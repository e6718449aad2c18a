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

from onlinesoftmax.bench import harness
from onlinesoftmax.bench.host_suite import host_us_alone, print_profile
from onlinesoftmax.ops.attention import plan
from probe_fused_backward import flash, input_sets, ours

HOST_SHAPES = [((1, 2, 2, 146, 136), False), ((1, 16, 1, 300, 160), True), ((1, 2, 2, 300, 64), False),
               ((1, 2, 2, 128, 64), False)]
CELLS = [((22, 12, 12, 146, 136), False), ((2, 16, 1, 1334, 160), True)]


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    for shape, causal in HOST_SHAPES:
        (inputs,) = input_sets(gen, *shape, count=1)
        ours_us = host_us_alone(lambda: ours(causal)(*inputs))
        backward = plan.last_attention_plan().describe()
        flash_us = host_us_alone(lambda: flash(causal)(*inputs))
        print(shape, "causal" if causal else "full", f"host us a forward + backward: ours {ours_us:.1f}, "
              f"flash {flash_us:.1f}; {backward[:90]}", flush=True)
    (inputs,) = input_sets(gen, 1, 16, 1, 300, 160, count=1)
    print_profile(lambda: ours(True)(*inputs), 25)
    for shape, causal in CELLS:
        sets = input_sets(gen, *shape, count=3)
        for name, fn in (("ours", ours(causal)), ("flash", flash(causal))):
            print(shape, "causal" if causal else "full", name, f"eager {harness.back_to_back_ms(fn, sets):.4f}",
                  f"do_bench {harness.time_ms(fn, sets):.4f}", f"graph {harness.graph_time_ms(fn, sets):.4f}",
                  flush=True)


if __name__ == "__main__":
    main()
