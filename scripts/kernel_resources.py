"""Registers per thread, stack and spills of the softmax and top-k kernels as planned for the
bench grids on an H100 (sm_90), measured without a GPU.

    python scripts/kernel_resources.py [--arch 90] [--sms 132] [--ops softmax,topk]

Triton compiles for a target named by hand (GPUTarget) with the ptxas it bundles, and the bundled
cuobjdump reads the resource usage out of the cubin. Registers decide how many programs an SM
holds at once (65536 per SM, allocated per warp in steps of 8 per thread), which bounds the loads
a streaming kernel keeps in flight: of the numbers that decide a kernel's speed, the one a machine
without a GPU can measure. LOCAL above 0 is a spill to local memory. Integer arguments are
compiled unspecialized (a launch with a stride of 1 folds it), contiguous rows, softmax (not log):
counts can differ from a launched kernel's by a few registers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from onlinesoftmax import plan
from onlinesoftmax.bench import softmax_suite, topk_suite

softmax_module = importlib.import_module("onlinesoftmax.softmax")
topk_module = importlib.import_module("onlinesoftmax.topk")

REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MAX_PROGRAMS_PER_SM = 32
TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# Kernels each softmax strategy launches, forward and backward.
SOFTMAX_KERNELS = {
    ("forward", "row_on_chip"): ["row_on_chip_softmax_kernel"],
    ("forward", "looped"): ["looped_softmax_kernel"],
    ("forward", "split_row_on_chip"): ["split_row_on_chip_softmax_kernel"],
    ("forward", "split_row"): ["split_row_partials_kernel", "split_row_normalize_kernel"],
    ("backward", "row_on_chip"): ["row_on_chip_backward_kernel"],
    ("backward", "looped"): ["looped_backward_kernel"],
    ("backward", "split_row_on_chip"): ["split_row_on_chip_backward_kernel"],
    ("backward", "split_row"): ["split_row_backward_dot_kernel", "split_row_backward_apply_kernel"],
}


def resource_usage(fn, signature: dict, constexprs: dict, num_warps: int, arch: int = 90) -> dict:
    """ptxas's resource usage of ``fn`` compiled for sm_``arch``: REG, STACK, SHARED, LOCAL (ints)."""
    full_signature = dict(signature, **{name: "constexpr" for name in constexprs})
    source = ASTSource(fn=fn, signature=full_signature,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps))
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        report = subprocess.run([cuobjdump, "--dump-resource-usage", cubin.name],
                                capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", report)}


def signature_of(fn, dtype: torch.dtype, constexprs: dict) -> dict:
    """Argument types by name: the data tensors in ``dtype``, indices and keys int64, counters
    int32, other pointers (partials, lse) fp32; the temperature fp32, other scalars int32."""
    data = f"*{TRITON_TYPES[dtype]}"
    pointers = {"x_ptr": data, "y_ptr": data, "dy_ptr": data, "dx_ptr": data, "values_ptr": data,
                "indices_ptr": "*i64", "part_keys_ptr": "*i64", "sync_ptr": "*i32"}
    return {name: pointers.get(name, "*fp32") if name.endswith("_ptr") else
            "fp32" if name == "inv_temperature" else "i32"
            for name in fn.arg_names if name not in constexprs}


def constexprs_of(fn, values: dict) -> dict:
    return {p.name: values[p.name] for p in fn.params if p.is_constexpr}


def programs_per_sm(registers: int, num_warps: int) -> int:
    per_warp = -(-registers // 8) * 8 * 32
    return min(REGISTERS_PER_SM // (per_warp * num_warps), MAX_WARPS_PER_SM // num_warps, MAX_PROGRAMS_PER_SM)


def softmax_rows(dtype, sms, arch):
    for direction, op in (("forward", "softmax"), ("backward", "softmax_backward")):
        for rows, cols in softmax_suite.GRID:
            chosen = plan.choose(op, rows, cols, dtype, torch.device("cuda"), sms=sms)
            values = dict(BLOCK=chosen.block_cols, BLOCK_COLS=chosen.block_cols,
                          ROWS_PER_PROGRAM=chosen.rows_per_program,
                          CHUNKS_POW2=plan.next_power_of_2(chosen.num_chunks), CONTIGUOUS=True, LOG=False,
                          WRITE_Y=True, WRITE_LSE=False, SAFE=chosen.algorithm == "safe",
                          PASS=softmax_module.PARTIAL_ONLINE)
            for name in SOFTMAX_KERNELS[(direction, chosen.strategy)]:
                fn = getattr(softmax_module, name)
                constexprs = constexprs_of(fn, values)
                usage = resource_usage(fn, signature_of(fn, dtype, constexprs), constexprs, chosen.num_warps, arch)
                described = f"{chosen.strategy} {chosen.block_cols}/{chosen.num_warps}w"
                yield f"{direction} {rows}x{cols}", name, described, chosen.num_warps, usage


def topk_rows(dtype, sms, arch):
    for rows, cols, k in topk_suite.GRID:
        chosen = plan.topk_plan(rows, cols, k, dtype, torch.device("cuda"), sms=sms)
        fn = topk_module.topk_stream_kernel
        constexprs = constexprs_of(fn, dict(BLOCK=chosen.block, K_POW2=chosen.k_pow2,
                                            FEW_SURVIVORS=plan.TOPK_FEW_SURVIVORS, COMPACT=chosen.compact,
                                            LANE_BEST=chosen.lane_best, CONTIGUOUS=True,
                                            FINAL=chosen.strategy == "single", WRITE_LSE=True))
        usage = resource_usage(fn, signature_of(fn, dtype, constexprs), constexprs, chosen.num_warps, arch)
        selection = "lane best" if chosen.lane_best else ("compact" if chosen.compact else "one by one")
        described = f"{chosen.strategy} x{chosen.num_chunks} {chosen.block}/{chosen.num_warps}w {selection}"
        yield f"{rows}x{cols}:k{k}", "topk_stream_kernel", described, chosen.num_warps, usage


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability as an integer (90: H100)")
    parser.add_argument("--sms", type=int, default=132, help="SM count the plans are made for")
    parser.add_argument("--ops", default="softmax,topk", help="comma-separated: softmax, topk")
    args = parser.parse_args()
    print(f"sm_{args.arch}, plans for {args.sms} SMs, triton {triton.__version__}")
    print(f"{'dtype':9s} {'case':26s} {'kernel':34s} {'plan':34s} {'regs':>4s} {'stack':>5s} {'local':>5s} "
          f"{'programs/SM':>11s}")
    producers = {"softmax": softmax_rows, "topk": topk_rows}
    for op in args.ops.split(","):
        for dtype in (torch.float32, torch.bfloat16):
            for case, kernel, described, num_warps, usage in producers[op](dtype, args.sms, args.arch):
                print(f"{str(dtype)[6:]:9s} {case:26s} {kernel:34s} {described:34s} {usage['REG']:4d} "
                      f"{usage['STACK']:5d} {usage.get('LOCAL', 0):5d} {programs_per_sm(usage['REG'], num_warps):11d}",
                      flush=True)


if __name__ == "__main__":
    main()
