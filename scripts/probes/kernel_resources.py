"""Registers per thread and stack of the softmax, top-k and attention kernels that the plans
launch for the bench grids on an H100 (sm_90), measured without a GPU.

    python scripts/probes/kernel_resources.py [--arch 90] [--sms 132] [--ops softmax,topk,attention]
        [--shapes ROWSxCOLS,...] [--attention-shapes HQxHKVxSxD,...] [--decode-shapes BxHQxHKVxSxD,...]
        [--dtypes float32,bfloat16] [--table OP:NAME=VALUE ...] [--ce-options label_smoothing=0.1,...]

--table compiles under another value of a plan table (a Python literal), through override_plan;
--dtypes names the dtypes (torch's names) in place of each op's own (float32 and bfloat16; bfloat16
for attention and decode).

The launchers run on CPU tensors with the plan made for the GPU (``--sms`` SMs) and record each
kernel launch instead of making it (attention at batch 1 and one KV head with its query group:
sizes that only reach integer arguments). Each recorded launch goes through Triton's own argument
specialization (pointer alignment, integers equal to 1 or divisible by 16, constexprs) for an
sm_``arch`` target, is compiled with the ptxas that Triton bundles, and the bundled cuobjdump reads
the cubin's resource usage. Registers decide how many programs an SM holds at once (65536 per SM,
allocated per warp in steps of 8 per thread), which bounds the loads a streaming kernel keeps in
flight: of the numbers that decide a kernel's speed, the one a machine without a GPU can measure.
SMEM is the shared memory a program takes (ptxas's static part and Triton's dynamic part, sized at
compile time: the pipeline's stages of tiles, reduction scratch); an SM has 228 KB of it, 1 KB of it reserved per program, so it
bounds programs an SM too (the programs/SM column is the least of the register, warp, shared
memory and program limits). STACK above 0 is a frame in local memory (spills, or arrays ptxas would not keep in registers).
A kernel that Triton warp-specializes runs more warps than its num_warps (WARPS counts them all)
and its REG is what each thread gets at launch; its warpgroups then trade registers (setmaxnreg).

LOADS IN FLIGHT, per streaming loop of the machine code (a backward branch whose body holds global
loads): how many of the loop's loads a thread issues before the first instruction that reads one
of them, "issued/in loop". A streaming kernel hides DRAM latency only with loads in flight: 8/8
waits on memory once per iteration, 1/8 eight times (ptxas decides the order; the same source can
compile either way, which timing alone showed as a 1.5x slower top-k on the H100).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import subprocess
import tempfile
from unittest import mock

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from onlinesoftmax import _device, _launch
from onlinesoftmax.bench import attention_suite, cross_entropy_suite, softmax_suite, topk_suite
from onlinesoftmax.ops.attention import launch as attention_launch
from onlinesoftmax.ops.attention import plan as attention_planner
from onlinesoftmax.ops.cross_entropy import launch as cross_entropy_launch
from onlinesoftmax.ops.cross_entropy import plan as cross_entropy_planner
from onlinesoftmax.ops.decode import op as decode_op
from onlinesoftmax.ops.decode import plan as decode_planner
from onlinesoftmax.ops.softmax import launch as softmax_launch
from onlinesoftmax.ops.softmax import plan as softmax_planner
from onlinesoftmax.ops.topk import launch as topk_launch
from onlinesoftmax.ops.topk import plan as topk_planner

REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MAX_PROGRAMS_PER_SM = 32
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_PROGRAM = 1024


@contextlib.contextmanager
def recorded_launches(sms: int):
    """Within: launchers record (kernel, args, meta) in the yielded list instead of launching, and
    plans are made for a CUDA device of ``sms`` SMs whatever the tensors' device."""
    calls = []
    cuda = torch.device("cuda")

    def record(self, grid, key, *args, **meta):
        calls.append((self.fn, args, meta))

    def record_direct(self, *args, grid, warmup, **meta):  # kernel[grid](...) without a Launcher
        calls.append((self, args, meta))

    choose = softmax_planner.choose

    def choose_for_gpu(op, rows, cols, dtype, device, algorithm="auto", strategy=None, sms_=None,
                       interpreting=None, **layout):
        return choose(op, rows, cols, dtype, cuda, algorithm, strategy, sms=sms, interpreting=False, **layout)

    topk_plan = topk_planner.topk_plan

    def topk_plan_for_gpu(rows, cols, k, dtype, device, *args, **kwargs):
        return topk_plan(rows, cols, k, dtype, cuda, *args, **dict(kwargs, sms=sms))

    attention_plan = attention_planner.attention_plan

    cross_entropy_choose = cross_entropy_planner.choose

    def cross_entropy_choose_for_gpu(op, rows, cols, dtype, device, strategy=None, *args, **kwargs):
        return cross_entropy_choose(op, rows, cols, dtype, cuda, strategy, *args,
                                    **dict(kwargs, sms=sms, interpreting=False))

    def attention_plan_for_gpu(kernel, head_dim, dtype, causal, device, *args, **kwargs):
        with mock.patch.object(attention_planner, "interpreter_active", lambda: False):
            return attention_plan(kernel, head_dim, dtype, causal, cuda, *args, **kwargs)

    decode_plan = decode_planner.decode_plan

    def decode_plan_for_gpu(*args):
        return decode_plan(*args[:-3], True, sms, False)  # (.., on_cuda, sms, interpreting)

    # CPU tensors take the GPU's Triton path: plans made for a CUDA device, the top-k launcher told
    # that Triton runs here, the softmax recipes allowed their inline PTX. Cached plans and launch
    # recipes are forgotten before (they were made for this machine) and after.
    _device.clear_plan_caches()
    with mock.patch.object(_launch.Launcher, "__call__", record), mock.patch.object(JITFunction, "run", record_direct), \
            mock.patch.object(_launch.Launcher, "entry", lambda self, key: None), \
            mock.patch.object(softmax_planner, "choose", choose_for_gpu), \
            mock.patch.object(topk_planner, "topk_plan", topk_plan_for_gpu), \
            mock.patch.object(attention_planner, "attention_plan", attention_plan_for_gpu), \
            mock.patch.object(cross_entropy_planner, "choose", cross_entropy_choose_for_gpu), \
            mock.patch.object(decode_planner, "decode_plan", decode_plan_for_gpu), \
            mock.patch.object(topk_launch, "interpreter_active", lambda: True), \
            mock.patch.object(softmax_launch, "inline_ptx_allowed", lambda: True):
        yield calls
    _device.clear_plan_caches()


SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def _registers(operand: str) -> list[int]:
    return [int(r) for r in re.findall(r"\bR(\d+)\b", operand)]


def loop_loads_in_flight(sass: str) -> list[tuple[int, int]]:
    """(loads issued before the first use of any, loads in the body) for each loop of ``sass``
    (cuobjdump's listing) that loads from global memory into registers (LDG), in code order."""
    instructions = [(int(addr, 16), op, operands) for addr, op, operands in SASS_INSTRUCTION.findall(sass)]
    loops = []
    for addr, op, operands in instructions:
        target = re.search(r"0x([0-9a-f]+)", operands) if op.startswith("BRA") else None
        if target is None or int(target.group(1), 16) >= addr:
            continue
        body = [ins for ins in instructions if int(target.group(1), 16) <= ins[0] <= addr]
        total = sum(op.split(".")[0] == "LDG" for _, op, _ in body)  # not LDGSTS (to shared memory)
        if not total:
            continue
        pending, issued = set(), 0  # registers that outstanding loads will write
        for _, op, operands in body:
            fields = [f.strip() for f in operands.split(",")]
            sources = fields if op.startswith(("ST", "RED", "ATOM")) else fields[1:]
            if pending & {r for f in sources for r in _registers(f)}:
                break
            if op.split(".")[0] == "LDG":
                first = _registers(fields[0])[0]
                width = 4 if op.endswith(".128") else 2 if op.endswith(".64") else 1
                pending.update(range(first, first + width))
                issued += 1
        loops.append((issued, total))
    return loops


def global_access_widths(sass: str) -> dict:
    """{(op, bytes): count} of the global loads (LDG), stores (STG) and asynchronous copies to
    shared memory (LDGSTS, a software-pipelined loop's loads) in ``sass``: a streaming kernel that
    Triton could not prove 16-byte aligned or masked by whole vectors moves 2 bytes at a time
    (LDG.E.U16) where it should move 16 (LDG.E.128, LDGSTS.E.BYPASS.128)."""
    widths = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}
    counts: dict = {}
    for _, op, _ in SASS_INSTRUCTION.findall(sass):
        parts = op.split(".")
        if parts[0] in ("LDG", "STG", "LDGSTS"):
            key = (parts[0], next((widths[p] for p in parts[1:] if p in widths), 4))
            counts[key] = counts.get(key, 0) + 1
    return counts


