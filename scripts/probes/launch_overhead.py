"""Host-side cost per call (GPU): where the microseconds go when the kernel itself is tiny.

Back-to-back calls with no synchronization measure how fast the host can issue work; the GPU time
of these inputs is far below it. Then a cProfile of the split-row path names the expensive frames.

    python scripts/probes/launch_overhead.py [--import quack.topk ...] [--attention]

--import: after the table, import these modules (peers, say) and time our top-k calls again, with
Triton's launch hooks and a cProfile (`onlinesoftmax bench topk` saw our eager 1x25000 k5 call go
from 0.013 to 0.069 ms in a run where quack was importable, the CUDA-graph time unchanged).
"""

import argparse
import importlib
import time

import torch
import triton
import triton.language as tl

import onlinesoftmax
from onlinesoftmax.bench.host_suite import print_profile
from onlinesoftmax.ops.attention import launch as attention_launch
from onlinesoftmax.ops.softmax import launch as softmax_launch


@triton.jit
def one_arg_kernel(x_ptr):
    tl.store(x_ptr + tl.program_id(0), 1.0)


@triton.jit
def many_args_kernel(x_ptr, y_ptr, z_ptr, a, b, c, d, e, f, g, h, i, j, k, inv_t,
                     BLOCK: tl.constexpr, LOG: tl.constexpr, WRITE_Y: tl.constexpr, WRITE_LSE: tl.constexpr,
                     CONTIGUOUS: tl.constexpr):
    tl.store(x_ptr + tl.program_id(0), 1.0)


