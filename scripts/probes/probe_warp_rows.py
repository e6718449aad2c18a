"""Warp-per-row layouts for short rows, timed beside torch's kernel and ours (GPU).

    python scripts/probes/probe_warp_rows.py [--shapes fp32:3000x273,...] [--kernels rows_first,chunks_first]

torch's log_softmax over rows of up to 1024 elements gives each row one warp and puts four warps
in a block; ours (row_on_chip) holds a [rows, width] tile, on which Triton's layout spreads a row
across the warps of a program where there are several (a reduction through shared memory), so the
plan gives short rows one-warp programs: as many warps as torch, four times the programs
(docs/notes/2026-11/ncu_short_rows-h200.txt). Two tiles meant to leave Triton's layout nowhere to
put warps but the rows, element (., ., l) of chunk c being column 32 c + l:

- chunks_first, a [chunks, rows, 32] tile: on the H200 with Triton 3.6 its warps went on the
  chunks (warpsPerCTA = [4, 1, 1], order [2, 0, 1]), splitting rows after all, 0.38-1.12x torch
  (docs/notes/2026-11/probe_warp_rows-h200.log);
- rows_first, a [rows, chunks, 32] tile (one warp a row, so only the configs with as many warps
  as rows): compiled for sm_90, rows off 16-byte boundaries (fp32 273, bf16 143 elements: one
  element a load) get warpsPerCTA = [4, 1, 1] on the rows, with no layout conversion and no shared
  memory: one row a warp. 16-byte aligned rows (fp32 256 and 1024, bf16 256) are read 16 bytes a
  load and their warps go on the chunks again ([1, 4, 1]). The library carried it as the strategy
  warp_rows (every layout, the three forward ops) until timed against the plan on the H200: 0.63-0.99x
  row_on_chip at 2, 4 and 8 rows a program over 18 shapes, softmax and log_softmax
  (docs/notes/2026-11/tune_softmax-warp_rows-h200.json); it was removed.

The script prints each kernel's layouts. Contiguous rows only; CUDA-graph replays over rotated
inputs, µs a call; each output is checked against torch's.
"""

import argparse
import itertools

import torch
import triton
import triton.language as tl

import onlinesoftmax
from onlinesoftmax.bench.harness import graph_time_ms, rotation_count

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHAPES = ("fp32:3000x273,fp32:6000x143,fp32:1207x143,fp32:50000x143,fp32:16384x180,fp32:3000x256,"
          "bf16:3000x143,bf16:16384x136,bf16:600x150,bf16:8192x101,bf16:43x147,fp16:1207x143")
CONFIGS = ((1, 1), (2, 2), (4, 4), (8, 8), (8, 4), (16, 8))  # (rows a program, warps; rows_first: warps = rows)


@triton.jit
def chunks_first_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, CHUNKS: tl.constexpr, ROWS: tl.constexpr,
                     LOG: tl.constexpr):
    c = tl.arange(0, CHUNKS)[:, None, None]
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[None, :, None]
    lane = tl.arange(0, 32)[None, None, :]
    col = c * 32 + lane
    mask = (r < n_rows) & (col < n_cols)
    offsets = r.to(tl.int64) * stride + col
    x = tl.load(x_ptr + offsets, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(tl.max(x, 2), 0)[None, :, None]
    e = tl.exp(x - m)
    d = tl.sum(tl.sum(e, 2), 0)[None, :, None]
    if LOG:
        y = (x - m) - tl.log(d)
    else:
        y = e * (1.0 / d)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rows_first_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, CHUNKS: tl.constexpr, ROWS: tl.constexpr,
                      LOG: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None, None]
    col = tl.arange(0, CHUNKS)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    mask = (r < n_rows) & (col < n_cols)
    offsets = r.to(tl.int64) * stride + col
    x = tl.load(x_ptr + offsets, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(tl.max(x, 2), 1)[:, None, None]
    e = tl.exp(x - m)
    d = tl.sum(tl.sum(e, 2), 1)[:, None, None]
    if LOG:
        y = (x - m) - tl.log(d)
    else:
        y = e * (1.0 / d)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


KERNELS = {"chunks_first": chunks_first_kernel, "rows_first": rows_first_kernel}


def warp_rows(kernel, x, log, rows_per_program, warps, compiled=None):
    y = torch.empty_like(x)
    chunks = triton.next_power_of_2(triton.cdiv(x.shape[1], 32))
    handle = KERNELS[kernel][(triton.cdiv(x.shape[0], rows_per_program),)](
        x, y, x.shape[0], x.shape[1], x.stride(0), CHUNKS=chunks, ROWS=rows_per_program, LOG=log, num_warps=warps)
    if compiled is not None:
        compiled.append(handle)
    return y


def print_layouts(kernel, x):
    """The blocked layouts Triton chose for four rows on four warps (a row a warp, or rows split?)."""
    compiled = []
    warp_rows(kernel, x, True, 4, 4, compiled)
    for line in compiled[0].asm["ttgir"].splitlines():
        if "ttg.blocked<" in line:
            print(f"  {kernel} layout:", line.strip(), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--kernels", default="rows_first,chunks_first")
    args = parser.parse_args()
    kernels = args.kernels.split(",")
    torch.manual_seed(0)
    for kernel in set(kernels) & set(KERNELS):
        print_layouts(kernel, torch.randn(64, 143, device="cuda"))
    for spec in args.shapes.split(","):
        name, shape = spec.split(":")
        rows, cols = (int(v) for v in shape.split("x"))
        dtype = DTYPES[name]
        sets = [(torch.randn(rows, cols, device="cuda", dtype=dtype),)
                for _ in range(rotation_count(2 * rows * cols * dtype.itemsize))]
        for log in (True, False):
            op = "log_softmax" if log else "softmax"
            ref_fn = torch.log_softmax if log else torch.softmax
            ours_fn = onlinesoftmax.log_softmax if log else onlinesoftmax.softmax
            times = {"torch": graph_time_ms(lambda t: ref_fn(t, -1), sets),
                     "ours": graph_time_ms(lambda t: ours_fn(t, -1, strategy="row_on_chip"), sets)}
            for kernel, (rpp, warps) in itertools.product(kernels, CONFIGS):
                if kernel == "rows_first" and warps != rpp:
                    continue  # one warp a row
                x = sets[0][0]
                err = (warp_rows(kernel, x, log, rpp, warps).float() - ref_fn(x.float(), -1)).abs().max().item()
                ms = graph_time_ms(lambda t: warp_rows(kernel, t, log, rpp, warps), sets)
                times[f"{kernel} {rpp}r/{warps}w (err {err:.0e})"] = ms
            base = times["torch"]
            line = " | ".join(f"{k} {v * 1e3:.2f} ({base / v:.2f}x)" for k, v in times.items())
            print(f"{name} {rows}x{cols} {op}: {line}", flush=True)


if __name__ == "__main__":
    main()
