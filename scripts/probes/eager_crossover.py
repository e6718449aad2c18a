"""Where an eager call of ours beats torch's (GPU): the crossover behind the eager torch route.

For softmax and log_softmax, bf16 and fp32, over rows x row lengths from tiny to a few hundred MB,
with the route turned off (our kernels at every size): microseconds per call of torch and ours,
eager (calls back to back between two CUDA events, rotating inputs: the host's time wherever it
exceeds the GPU's), autograd's backward of a kept graph (as `bench sweep` times it) and the forward
replayed from a CUDA graph (the GPU's time alone). Then the host's time of the pieces of one
kernel-path call, and a cProfile of a forward + backward step.

    python scripts/probes/eager_crossover.py

The constants of ``plan.EAGER_HOST_US`` and the torch kernel model beside them come from this table.
"""

import cProfile
import pstats
import statistics
import time

import torch

import onlinesoftmax
from onlinesoftmax import _buffers
from onlinesoftmax.ops.softmax import op as sop, plan as softmax_plan


def eager_us(fn, sets, n=300, reps=5):
    for i in range(30): fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for i in range(n): fn(*sets[i % len(sets)])
        e.record(); torch.cuda.synchronize()
        out.append(s.elapsed_time(e) * 1000 / n)
    return statistics.median(out)

def graph_us(fn, args, n=20):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n): fn(*args)
    for _ in range(3): g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(10): g.replay()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) * 1000 / (10 * n)

ROWS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
COLS = (1000, 4097, 32001, 50257, 128257)
# The route off: every call runs our kernels.
onlinesoftmax.override_plan("softmax", EAGER_HOST_US=softmax_plan.EAGER_ROUTE_OFF).__enter__()
print("dtype op rows cols elems | fwd torch ours | bwd torch ours | graph fwd torch ours", flush=True)
for dtype in (torch.bfloat16, torch.float32):
    for op in ("softmax", "log_softmax"):
        theirs = getattr(torch, op); ours = getattr(onlinesoftmax, op)
        for cols in COLS:
            for rows in ROWS:
                if rows * cols > 2 ** 26: continue
                nsets = max(1, min(16, (256 << 20) // (rows * cols * dtype.itemsize * 3)))
                xs = [(torch.randn(rows, cols, device="cuda") * 2).to(dtype) for _ in range(nsets)]
                f_t = eager_us(lambda x: theirs(x, -1), [(x,) for x in xs])
                f_o = eager_us(lambda x: ours(x, -1), [(x,) for x in xs])
                g_t = graph_us(lambda x: theirs(x, -1), (xs[0],))
                g_o = graph_us(lambda x: ours(x, -1), (xs[0],))
                sets = []
                for x in xs[:4]:
                    xr = x.clone().requires_grad_()
                    dy = torch.randn_like(x)
                    sets.append((xr, theirs(xr, -1), ours(xr, -1), dy))
                b_t = eager_us(lambda x, yt, yo, dy: torch.autograd.grad(yt, x, dy, retain_graph=True), sets)
                b_o = eager_us(lambda x, yt, yo, dy: torch.autograd.grad(yo, x, dy, retain_graph=True), sets)
                print(f"{str(dtype)[6:]} {op} {rows} {cols} {rows*cols} | {f_t:.1f} {f_o:.1f} | {b_t:.1f} {b_o:.1f} | {g_t:.2f} {g_o:.2f}", flush=True)
                del xs, sets

# host pieces of one kernel-path call (64x4096 bf16), CPU wall per call
x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
def host_us(fn, n=2000):
    for _ in range(100): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    el = time.perf_counter() - t; torch.cuda.synchronize(); return el / n * 1e6
onlinesoftmax.softmax(x)
print("host us: torch.softmax", host_us(lambda: torch.softmax(x, -1)))
print("host us: ours softmax", host_us(lambda: onlinesoftmax.softmax(x)))
print("host us: torch.empty_like", host_us(lambda: torch.empty_like(x)))
print("host us: _buffers.empty", host_us(lambda: _buffers.empty(x.shape, x.dtype, x.device)))
print("host us: key build", host_us(lambda: (x.shape, x.stride(), x.dtype, x.device, -1, None, "auto", None, False)))
print("host us: is_capturing", host_us(lambda: torch.cuda.is_current_stream_capturing()))
print("host us: is_compiling", host_us(lambda: torch.compiler.is_compiling()))
for k, c in sop._FORWARD_CALLS.items():
    if k[0] == x.shape:
        print("host us: call(x) only", host_us(lambda: c(x, 1.0)))
xr = x.clone().requires_grad_(); dy = torch.randn_like(x)
def step_t():
    y = torch.softmax(xr, -1); y.backward(dy)
def step_o():
    y = onlinesoftmax.softmax(xr, -1); y.backward(dy)
print("host us: fwd+bwd torch", host_us(step_t, 500))
print("host us: fwd+bwd ours", host_us(step_o, 500))
pr = cProfile.Profile(); pr.enable()
for _ in range(300): step_o()
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
