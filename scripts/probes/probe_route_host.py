"""Host time of the eager torch route's pieces, against torch's own call (GPU).

    python scripts/probes/probe_route_host.py

A small eager softmax runs torch's kernel through the route (ops/softmax/op.py, plan.EAGER_HOST_US),
so such a call costs torch's own call plus what the route adds. This times, on CUDA tensors, torch's
call, aten's _softmax behind it (one dispatch fewer), the public call, a bare Python function
around torch's call (what any Python wrapper adds at least), and the route's pieces alone: the
signature key, the lookup, the check that the host decides (not compiling, not capturing: on the
default stream its handle alone answers) and the plan record. µs a call, timed as ``bench host``
times (host_suite.host_us); the calls queue on the GPU faster than it runs them, so each is the
host's time. (The recorded run, docs/notes/2026-11/probe_route_host-h200.log, timed with a copy of
that loop: 5 runs of 20000 calls, the garbage collector not held off.)
"""
import torch

import onlinesoftmax
from onlinesoftmax._device import capturing, current_raw_stream
from onlinesoftmax.bench.host_suite import host_us_alone
from onlinesoftmax.ops.softmax import op as softmax_op
from onlinesoftmax.ops.softmax import plan


def wrapper(x, dim=-1):
    return torch.softmax(x, dim)


def main():
    x = torch.randn(26, 411, device="cuda", dtype=torch.bfloat16)
    onlinesoftmax.softmax(x)
    key = (x.shape, x.stride(), x.dtype, x.device, -1, None, "auto", None, False)
    route = softmax_op._ROUTES[key]
    assert route.eager_torch, "26 x 411 should take the eager torch route"
    rows = [
        ("torch.softmax(x, -1)", lambda: torch.softmax(x, -1)),
        ("torch._softmax(x, -1, False)", lambda: torch._softmax(x, -1, False)),
        ("onlinesoftmax.softmax(x)", lambda: onlinesoftmax.softmax(x)),
        ("a Python function calling torch.softmax", lambda: wrapper(x)),
        ("the key tuple", lambda: (x.shape, x.stride(), x.dtype, x.device, -1, None, "auto", None, False)),
        ("the key's lookup", lambda: softmax_op._ROUTES[key]),
        ("requires_grad and is_grad_enabled", lambda: x.requires_grad and torch.is_grad_enabled()),
        ("capturing(0): the route's capture check", lambda: capturing(0)),
        ("_cuda_getCurrentRawStream(0)", lambda: current_raw_stream(0)),
        ("torch.compiler.is_compiling()", torch.compiler.is_compiling),
        ("_cuda_isCurrentStreamCapturing()", torch._C._cuda_isCurrentStreamCapturing),
        ("plan.record(route.torch_plan)", lambda: plan.record(route.torch_plan)),
        ("an empty Python call", lambda: None),
    ]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16 26 x 411 softmax")
    for name, fn in rows:
        print(f"  {name:42s} {host_us_alone(fn):6.2f} us")


if __name__ == "__main__":
    main()
