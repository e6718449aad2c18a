"""Host cost of a Triton launch by how its pointer arguments are passed (GPU).

Triton 3.6's C launcher takes a pointer argument either as an int (used as it is) or as an object
with ``data_ptr()``, which it calls and then checks with the driver (``cuPointerGetAttribute``, to
refuse CPU tensors) on every launch. This times the compiled kernel's own launcher, called back to
back as ``_launch.Launcher``'s fast path calls it, with 1, 3 and 5 pointers passed as tensors, as
ints kept from before, and as ints read per call (``t.data_ptr()`` in Python), over several rounds
in turn (the host's speed drifts). Then our own eager calls, whose bound launches pass tensors
as addresses (``_launch.POINTERS_AS_ADDRESSES``) or as tensors, the two in turn in each round
(the prepared calls rebuilt between them).

    python scripts/probes/probe_pointer_args.py [--rounds 7]
"""

import argparse
import statistics

import torch
import triton
import triton.language as tl

import onlinesoftmax
from onlinesoftmax import _device, _launch
from onlinesoftmax._launch import _direct_launch

from launch_overhead import per_call_us as issued_us  # back-to-back calls, µs issued a call


@triton.jit
def pointers_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, n, stride, inv_t, WRITE: tl.constexpr):
    if WRITE:
        tl.store(a_ptr + tl.program_id(0), 1.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    tensors = [torch.zeros(1024, device="cuda") for _ in range(5)]
    kernel = pointers_kernel[(1,)](*tensors, 1024, 1, 1.0, WRITE=True)
    launch, prefix, tail = _direct_launch(kernel, (True,))
    stream = torch.cuda.current_stream().cuda_stream
    ints = [t.data_ptr() for t in tensors]

    def case(pointers: int, how: str):
        rest = ints[:1] * (5 - pointers)  # the other pointer slots: a kept int (no driver check)
        if how == "tensors":
            chosen = tensors[:pointers]
            return lambda: launch(1, 1, 1, stream, *prefix, *chosen, *rest, 1024, 1, 1.0, *tail)
        if how == "ints kept":
            chosen = ints[:pointers]
            return lambda: launch(1, 1, 1, stream, *prefix, *chosen, *rest, 1024, 1, 1.0, *tail)
        chosen = tensors[:pointers]
        if pointers == 1:
            a, = chosen
            return lambda: launch(1, 1, 1, stream, *prefix, a.data_ptr(), *rest, 1024, 1, 1.0, *tail)
        if pointers == 3:
            a, b, c = chosen
            return lambda: launch(1, 1, 1, stream, *prefix, a.data_ptr(), b.data_ptr(), c.data_ptr(), *rest,
                                  1024, 1, 1.0, *tail)
        a, b, c, d, e = chosen
        return lambda: launch(1, 1, 1, stream, *prefix, a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(),
                              e.data_ptr(), 1024, 1, 1.0, *tail)

    cases = {(p, how): case(p, how) for p in (1, 3, 5) for how in ("tensors", "ints kept", "ints per call")}
    samples = {key: [] for key in cases}
    for _ in range(args.rounds):
        for key, fn in cases.items():
            samples[key].append(issued_us(fn, args.calls))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          f"µs issued a launch, median (min-max) of {args.rounds} rounds of {args.calls} calls")
    for (pointers, how), values in samples.items():
        print(f"{pointers} pointers as {how:14s} {statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})")
    empty = torch.empty(0, device="cuda")
    print(f"empty tensor's data_ptr(): {empty.data_ptr()} (the launcher skips the driver's check for 0)")
    our_calls(args.rounds, args.calls // 5)


def our_calls(rounds: int, calls: int):
    """Our eager calls with the bound launches' tensors passed as addresses and as tensors, in turn."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def logits(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    x_top, x_top5, x_4k = logits(1, 151936, dtype=torch.bfloat16), logits(1, 25000), logits(4, 1024)
    x_split = logits(4, 100003, dtype=torch.bfloat16)
    ce, target = logits(8, 1024, dtype=torch.float32), torch.randint(0, 1024, (8,), device="cuda", generator=gen)
    ce_grad = ce.clone().requires_grad_()
    q, k, v = (logits(1, 2, 128, 128, dtype=torch.bfloat16) for _ in range(3))
    cases = {
        "softmax_topk 1x151936 k1 bf16 (split)": lambda: onlinesoftmax.softmax_topk(x_top, 1),
        "softmax_topk 1x25000 k5 (single)": lambda: onlinesoftmax.softmax_topk(x_top5, 5),
        "softmax 4x1024 (row_on_chip)": lambda: onlinesoftmax.softmax(x_4k, strategy="row_on_chip"),
        "log_softmax 4x100003 bf16 (split_row_on_chip)": lambda: onlinesoftmax.log_softmax(
            x_split, strategy="split_row_on_chip"),
        "cross_entropy 8x1024, forward": lambda: onlinesoftmax.cross_entropy(ce, target),
        "cross_entropy 8x1024, forward + backward": lambda: onlinesoftmax.cross_entropy(ce_grad, target).backward(),
        "attention B1 H2 S128 D128, forward": lambda: onlinesoftmax.attention(q, k, v),
    }
    samples = {(name, on): [] for name in cases for on in (True, False)}
    for _ in range(rounds):
        for on in (True, False):
            _launch.POINTERS_AS_ADDRESSES = on
            _device.clear_plan_caches()  # the prepared calls bind their launches anew
            for name, fn in cases.items():
                samples[(name, on)].append(issued_us(fn, calls))
    _launch.POINTERS_AS_ADDRESSES = True
    print(f"\nour eager calls, µs issued a call, median (min-max) of {rounds} rounds of {calls} calls: "
          "tensors as addresses / as tensors")
    for name in cases:
        on, off = samples[(name, True)], samples[(name, False)]
        print(f"{name:48s} {statistics.median(on):6.2f} ({min(on):.2f}-{max(on):.2f}) / "
              f"{statistics.median(off):6.2f} ({min(off):.2f}-{max(off):.2f})")


if __name__ == "__main__":
    main()
