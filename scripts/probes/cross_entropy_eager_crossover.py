"""Where an eager cross_entropy call of ours beats F.cross_entropy (GPU): the crossover behind its eager torch route.

For bf16 and fp32 logits, rows x vocabulary from one row to a few hundred MB, the options torch has
(a "mean" loss, int64 targets): microseconds per call of torch and ours with our kernels forced
(the route off), called back to back between two CUDA events over rotated inputs (the host's time
wherever it exceeds the GPU's):
- a training step: forward, then the gradient of the logits through autograd;
- a forward without autograd (evaluation);
- the training step replayed from a CUDA graph (the GPU's time alone).

    python scripts/probes/cross_entropy_eager_crossover.py

The thresholds of ``plan.EAGER_TORCH_MAX_ELEMENTS`` come from this table.
"""

import torch
import torch.nn.functional as F

import onlinesoftmax
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms, rotation_count
from onlinesoftmax.ops.cross_entropy import plan

ROWS = (1, 8, 64, 256, 1024, 4096, 16384)
VOCABS = (1000, 32000, 50257, 128256)
ROUTE_OFF = dict(EAGER_TORCH_MAX_ELEMENTS={"train": 0, "forward": 0})


def step(loss_fn):
    def run(x, t):
        x.grad = None
        loss_fn(x, t).backward()
    return run


def forward(loss_fn):
    def run(x, t):
        with torch.no_grad():
            loss_fn(x, t)
    return run


def main():
    gen = torch.Generator().manual_seed(0)
    print("dtype rows vocab elements | train eager us: torch ours | forward eager us: torch ours | "
          "train graph us: torch ours", flush=True)
    with onlinesoftmax.override_plan("cross_entropy", **ROUTE_OFF):
        for dtype in (torch.bfloat16, torch.float32):
            for vocab in VOCABS:
                for rows in ROWS:
                    if rows * vocab * dtype.itemsize > 2**30:
                        continue
                    sets = [((torch.randn(rows, vocab, generator=gen) * 2).to("cuda", dtype).requires_grad_(),
                             torch.randint(0, vocab, (rows,), generator=gen).cuda())
                            for _ in range(rotation_count(rows * vocab * dtype.itemsize * 3))]
                    row = []
                    for make in (step, forward):
                        for loss_fn in (F.cross_entropy, onlinesoftmax.cross_entropy):
                            row.append(back_to_back_ms(make(loss_fn), sets) * 1000)
                    for loss_fn in (F.cross_entropy, onlinesoftmax.cross_entropy):
                        row.append(graph_time_ms(step(loss_fn), sets[0]) * 1000)
                    name = str(dtype).replace("torch.", "")
                    print(f"{name} {rows} {vocab} {rows * vocab} | {row[0]:.1f} {row[1]:.1f} | {row[2]:.1f} "
                          f"{row[3]:.1f} | {row[4]:.1f} {row[5]:.1f}", flush=True)


if __name__ == "__main__":
    main()