def resource_usage(fn, args, meta: dict, arch: int) -> dict:
    """ptxas's resource usage of ``fn`` launched with ``args`` and ``meta``, compiled for sm_``arch``,
    its streaming loops' loads in flight (``loops``: see loop_loads_in_flight), its global access
    widths and its FFMA instructions."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kwargs = dict(meta, debug=knobs.runtime.debug, instrumentation_mode=knobs.compilation.instrumentation_mode)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        report = subprocess.run([cuobjdump, "--dump-resource-usage", cubin.name],
                                capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([cuobjdump, "--dump-sass", cubin.name], capture_output=True, text=True, check=True).stdout
    usage = {key: int(value) for key, value in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", report)}
    # A warp-specialized kernel runs more warps than num_warps asked for (its producer warpgroup).
    # Triton's shared memory is dynamic (its size in the kernel's metadata), beside ptxas's static SHARED.
    return dict(usage, loops=loop_loads_in_flight(sass), accesses=global_access_widths(sass),
                warps=kernel.metadata.num_warps, dynamic_shared=kernel.metadata.shared,
                fused_multiply_adds=sum(op.startswith("FFMA") for _, op, _ in SASS_INSTRUCTION.findall(sass)))


def programs_per_sm(registers: int, num_warps: int, shared: int = 0) -> int:
    per_warp = -(-registers // 8) * 8 * 32
    return min(REGISTERS_PER_SM // (per_warp * num_warps), MAX_WARPS_PER_SM // num_warps, MAX_PROGRAMS_PER_SM,
               SHARED_PER_SM // (shared + SHARED_RESERVED_PER_PROGRAM))


def softmax_cases(dtype, shapes=None):
    """(case, run) per direction and shape of the softmax bench grid (or of ``shapes``)."""
    for rows, cols in shapes or softmax_suite.GRID:
        x = torch.empty((rows, cols), dtype=dtype)
        for op in ("softmax", "log_softmax"):
            log = op == "log_softmax"
            yield f"{op[:3]} forward {rows}x{cols}", lambda x=x, op=op: softmax_launch.launch_forward(x, 1, op)
            yield f"{op[:3]} backward {rows}x{cols}", lambda x=x, log=log: softmax_launch.launch_backward(x, x, 1, log)


def topk_cases(dtype):
    for rows, cols, k in topk_suite.GRID:
        x = torch.empty((rows, cols), dtype=dtype)
        yield f"{rows}x{cols}:k{k}", lambda x=x, k=k: topk_launch.launch_forward(x, k, 1.0)


def attention_cases(dtype, shapes=None):
    for _, heads_q, heads_kv, seq, head_dim in shapes or attention_suite.GRID:
        q = torch.empty((1, heads_q // heads_kv, seq, head_dim), dtype=dtype)  # one KV head, its query group
        k = torch.empty((1, 1, seq, head_dim), dtype=dtype)
        for mode in ("none", "top_left"):
            label = f"{heads_q}/{heads_kv}x{seq}x{head_dim}{' causal' if mode != 'none' else ''}"
            yield f"forward {label}", lambda q=q, k=k, mode=mode: attention_launch.launch_forward(q, k, k, mode, 0.1)
            yield f"backward {label}", lambda q=q, k=k, mode=mode: attention_launch.launch_backward(
                q, q, k, k, q, torch.empty(q.shape[:3]), mode, 0.1)


def decode_cases(dtype, shapes=None):
    """(case, run) per decode shape BxHQxHKVxSxD (one query a sequence, lengths given, auto splits)."""
    for batch, heads_q, heads_kv, seq, head_dim in shapes or [(1, 32, 8, 32768, 128), (1, 32, 8, 32768, 72)]:
        q = torch.empty((batch, 1, heads_q, head_dim), dtype=dtype)
        k = torch.empty((batch, seq, heads_kv, head_dim), dtype=dtype)
        lens = torch.full((batch,), seq, dtype=torch.int32)
        yield (f"B{batch} {heads_q}/{heads_kv}x{seq}x{head_dim}",
               lambda q=q, k=k, lens=lens: decode_op.launch_decode(q, k, k, lens, None, True, 0.1, 0, False))


def cross_entropy_cases(dtype, shapes=None, options=None):
    """(case, run) per mode and shape of the cross-entropy bench grid (or of ``shapes``): the
    separate forward and backward, and the forward with the gradient in place or into a new tensor (a
    "mean" loss).
    ``options``: label_smoothing, z_loss, softcap (0: none), temperature, weight (True: class
    weights), class_dim_1 (True: the logits as torch's class dim 1 read through a view, rows of unit
    stride), as --ce-options gives them."""
    options = options or {}
    smoothing, z_loss, softcap, temperature = (float(options.get(name, default)) for name, default in (
        ("label_smoothing", 0.0), ("z_loss", 0.0), ("softcap", 0.0), ("temperature", 1.0)))
    for rows, cols in shapes or cross_entropy_suite.GRID.get(dtype, cross_entropy_suite.GRID[torch.float32]):
        x = torch.empty((cols, rows), dtype=dtype).t() if options.get("class_dim_1") else torch.empty((rows, cols),
                                                                                                        dtype=dtype)
        target = torch.zeros(rows, dtype=torch.int64)
        weight = torch.ones(cols, dtype=dtype) if options.get("weight") else None
        forward = (weight, -100, "mean", smoothing, z_loss, softcap, temperature, False)
        yield f"forward {rows}x{cols}", lambda x=x, t=target, o=forward: cross_entropy_launch.launch_forward(x, t, *o)
        yield f"in place {rows}x{cols}", lambda x=x, t=target, o=forward: cross_entropy_launch.launch_forward(
            x, t, *o, inplace=True)
        yield f"gradient in forward {rows}x{cols}", lambda x=x, t=target, o=forward: cross_entropy_launch.ForwardCall(
            x, t, *o, None, True, out_of_place=True)(x, t, o[0], torch.empty_like(x))
        lse = torch.empty(rows)
        yield f"backward {rows}x{cols}", lambda x=x, t=target, lse=lse, w=weight: (
            cross_entropy_launch.launch_backward(x, t, w, lse, lse, torch.empty(3), torch.ones(()), -100, "mean",
                                                 smoothing, z_loss, softcap, temperature))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability as an integer (90: H100)")
    parser.add_argument("--sms", type=int, default=132, help="SM count the plans are made for")
    parser.add_argument("--ops", default="softmax,topk,attention",
                        help="comma-separated: softmax, topk, attention, cross_entropy, decode")
    parser.add_argument("--shapes", default="",
                        help="softmax, cross_entropy: comma-separated ROWSxCOLS instead of the bench grid")
    parser.add_argument("--attention-shapes", default="",
                        help="attention: comma-separated HQxHKVxSxD instead of the bench grid (batch 1)")
    parser.add_argument("--decode-shapes", default="",
                        help="decode: comma-separated BxHQxHKVxSxD (one query a sequence)")
    parser.add_argument("--dtypes", default="",
                        help="comma-separated torch dtype names (float16, ...) instead of each op's default")
    parser.add_argument("--table", action="append", default=[], metavar="OP:NAME=VALUE",
                        help="another value of a plan table, e.g. attention:ATTENTION_CONFIGS={...}")
    parser.add_argument("--ce-options", default="", metavar="NAME=VALUE,...",
                        help="cross_entropy: label_smoothing, z_loss, softcap, temperature, weight=1, class_dim_1=1")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        for text in args.table:
            op, assignment = text.split(":", 1)
            name, value = assignment.split("=", 1)
            stack.enter_context(_device.override_plan(op, **{name: ast.literal_eval(value)}))
        report(args)


def report(args):
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    attention_shapes = [(1, *(int(v) for v in s.split("x"))) for s in args.attention_shapes.split(",") if s]
    decode_shapes = [tuple(int(v) for v in s.split("x")) for s in args.decode_shapes.split(",") if s]
    print(f"sm_{args.arch}, plans for {args.sms} SMs, triton {triton.__version__}")
    print(f"{'dtype':9s} {'case':26s} {'kernel':34s} {'warps':>5s} {'regs':>4s} {'stack':>5s} {'smem KB':>7s} "
          f"{'programs/SM':>11s}  loads in flight")
    cases = {"softmax": softmax_cases, "topk": topk_cases, "attention": attention_cases,
             "cross_entropy": cross_entropy_cases, "decode": decode_cases}
    for op in args.ops.split(","):
        dtypes = [getattr(torch, name) for name in args.dtypes.split(",")] if args.dtypes else \
            (torch.bfloat16,) if op in ("attention", "decode") else (torch.float32, torch.bfloat16)
        for dtype in dtypes:
            chosen = {"softmax": shapes, "attention": attention_shapes, "cross_entropy": shapes,
                      "decode": decode_shapes}
            extra = {"options": dict(item.split("=") for item in args.ce_options.split(",") if item)} \
                if op == "cross_entropy" else {}
            for case, run in (cases[op](dtype, chosen[op], **extra) if op in chosen else cases[op](dtype)):
                with recorded_launches(args.sms) as calls:
                    run()
                for fn, launch_args, meta in calls:
                    usage = resource_usage(fn, launch_args, meta, args.arch)
                    warps = usage["warps"]
                    shared = usage.get("SHARED", 0) + usage["dynamic_shared"]
                    print(f"{str(dtype)[6:]:9s} {case:26s} {fn.__name__:34s} {warps:5d} {usage['REG']:4d} "
                          f"{usage['STACK']:5d} {shared / 1024:7.1f} {programs_per_sm(usage['REG'], warps, shared):11d}  "
                          + " ".join(f"{issued}/{total}" for issued, total in usage["loops"]), flush=True)


if __name__ == "__main__":
    main()
