"""The eager route's model of torch's softmax backward, at the shapes it decides (GPU).

``eager_route.eager_torch`` gives a differentiated eager call to torch's kernels where its model of
torch's forward + backward finishes within our host time. The model streamed torch's long-row
softmax backward at 2000 GB/s (``TORCH_LONG_ROW_GBS``); the sweeps measured 1224-1233 GB/s. At the
shapes where the two models disagree (the bench sweeps' grids and their random shapes, planned
for 132 SMs), this times a training step and its backward alone with either model in force, beside
torch eager and torch.compile, as `bench sweep` times them (calls back to back between two CUDA
events over rotated inputs; the backward of a kept graph).

    python scripts/probes/probe_softmax_backward_route.py
"""

import statistics

import torch

import onlinesoftmax
from onlinesoftmax.ops.softmax import plan as softmax_plan

SHAPES = [(torch.bfloat16, 5576, 4941), (torch.float16, 5576, 4941), (torch.bfloat16, 256, 100003),
          (torch.float16, 256, 100003), (torch.float32, 256, 50257), (torch.float32, 474, 23612)]
MODELS = {"2000 GB/s": softmax_plan.TORCH_LONG_ROW_GBS, "1230 GB/s": softmax_plan.TORCH_SOFTMAX_BACKWARD_LONG_ROW_GBS}


def eager_us(fn, sets, n=200, reps=5):
    for i in range(20):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        for i in range(n):
            fn(*sets[i % len(sets)])
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / n)
    return statistics.median(times)


def measure(fn, xs, dys):
    """(step, backward) µs a call of ``fn`` (softmax over the last dim) over the inputs ``xs``."""
    step = eager_us(lambda x, dy: fn(x).backward(dy), list(zip(xs, dys)))
    kept = [(x, fn(x), dy) for x, dy in zip(xs[:4], dys[:4])]
    backward = eager_us(lambda x, y, dy: torch.autograd.grad(y, x, dy, retain_graph=True), kept)
    return [step, backward]


def main():
    compiled = torch.compile(lambda x: torch.softmax(x, -1))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; us a call, rotated inputs "
          "(step: forward + backward; backward: autograd.grad of a kept graph)")
    print("dtype shape | route 2000 GB/s: step backward | route 1230 GB/s: step backward | "
          "torch: step backward | compile: step backward")
    # torch.compile's peer runs after every other column of every shape: its compilations (worker
    # processes) are not running beside our host's time.
    rows_out, inputs = [], []
    for dtype, rows, cols in SHAPES:
        nsets = max(2, min(16, (256 << 20) // (rows * cols * dtype.itemsize * 4)))
        xs = [(torch.randn(rows, cols, device="cuda") * 2).to(dtype).requires_grad_() for _ in range(nsets)]
        dys = [torch.randn(rows, cols, device="cuda").to(dtype) for _ in range(nsets)]
        cells = []
        for gbs in MODELS.values():
            with onlinesoftmax.override_plan("softmax", TORCH_SOFTMAX_BACKWARD_LONG_ROW_GBS=gbs):
                cells += measure(lambda x: onlinesoftmax.softmax(x, -1), xs, dys)
        cells += measure(lambda x: torch.softmax(x, -1), xs, dys)
        rows_out.append((dtype, rows, cols, cells))
        inputs.append((xs[:2], dys[:2]))
    for (dtype, rows, cols, cells), (xs, dys) in zip(rows_out, inputs):
        cells += measure(compiled, xs, dys)
        c = [f"{v:.1f}" for v in cells]
        print(f"{str(dtype)[6:]} {rows}x{cols} | {c[0]} {c[1]} | {c[2]} {c[3]} | {c[4]} {c[5]} | {c[6]} {c[7]}",
              flush=True)


if __name__ == "__main__":
    main()