def per_call_us(fn, calls=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return issued


def attention_host_costs():
    """Attention at B1 H2 S128 D128, whose GPU time is a few microseconds: what the host spends."""
    q, k, v = (torch.randn(1, 2, 128, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_out = torch.randn_like(q)
    out, lse = attention_launch.launch_forward(q.detach(), k.detach(), v.detach(), "none", 0.1)

    def forward_backward():
        torch.autograd.grad(onlinesoftmax.attention(q, k, v), (q, k, v), d_out)

    with torch.no_grad():
        cases = {
            "onlinesoftmax.attention B1 H2 S128 D128": lambda: onlinesoftmax.attention(q, k, v),
            "onlinesoftmax.attention causal": lambda: onlinesoftmax.attention(q, k, v, causal=True),
            "attention launch_backward (3 kernels + delta)": lambda: attention_launch.launch_backward(
                d_out, q.detach(), k.detach(), v.detach(), out, lse, "none", 0.1),
        }
        for name, fn in cases.items():
            print(f"{name:48s} {per_call_us(fn, 1000):8.1f} us issued per call")
    print(f"{'attention forward + autograd backward':48s} {per_call_us(forward_backward, 1000):8.1f} us issued per call")
    print_profile(forward_backward, 20)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--import", dest="modules", nargs="*", default=[], help="modules to import, then re-time")
    parser.add_argument("--attention", action="store_true", help="attention calls only (forward, backward, both)")
    args = parser.parse_args()
    if args.attention:
        attention_host_costs()
        return
    x_small = torch.randn(4, 1024, device="cuda")
    x_long = torch.randn(16, 262144, device="cuda")
    x_long_bf16 = x_long.bfloat16()
    buf = torch.empty(1024, device="cuda")
    x_vocab = torch.randn(1, 151936, device="cuda")
    x_vocab_bf16 = x_vocab.bfloat16()
    x_small_vocab = torch.randn(1, 25000, device="cuda")
    # Inputs whose GPU time is a few us: what the host spends on a kernel-path call, against torch's
    # on the same tensor (when this log was taken, only tensors of at most 65536 elements took torch's
    # kernel; the eager torch route of plan.EAGER_HOST_US now sends these two there too).
    x_rows_bf16 = torch.randn(2048, 1000, device="cuda").bfloat16()
    x_gpt2_bf16 = torch.randn(32, 50257, device="cuda").bfloat16()
    forward_call = softmax_launch.forward_call(x_rows_bf16, 1, "softmax", None, "auto", None)
    # A split_row_on_chip call of few long rows (GPU time about 6 us) in its pieces: the prepared
    # call, its launch alone into a kept output, the output's allocation, the exchange buffers.
    x_few_bf16 = torch.randn(4, 100003, device="cuda").bfloat16()
    few_call = softmax_launch.forward_call(x_few_bf16, 1, "log_softmax", None, "auto", None)
    few_y = torch.empty_like(x_few_bf16)
    few_exchange = (*softmax_launch._exchange_sizes(few_call.plan, 2), x_few_bf16.device)
    cases = {
        "torch.log_softmax 4x100003 bf16": lambda: torch.log_softmax(x_few_bf16, -1),
        "ForwardCall log_softmax 4x100003 bf16 (split_row_on_chip)": lambda: few_call(x_few_bf16, 1.0),
        "  its launch alone, into a kept output": lambda: few_call.launch(x_few_bf16, few_y, x_few_bf16, 1.0, True),
        "  _buffers.empty_like 4x100003 bf16": lambda: softmax_launch._buffers.empty_like(x_few_bf16),
        "  _buffers.row_exchange": lambda: softmax_launch._buffers.row_exchange(*few_exchange),
        "  aligned(x)": lambda: softmax_launch.aligned(x_few_bf16),
        "torch.softmax 2048x1000 bf16": lambda: torch.softmax(x_rows_bf16, -1),
        "onlinesoftmax.softmax 2048x1000 bf16": lambda: onlinesoftmax.softmax(x_rows_bf16),
        "ForwardCall 2048x1000 bf16 (no route lookup)": lambda: forward_call(x_rows_bf16, 1.0),
        "torch.empty_like 2048x1000 bf16": lambda: torch.empty_like(x_rows_bf16),
        "torch.log_softmax 32x50257 bf16": lambda: torch.log_softmax(x_gpt2_bf16, -1),
        "onlinesoftmax.log_softmax 32x50257 bf16": lambda: onlinesoftmax.log_softmax(x_gpt2_bf16),
        "torch.softmax 4x1024": lambda: torch.softmax(x_small, -1),
        "triton launch, 1 arg": lambda: one_arg_kernel[(1,)](buf),
        "triton launch, 15 args + 5 constexpr": lambda: many_args_kernel[(1,)](
            buf, buf, buf, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1.0, BLOCK=16, LOG=False, WRITE_Y=True, WRITE_LSE=False,
            CONTIGUOUS=True),
        "onlinesoftmax.softmax 4x1024 (row_on_chip)": lambda: onlinesoftmax.softmax(x_small),
        "launch_forward 4x1024 (row_on_chip)": lambda: softmax_launch.launch_forward(x_small, 1, "softmax"),
        "torch.softmax 16x262144": lambda: torch.softmax(x_long, -1),
        "onlinesoftmax.softmax 16x262144 (split_row)": lambda: onlinesoftmax.softmax(x_long),
        "onlinesoftmax.softmax 16x262144 looped": lambda: onlinesoftmax.softmax(x_long, strategy="looped"),
        "onlinesoftmax.softmax 16x262144 bf16": lambda: onlinesoftmax.softmax(x_long_bf16),
        "torch.empty 16x262144": lambda: torch.empty_like(x_long),
        "onlinesoftmax.softmax_topk 1x151936 k1 (split)": lambda: onlinesoftmax.softmax_topk(x_vocab, 1),
        "onlinesoftmax.softmax_topk 1x151936 k1 bf16": lambda: onlinesoftmax.softmax_topk(x_vocab_bf16, 1),
        "onlinesoftmax.softmax_topk 1x25000 k5 (single)": lambda: onlinesoftmax.softmax_topk(x_small_vocab, 5),
        "torch.topk(torch.softmax) 1x151936 k1": lambda: torch.topk(torch.softmax(x_vocab, -1), 1),
    }
    try:  # a peer's host cost beside ours, where it is installed
        from quack.softmax import softmax_fwd
        cases["quack softmax_fwd 16x262144 bf16"] = lambda: softmax_fwd(x_long_bf16)
    except Exception as exc:
        print(f"quack not importable ({type(exc).__name__}): its host cost is not measured")
    for name, fn in cases.items():
        print(f"{name:48s} {per_call_us(fn, 3000 if 'x262144' not in name else 300):8.1f} us issued per call")
    print_profile(lambda: few_call(x_few_bf16, 1.0), 25, calls=3000)
    print_profile(lambda: onlinesoftmax.softmax(x_rows_bf16), 25, calls=3000)
    print_profile(lambda: onlinesoftmax.log_softmax(x_gpt2_bf16), 25, calls=3000)
    print_profile(lambda: onlinesoftmax.softmax(x_long_bf16), 25)
    print_profile(lambda: onlinesoftmax.softmax_topk(x_vocab_bf16, 1), 20)
    if args.modules:
        topk_cases = {name: fn for name, fn in cases.items() if "topk" in name or "bf16" in name}
        for module in args.modules:
            importlib.import_module(module)
            print(f"imported {module}")
        hooks = triton.knobs.runtime
        print("triton launch hooks:", hooks.launch_enter_hook.calls, hooks.launch_exit_hook.calls)
        for name, fn in topk_cases.items():
            print(f"{name:48s} {per_call_us(fn):8.1f} us issued per call, after the imports")
        print_profile(lambda: onlinesoftmax.softmax_topk(x_small_vocab, 5), 15)

if __name__ == "__main__":
    main()
