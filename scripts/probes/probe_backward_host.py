"""Where the host time of our softmax backward goes, beside torch's (GPU).

The sweep times a backward as ``torch.autograd.grad`` of a kept graph, called back to back. At few
long rows (fp32 14 x 256008) our backward kernel takes 0.028 ms on the GPU against torch's 0.116,
yet the call measured 0.12 ms, level with torch's. This times, per shape, our backward through
autograd, the launch alone (``launch_backward``, no autograd), the kernel alone (a CUDA-graph
replay), and torch's through autograd; then the host's CPU time per call of each (calls of a
tiny shape, the GPU keeping up) and a cProfile of our autograd backward.

    python scripts/probes/probe_backward_host.py

Host time and the profile come from ``bench host``'s own helpers (``host_suite.host_us``,
``print_profile``); the committed log (docs/notes/2026-11/probe_backward_host-h100.log) was taken
with a loop of the probe's own before that: 2000 calls after 50, once.
"""

import torch

import onlinesoftmax
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms
from onlinesoftmax.bench.host_suite import host_us_alone, print_profile
from onlinesoftmax.ops.softmax import plan as softmax_plan
from onlinesoftmax.ops.softmax.launch import launch_backward

SHAPES = [(torch.float32, 14, 256008), (torch.float32, 32, 262147), (torch.bfloat16, 64, 4096), (torch.bfloat16, 4, 1000)]


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; ms a call back to back (us of CPU a call "
          "for the tiny shape); our kernels at every size (the eager route off)")
    with onlinesoftmax.override_plan("softmax", EAGER_HOST_US=softmax_plan.EAGER_ROUTE_OFF):
        for dtype, rows, cols in SHAPES:
            sets = []
            for _ in range(max(2, min(8, (256 << 20) // (rows * cols * dtype.itemsize * 3)))):
                x = torch.randn(rows, cols, device="cuda", dtype=dtype, requires_grad=True)
                dy = torch.randn(rows, cols, device="cuda", dtype=dtype)
                sets.append((x, onlinesoftmax.softmax(x, -1), torch.softmax(x, -1), dy))
            grad = lambda x, y, dy: torch.autograd.grad(y, x, dy, retain_graph=True)
            ours = [(x, y, dy) for x, y, _, dy in sets]
            theirs = [(x, t, dy) for x, _, t, dy in sets]
            direct = [(y.detach(), dy) for _, y, _, dy in sets]
            launch = lambda y, dy: launch_backward(y, dy, 1, False)
            cells = [back_to_back_ms(grad, ours), back_to_back_ms(launch, direct), graph_time_ms(launch, direct),
                     back_to_back_ms(grad, theirs)]
            line = " ".join(f"{c:.4f}" for c in cells)
            host = (f" | host us: autograd {host_us_alone(lambda: grad(*ours[0])):.1f}, "
                    f"launch {host_us_alone(lambda: launch(*direct[0])):.1f}, "
                    f"torch autograd {host_us_alone(lambda: grad(*theirs[0])):.1f}") if rows * cols <= 1 << 18 else ""
            print(f"{str(dtype)[6:]} {rows}x{cols} | ours autograd, launch alone, kernel (graph), torch autograd: "
                  f"{line}{host}", flush=True)
        x, y, _, dy = sets[0]
        print("# cProfile of 500 of our autograd backwards, bf16 4 x 1000 (tottime includes the profiler's cost)")
        print_profile(lambda: torch.autograd.grad(y, x, dy, retain_graph=True), 18, calls=500)


if __name__ == "__main__":
    main()
