"""What torch's softmax-family kernels take on the GPU for long rows, against the eager route's model (GPU).

``eager_route.torch_kernel_us`` models torch's kernel so that ``eager_route.eager_torch`` can give an eager call to
torch where torch's kernel finishes within our host time. For rows longer than
``TORCH_SHORT_ROW_COLS`` torch runs a block a row; the model charges ``TORCH_ROW_US`` plus a cost
an element. This times torch's forward and backward kernels alone (CUDA-graph replays of calls over
rotated inputs, so neither the host nor L2 decides) for rows x long row lengths, bf16 and fp32,
softmax and log_softmax, and prints each beside the model and the cost an element of a row
(``(us - TORCH_ROW_US) / waves / cols``).

Then (``--eager``) the eager calls the route decides between, for few long rows: a training step
(forward + backward through autograd) and the backward of a kept graph, as ``bench sweep`` times them,
with our kernels (the route off) and with torch's.

    python scripts/probes/probe_torch_long_rows.py [--quick] [--eager]

It times with the bench's own loops (``harness.back_to_back_ms``, ``harness.graph_time_ms``); the
committed logs (docs/notes/2026-11/probe_torch_long_rows-*h100.log) were taken with a loop of the
probe's own before that: 100 calls back to back, median of 5; 24 calls a graph, median of 3 replays.
"""

import argparse
import contextlib

import torch

import onlinesoftmax
from onlinesoftmax._device import sm_count
from onlinesoftmax.bench.harness import back_to_back_ms, graph_time_ms
from onlinesoftmax.ops.softmax import eager_route
from onlinesoftmax.ops.softmax import plan as softmax_plan

ROWS = (1, 2, 4, 8, 16, 32, 64, 132, 264, 528, 1056)
COLS = (1025, 2049, 4097, 8193, 16385, 32001, 50257, 131073, 262147, 1048577)
MAX_BYTES = 1 << 29
ROTATE_BYTES = 256 << 20
EAGER_ROWS = (1, 8, 32, 132)
EAGER_COLS = (50257, 131073, 262147, 1048577)


def eager_steps():
    print("dtype op rows cols | step: ours (route off) torch | backward: ours torch")
    for dtype in (torch.float32, torch.bfloat16):
        for op in ("softmax", "log_softmax"):
            fns = {"ours": getattr(onlinesoftmax, op), "torch": getattr(torch, op)}
            for cols in EAGER_COLS:
                for rows in EAGER_ROWS:
                    size = rows * cols * dtype.itemsize
                    nsets = max(2, min(16, ROTATE_BYTES // (3 * size)))
                    xs = [torch.randn(rows, cols, device="cuda").to(dtype).requires_grad_() for _ in range(nsets)]
                    dys = [torch.randn(rows, cols, device="cuda").to(dtype) for _ in range(nsets)]
                    cells = {}
                    for name, fn in fns.items():
                        route_off = (onlinesoftmax.override_plan("softmax", EAGER_HOST_US=softmax_plan.EAGER_ROUTE_OFF)
                                     if name == "ours" else contextlib.nullcontext())
                        with route_off:
                            step = 1e3 * back_to_back_ms(lambda x, dy: fn(x, -1).backward(dy), list(zip(xs, dys)))
                            kept = [(x, fn(x, -1), dy) for x, dy in zip(xs[:4], dys[:4])]
                            bwd = 1e3 * back_to_back_ms(lambda x, y, dy: torch.autograd.grad(y, x, dy, retain_graph=True), kept)
                        cells[name] = (step, bwd)
                    print(f"{str(dtype)[6:]} {op} {rows} {cols} | {cells['ours'][0]:.1f} {cells['torch'][0]:.1f} | "
                          f"{cells['ours'][1]:.1f} {cells['torch'][1]:.1f}", flush=True)
                    del xs, dys, kept


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a third of the rows and lengths")
    parser.add_argument("--eager", action="store_true", help="eager steps with our kernels and torch's")
    args = parser.parse_args()
    if args.eager:
        eager_steps()
        return
    rows_list, cols_list = (ROWS[::3], COLS[::3]) if args.quick else (ROWS, COLS)
    sms = sm_count(torch.device("cuda"))
    print(f"# {torch.cuda.get_device_name()} ({sms} SMs), torch {torch.__version__}; torch's kernels replayed "
          f"from a CUDA graph, us a call; model: eager_route.torch_kernel_us; ns/el: (us - TORCH_ROW_US) / waves / cols")
    print("dtype op rows cols | forward us model ns/el | backward us model ns/el")
    for dtype in (torch.float32, torch.bfloat16):
        for op in ("softmax", "log_softmax"):
            forward = torch.softmax if op == "softmax" else torch.log_softmax
            backward = (torch.ops.aten._softmax_backward_data if op == "softmax"
                        else torch.ops.aten._log_softmax_backward_data)
            for cols in cols_list:
                for rows in rows_list:
                    size = rows * cols * dtype.itemsize
                    if size > MAX_BYTES:
                        continue
                    nsets = max(2, min(32, ROTATE_BYTES // (3 * size)))
                    xs = [torch.randn(rows, cols, device="cuda", dtype=dtype) for _ in range(nsets)]
                    ys = [forward(x, -1) for x in xs]
                    dys = [torch.randn_like(x) for x in xs]
                    fwd = 1e3 * graph_time_ms(lambda x: forward(x, -1), [(x,) for x in xs])
                    bwd = 1e3 * graph_time_ms(lambda dy, y: backward(dy, y, -1, dtype), list(zip(dys, ys)))
                    waves = -(-rows // (sms * softmax_plan.TORCH_ROWS_PER_SM))
                    plan = softmax_plan.choose(op, rows, cols, dtype, torch.device("cuda"), "auto")
                    model_f = eager_route.torch_kernel_us(rows, cols, plan.bytes_moved(None), sms)
                    gbs = (softmax_plan.TORCH_SOFTMAX_BACKWARD_LONG_ROW_GBS if op == "softmax"
                           else softmax_plan.TORCH_LONG_ROW_GBS)
                    model_b = eager_route.torch_kernel_us(rows, cols, rows * cols * 3 * dtype.itemsize, sms, gbs)
                    per = [(t - softmax_plan.TORCH_ROW_US) / waves / cols * 1e3 for t in (fwd, bwd)]
                    print(f"{str(dtype)[6:]} {op} {rows} {cols} | {fwd:.1f} {model_f:.1f} {per[0]:.3f} | "
                          f"{bwd:.1f} {model_b:.1f} {per[1]:.3f}", flush=True)
                    del xs, ys, dys


if __name__ == "__main__":
    main()
